"""``tunelab bench …``: the benchmark programs tunelab owns, each with its own parser
(:mod:`tunelab.bench.merge.cli`, :mod:`tunelab.bench.ddp.cli`); ``python -m
tunelab.bench.merge`` and ``python -m tunelab.bench.ddp`` use the same parsers.

Mount with ``main_app.add_typer(tunelab.bench.cli.app, name="bench")``.
"""

from __future__ import annotations

import typer

from tunelab.bench.ddp.cli import app as ddp_app
from tunelab.bench.merge.cli import merge
from tunelab.console import PLAIN_HELP

__all__ = ["app"]

app = typer.Typer(help="Benchmark programs tunelab owns (run by hand or as study workloads).",
                  no_args_is_help=True, add_completion=False, **PLAIN_HELP)
app.command("merge")(merge)
app.add_typer(ddp_app, name="ddp")


@app.callback()
def _bench() -> None:
    """Benchmark programs tunelab owns."""
