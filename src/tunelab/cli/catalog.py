"""``tunelab workloads`` and ``tunelab init``: the installed workloads and a commented study to
start from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tunelab.cli.common import (
    FormatOpt,
    OutputFormat,
    emit,
    write_text,
)
from tunelab.errors import TunelabError
from tunelab.report.output import message

__all__ = ["init", "workloads"]


def workloads(fmt: FormatOpt = OutputFormat.text) -> None:
    """List the installed workloads."""
    from tunelab.report.listings import workloads_view
    from tunelab.workload import available_workloads

    emit(workloads_view(available_workloads()), fmt)


def init(
    workload: Annotated[str, typer.Argument(help="Workload name (see tunelab workloads).",
                                            show_default=False)],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Study file to write "
                                                "(default: <workload>-study.yaml).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing files.")] = False,
) -> None:
    """Write a commented example study for a workload (and the input files it names)."""
    from tunelab.workload import get_workload
    from tunelab.workloads.examples import example_files

    cls = get_workload(workload)
    path = output or Path(f"{workload}-study.yaml")
    files = example_files(cls, path)
    existing = [str(f) for f in files if f.exists()]
    if existing and not force:
        raise TunelabError(f"{', '.join(existing)} exist{'s' if len(existing) == 1 else ''}; "
                           "pass --force to overwrite")
    for target, text in files.items():
        write_text(target, text)
    others = [str(f) for f in files if f != path]
    extra = f" (and {', '.join(others)})" if others else ""
    message(f"wrote {path}{extra}; try: tunelab space {path}")
