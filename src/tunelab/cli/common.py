"""What every ``tunelab`` command shares: the typer app, the argument types, ``--format``
and its rendering, exit statuses (1 when a study has runs that did not succeed) and the
interrupt that carries its explanation to :func:`tunelab.cli.main`."""

from __future__ import annotations

import enum
import signal
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tunelab.errors import STOP_SIGNALS, TunelabError
from tunelab.report.output import message

if TYPE_CHECKING:
    from tunelab.report.output import View
    from tunelab.report.results import StudyResults

__all__ = ["FAILED_STATUSES", "BaselineStudyOpt", "DirArg", "ExcludeDisturbedOpt", "FormatOpt",
           "Interrupted", "OutputFormat", "StudyArg", "app", "compare_studies", "default_dir",
           "emit", "exit_if_failed", "failed_runs", "ignore_further_signals", "load", "plan_text",
           "raise_keyboard_interrupt", "status_counts", "write_text"]

CONTEXT = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    name="tunelab",
    help="Run, tune and report performance experiments of HPC and AI workloads.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings=CONTEXT,
)

FAILED_STATUSES = frozenset({"failed", "timeout", "invalid", "lost"})
"""Run statuses that make a command exit 1."""


def _version_callback(value: bool) -> None:
    if value:
        try:
            number = version("tunelab")
        except PackageNotFoundError:
            number = "unknown"
        sys.stdout.write(f"tunelab {number}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    show_version: Annotated[bool, typer.Option("--version", help="Print the version and exit.",
                                               callback=_version_callback,
                                               is_eager=True)] = False,
) -> None:
    """Run, tune and report performance experiments of HPC and AI workloads."""


class OutputFormat(enum.StrEnum):
    """``--format`` choices."""

    text = "text"
    json = "json"
    csv = "csv"
    markdown = "markdown"


StudyArg = Annotated[Path, typer.Argument(help="Study file (YAML).", show_default=False)]
DirArg = Annotated[Path, typer.Argument(help="Study directory (holds tunelab.db).",
                                        show_default=False)]
FormatOpt = Annotated[OutputFormat, typer.Option(
    "--format", help="text (a table on a terminal, plain lines in a pipe), json, csv or "
                     "markdown.")]


def emit(view: View, fmt: OutputFormat) -> None:
    from tunelab.report.output import emit

    emit(view, fmt.value)


def default_dir(name: str) -> Path:
    return Path("runs") / name


def raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


class Interrupted(BaseException):
    """An interrupt with its explanation; :func:`main` prints it (typer would swallow a
    KeyboardInterrupt into a silent exit 130)."""


def ignore_further_signals() -> None:
    """Once interrupted, finish saying so: a second Ctrl-C, SIGTERM or SIGHUP changes
    nothing."""
    for sig in (signal.SIGINT, *STOP_SIGNALS):
        signal.signal(sig, signal.SIG_IGN)


def failed_runs(counts: dict[str, int]) -> int:
    return sum(n for status, n in counts.items() if status in FAILED_STATUSES)


def exit_if_failed(counts: dict[str, int], what: str) -> None:
    """Say how many runs failed and exit 1 when any did."""
    failed = failed_runs(counts)
    if failed:
        message(f"tunelab: {what} has {failed} run{'s' if failed != 1 else ''} that did not "
                "succeed (exit status 1); `tunelab status DIR` lists them")
        raise typer.Exit(1)


def status_counts(results: StudyResults) -> dict[str, int]:
    runs = results.runs
    if not len(runs) or "status" not in runs.columns:
        return {}
    return {str(k): int(v) for k, v in runs["status"].value_counts().items()}


BaselineStudyOpt = Annotated[Path | None, typer.Option(
    "--baseline-study", help="Judge this study (B) against that study directory (A): two "
                             "machines, two versions, before and after a change.")]
ExcludeDisturbedOpt = Annotated[bool, typer.Option(
    "--exclude-disturbed", help="Leave out the runs the noise watch flagged disturbed "
    "(others took their cores); they are counted and named.")]


def plan_text(study: Any) -> str:
    if study.decides_repeats:
        return (f"runs chosen by {study.spec.strategy} (repeats where they decide), "
                f"up to {study.planned_runs} runs")
    if study.adaptive:
        return (f"up to {study.planned_runs // max(study.spec.repeats, 1)} points chosen by "
                f"{study.spec.strategy} x "
                f"{study.spec.repeats} repeats = up to {study.planned_runs} runs")
    if study.spec.auto_repeats is not None:
        low, high = study.spec.auto_repeats
        return (f"{len(study.points)} points x {low} to {high} repeats (auto: more rounds "
                f"only for comparisons not yet decided) = up to {study.planned_runs} runs")
    return (f"{len(study.points)} points x {study.spec.repeats} repeats = "
            f"{study.planned_runs} runs")


def load(study_file: Path) -> Any:
    from tunelab.spec import load_study

    return load_study(study_file)


def compare_studies(a: StudyResults, b: StudyResults) -> Any:
    """Study B against study A (:func:`tunelab.crossstudy.compare_studies`), leaving
    disturbed runs out as the two were loaded, with each study's load in its notes."""
    from dataclasses import replace

    from tunelab.crossstudy import check_comparable, compare_studies
    from tunelab.report.results import busy_line

    check_comparable(a.name, a.objective, b.name, b.objective)
    sc = compare_studies(a.runs, b.runs, b.objective, name_a=a.name, name_b=b.name,
                         noise_threshold=b.noise_threshold, confidence=b.confidence,
                         exclude_disturbed=a.exclude_disturbed or b.exclude_disturbed)
    notes = tuple(f"Study {r.name!r} ({side}): {busy_line(r.disturbance)}"
                  for side, r in (("A", a), ("B", b))
                  if r.disturbance is not None and r.disturbance.disturbed)
    return replace(sc, notes=notes)


def write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise TunelabError(f"cannot write {path}: {exc.strerror or exc}") from None
