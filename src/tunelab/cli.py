"""The ``tunelab`` command line.

Exit codes: 0 success; 1 the study has runs that failed (``run`` and every command that reads a
study: ``status``, ``compare``, ``best``, ``report``); 2 bad input (any
:class:`~tunelab.errors.TunelabError` or usage error, printed as one line); 130 interrupted.

Results go to standard output, rendered by :mod:`tunelab.report.output` (``--format
text|json|csv|markdown``; plain lines when standard output is not a terminal); status
messages and progress go to standard error.
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tunelab.errors import TunelabError, interrupted
from tunelab.report.output import message

if TYPE_CHECKING:
    from tunelab.report.output import View
    from tunelab.report.summary import StudyResults

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


def _mount_subcommands() -> None:
    """Workload programs with CLIs of their own (their heavy imports happen on use only)."""
    from tunelab.bench.cli import app as bench_app
    from tunelab.leopard.cli import app as leopard_app

    app.add_typer(bench_app, name="bench",
                  help="Benchmark programs tunelab owns (the all-to-all merge, DDP training).")
    app.add_typer(leopard_app, name="leopard",
                  help="Leopard DNA U-Net: synthetic data, training, prediction.")


_mount_subcommands()


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


def _emit(view: View, fmt: OutputFormat) -> None:
    from tunelab.report.output import emit

    emit(view, fmt.value)


def _default_dir(name: str) -> Path:
    return Path("runs") / name


def _raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


class _Interrupted(BaseException):
    """An interrupt with its explanation; :func:`main` prints it (typer would swallow a
    KeyboardInterrupt into a silent exit 130)."""


def _ignore_further_signals() -> None:
    """Once interrupted, finish saying so: a second Ctrl-C or SIGTERM changes nothing."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _failed_runs(counts: dict[str, int]) -> int:
    return sum(n for status, n in counts.items() if status in FAILED_STATUSES)


def _exit_if_failed(counts: dict[str, int], what: str) -> None:
    """Say how many runs failed and exit 1 when any did."""
    failed = _failed_runs(counts)
    if failed:
        message(f"tunelab: {what} has {failed} run{'s' if failed != 1 else ''} that did not "
                "succeed (exit status 1); `tunelab status DIR` lists them")
        raise typer.Exit(1)


def _status_counts(results: StudyResults) -> dict[str, int]:
    runs = results.runs
    if not len(runs) or "status" not in runs.columns:
        return {}
    return {str(k): int(v) for k, v in runs["status"].value_counts().items()}


@app.command()
def run(
    study_file: StudyArg,
    directory: Annotated[Path | None, typer.Option("--dir", help="Study directory "
                                                   "(default: runs/<study name>).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the commands only: runs "
                                          "nothing, writes nothing.")] = False,
    repeats: Annotated[int | None, typer.Option("--repeats", help="Override the study's "
                                                "repeats.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress display.")] = False,
    detach: Annotated[bool, typer.Option("--detach", help="Batch launchers: submit the jobs "
                                         "and exit; 'tunelab status DIR' collects them.")]
    = False,
    wait_quiet: Annotated[bool, typer.Option("--wait-quiet", help="Before each run, wait "
                                             "until other processes leave the machine "
                                             "quiet (at most 10 minutes).")] = False,
    fmt: FormatOpt = OutputFormat.text,
) -> None:
    """Run a study (resumes where a previous run of it stopped; re-attaches to its jobs).

    Progress goes to standard error: a bar on a terminal, one line per finished run
    otherwise. The ranked results go to standard output.
    """
    from tunelab.execute.runner import describe_commands, prepare_study, run_study
    from tunelab.report.progress import study_progress
    from tunelab.spec import load_study

    spec = load_study(study_file)
    study = prepare_study(spec, repeats=repeats, dry_run=dry_run)
    study_dir = directory or _default_dir(spec.name)
    if dry_run:
        for line in describe_commands(study, study_dir):
            sys.stdout.write(line + "\n")
        for fact in study.workload.facts():
            message(f"{study.workload.name}: {fact}")
        message(f"{_plan_text(study)} (dry run: nothing was run)")
        return
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    with study_progress(quiet=quiet) as progress:
        try:
            outcome = run_study(study, study_dir, on_start=progress.start,
                                on_event=progress.update, detach=detach,
                                wait_quiet=wait_quiet)
        except KeyboardInterrupt:
            _ignore_further_signals()
            progress.stop()
            cancelled = " its batch jobs were cancelled;" if study.launcher.batch else ""
            raise _Interrupted(f"tunelab: interrupted;{cancelled} finished runs are stored in "
                               f"{study_dir}. Run the same command again to resume.") from None
    if outcome.queued_jobs:
        message(f"{study.spec.name}: {outcome.queued_jobs} job(s) in the queue, "
                f"{outcome.ran} runs collected now. 'tunelab status {study_dir}' collects "
                "finished runs; 'tunelab run' again submits the rest and waits.")
        return
    counts = ", ".join(f"{n} {s}" for s, n in sorted(outcome.counts.items()))
    if outcome.stopped is not None:
        message(f"{study.spec.name}: stopped early: {outcome.stopped}")
    message(f"{study.spec.name}: {outcome.ran} runs now, {outcome.previously_done} done "
            f"before, {outcome.planned} planned ({counts}). Results: {study_dir}")
    _print_ranking(study_dir, fmt)
    _exit_if_failed(outcome.counts, f"study {study.spec.name!r}")


def _print_ranking(study_dir: Path, fmt: OutputFormat) -> None:
    from tunelab.report.summary import load_results
    from tunelab.report.views import compare_view
    from tunelab.stats import StatsError

    try:
        results = load_results(study_dir)
    except StatsError as exc:  # e.g. no run produced the objective: the failures say why
        message(f"tunelab: no ranking: {exc}")
        return
    if results.comparisons or results.summaries:
        _emit(compare_view(results), fmt)


@app.command()
def status(directory: DirArg, fmt: FormatOpt = OutputFormat.text) -> None:
    """Show how far a study is and its latest failures (exit 1 when runs failed); collect
    what its batch jobs finished."""
    from tunelab.report.views import FailureLine, StatusData, status_view
    from tunelab.space import Point
    from tunelab.store import open_store

    jobs_line = _collect_jobs(directory)
    with open_store(directory) as store:
        data = StatusData(
            name=store.get_meta("study_name") or directory.name,
            directory=str(directory),
            planned=int(store.get_meta("planned_runs") or 0),
            counts=store.status_counts(),
            failures=tuple(FailureLine(dict(Point.from_key(key)), rep, st, reason)
                           for key, rep, st, reason in store.failures(limit=10)),
            jobs=jobs_line or "",
        )
    _emit(status_view(data), fmt)
    if _failed_runs(data.counts):
        raise typer.Exit(1)


def _collect_jobs(directory: Path) -> str | None:
    """Collect the finished runs of a study's open batch jobs (when no ``tunelab run``
    holds the study); a line on its jobs, or None when it has none."""
    import json

    from tunelab.errors import StoreError
    from tunelab.execute.runner import collect_study, prepare_study
    from tunelab.spec import StudySpec
    from tunelab.store import open_store

    with open_store(directory) as store:
        open_jobs = store.open_jobs()
        raw = json.loads(store.get_meta("spec") or "{}")
        study_file = store.get_meta("study_file") or ""
    if not open_jobs:
        return None
    spec = StudySpec.from_mapping(raw, source=study_file or str(directory),
                                  path=Path(study_file) if study_file else None)
    try:
        outcome, phases = collect_study(prepare_study(spec), directory)
    except StoreError:  # a tunelab run controls the study: it collects
        return f"jobs: {len(open_jobs)} open (a running 'tunelab run' collects them)"
    detail = ", ".join(f"{n} {p}" for p, n in sorted(phases.items())) or "none left"
    return f"jobs: {outcome.queued_jobs} active ({detail}); {outcome.ran} runs collected now"


@app.command()
def space(
    study_file: StudyArg,
    show: Annotated[int, typer.Option("--show", help="How many points to list.")] = 10,
    fmt: FormatOpt = OutputFormat.text,
) -> None:
    """Count the valid points of a study's space and what each constraint excluded."""
    from tunelab.errors import SpaceError
    from tunelab.execute.runner import prepare_study
    from tunelab.report.views import SpaceView, space_view
    from tunelab.space import SpaceSummary

    if show < 0:
        raise TunelabError(f"--show must be >= 0, got {show}")
    study = prepare_study(_load(study_file), dry_run=True)
    summary: SpaceSummary | None = None
    try:
        summary, points = study.space.summarize()
    except SpaceError:  # too large to enumerate: a sampling search (grid was refused above)
        points = study.points
    why = {c.label: c.why or "" for c in study.space.constraints}
    origin = {c.label: c.origin for c in study.space.constraints}
    exclusions = tuple(
        (label, n, origin.get(label, "study"), why.get(label, ""))
        for label, n in sorted((summary.excluded if summary else {}).items(),
                               key=lambda kv: -kv[1]))
    data = SpaceView(
        study=study.spec.name, names=tuple(study.space.names), total=study.space.size,
        valid=summary.valid if summary else None, exclusions=exclusions,
        points=tuple(dict(p) for p in points[:show]), plan=_plan_text(study),
        plan_doc={"points": None if study.adaptive else len(study.points),
                  "repeats": study.spec.repeats, "runs": study.planned_runs,
                  "strategy": study.spec.strategy, "adaptive": study.adaptive},
        facts=tuple(f"{study.workload.name}: {fact}" for fact in study.workload.facts()),
    )
    _emit(space_view(data), fmt)


def _plan_text(study: Any) -> str:
    if study.decides_repeats:
        return (f"runs chosen by {study.spec.strategy} (repeats where they decide), "
                f"up to {study.planned_runs} runs")
    if study.adaptive:
        return (f"up to {study.spec.samples} points chosen by {study.spec.strategy} x "
                f"{study.spec.repeats} repeats = up to {study.planned_runs} runs")
    return (f"{len(study.points)} points x {study.spec.repeats} repeats = "
            f"{study.planned_runs} runs")


def _load(study_file: Path) -> Any:
    from tunelab.spec import load_study

    return load_study(study_file)


BaselineStudyOpt = Annotated[Path | None, typer.Option(
    "--baseline-study", help="Judge this study (B) against that study directory (A): two "
                             "machines, two versions, before and after a change.")]


@app.command()
def compare(
    directories: Annotated[list[Path], typer.Argument(
        help="A study directory (every point against its baseline), or two: DIR_A DIR_B "
             "(B judged against A on the points both measured).", show_default=False)],
    baseline_study: BaselineStudyOpt = None,
    fmt: FormatOpt = OutputFormat.text,
) -> None:
    """Compare points: speedup, confidence interval, p-value and verdict.

    With one directory, every point against the study's baseline; with two (or
    --baseline-study), the second study against the first, point by point.
    """
    from tunelab.report.summary import load_results
    from tunelab.report.views import compare_view, cross_compare_view, with_storage

    if len(directories) > 2 or (baseline_study is not None and len(directories) != 1):
        raise TunelabError("compare takes one study directory, or two (DIR_A DIR_B), or one "
                           "with --baseline-study DIR_A")
    if baseline_study is not None:
        directories = [baseline_study, *directories]
    if len(directories) == 1:
        results = load_results(directories[0])
        _emit(with_storage(compare_view(results), results.runs), fmt)
        _exit_if_failed(_status_counts(results), f"study {results.name!r}")
        return
    a, b = (load_results(d) for d in directories)
    _emit(cross_compare_view(_compare_studies(a, b), directory_a=str(directories[0]),
                             directory_b=str(directories[1])), fmt)
    counts = _status_counts(a)
    for status_name, n in _status_counts(b).items():
        counts[status_name] = counts.get(status_name, 0) + n
    _exit_if_failed(counts, f"studies {a.name!r} and {b.name!r} together")


def _compare_studies(a: StudyResults, b: StudyResults) -> Any:
    from tunelab.crossstudy import check_comparable, compare_studies

    check_comparable(a.name, a.objective, b.name, b.objective)
    return compare_studies(a.runs, b.runs, b.objective, name_a=a.name, name_b=b.name,
                           noise_threshold=b.noise_threshold, confidence=b.confidence)


@app.command()
def best(directory: DirArg, fmt: FormatOpt = OutputFormat.text) -> None:
    """The best point, and how sure we are that it beats the runner-up."""
    from tunelab.report.summary import load_results
    from tunelab.report.views import best_view
    from tunelab.stats import StatsError

    results = load_results(directory)
    try:
        winner, problem = results.best_result(), ""
    except StatsError as exc:
        winner, problem = None, str(exc)
    _emit(best_view(results, winner, problem), fmt)
    _exit_if_failed(_status_counts(results), f"study {results.name!r}")


@app.command()
def report(
    directory: DirArg,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="HTML file "
                                                "(default: DIR/report.html).")] = None,
    baseline_study: BaselineStudyOpt = None,
) -> None:
    """Write the plots (PNG) and a self-contained HTML report; print the report's path."""
    from tunelab.report.summary import load_results, write_report

    results = load_results(directory)
    cross = None
    if baseline_study is not None:
        cross = _compare_studies(load_results(baseline_study), results)
    try:
        path = write_report(results, output or directory / "report.html", cross=cross)
    except OSError as exc:
        raise TunelabError(f"cannot write {exc.filename or output or directory}: "
                           f"{exc.strerror or exc}; write the report elsewhere with --output "
                           "FILE") from None
    sys.stdout.write(f"{path}\n")
    _exit_if_failed(_status_counts(results), f"study {results.name!r}")


@app.command()
def script(
    directory: DirArg,
    scheduler: Annotated[str, typer.Option("--scheduler", "-s", help="pbs or slurm.")],
    walltime: Annotated[str | None, typer.Option(help="e.g. 10m, 2h (default: 3x the "
                                                 "measured median, at least 10 min).")] = None,
    mem: Annotated[str | None, typer.Option(help="Memory request, e.g. 190GB.")] = None,
    project: Annotated[str | None, typer.Option(help="Project/account to charge.")] = None,
    queue: Annotated[str | None, typer.Option(help="Queue or partition.")] = None,
    job_name: Annotated[str | None, typer.Option(help="Job name.")] = None,
    module: Annotated[list[str] | None, typer.Option(help="`module load` this (repeatable).")]
    = None,
    directive: Annotated[list[str] | None, typer.Option(help="Extra scheduler directive "
                                                        "(repeatable).")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the script "
                                                "here instead of printing it.")] = None,
) -> None:
    """Render a batch job script (PBS or Slurm) for the study's best configuration."""
    from tunelab.report.batch import best_job_script
    from tunelab.spec import parse_duration

    try:
        walltime_s = parse_duration(walltime) if walltime is not None else None
    except ValueError as exc:
        raise TunelabError(f"--walltime {exc}") from None
    text = best_job_script(directory, scheduler=scheduler, walltime_s=walltime_s, mem=mem,
                           project=project, queue=queue, job_name=job_name,
                           modules=module, directives=directive)
    if output is None:
        sys.stdout.write(text)
    else:
        _write_text(output, text)
        message(f"job script written to {output}")


def _write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise TunelabError(f"cannot write {path}: {exc.strerror or exc}") from None


@app.command()
def combine(
    directory: DirArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="Study file to write.")],
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write the follow-up study: env sets that were better than the baseline, combined."""
    from tunelab.report.combine import combine_better_options
    from tunelab.report.summary import load_results

    if output.exists() and not force:
        raise TunelabError(f"{output} exists; pass --force to overwrite it")
    combination = combine_better_options(load_results(directory))
    _write_text(output, combination.study_yaml)
    message(f"better than the baseline: {', '.join(combination.winners)}")
    for name, verdict in combination.left_out:
        message(f"left out: {name} ({verdict})")
    message(f"wrote {output}; run it with: tunelab run {output}")


@app.command()
def replay(
    directory: DirArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="Replay study file to write.")],
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a replay study: the finished study as a workload answering with its recorded runs."""
    from tunelab.replay import write_replay_study

    if output.exists() and not force:
        raise TunelabError(f"{output} exists; pass --force to overwrite it")
    write_replay_study(directory, output)
    message(f"wrote {output}; run any strategy on it offline: tunelab run {output}")


@app.command()
def export(
    directory: DirArg,
    fmt: Annotated[str, typer.Option("--format", "-f", help="csv, parquet or json.")] = "csv",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Output file "
                                                "(default: DIR/runs.<format>; - for standard "
                                                "output).")] = None,
) -> None:
    """Export every run with its parameters and figures of merit."""
    from tunelab.report.export import export_runs

    formats = ("csv", "parquet", "json")
    if fmt not in formats:
        raise TunelabError(f"unknown export format {fmt!r}; valid: {', '.join(formats)}")
    target = output or directory / f"runs.{fmt}"
    n = export_runs(directory, fmt, None if str(target) == "-" else target)
    message(f"{n} runs written to {'standard output' if str(target) == '-' else target}")


@app.command()
def workloads(fmt: FormatOpt = OutputFormat.text) -> None:
    """List the installed workloads."""
    from tunelab.report.views import workloads_view
    from tunelab.workload import available_workloads

    _emit(workloads_view(available_workloads()), fmt)


@app.command()
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
        _write_text(target, text)
    others = [str(f) for f in files if f != path]
    extra = f" (and {', '.join(others)})" if others else ""
    message(f"wrote {path}{extra}; try: tunelab space {path}")


def main() -> None:
    """Console-script entry point: one-line errors, exit status 2 on bad input."""
    try:
        rc = app(standalone_mode=False)  # returns a typer.Exit's code instead of raising it
        if rc == 130:  # typer turned a KeyboardInterrupt into a silent exit 130
            _exit_interrupted("tunelab: interrupted")
    except _Interrupted as exc:
        _exit_interrupted(str(exc))
    except TunelabError as exc:
        message(f"tunelab: error: {_one_line(str(exc))}")
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        _exit_interrupted("tunelab: interrupted")
    except typer.exceptions.TyperException as exc:  # usage errors (unknown option, …)
        show = getattr(exc, "show", None)
        if show is None:
            raise
        show()
        sys.exit(int(getattr(exc, "exit_code", 2)))
    except RuntimeError as exc:
        if not interrupted(exc):
            raise
        _exit_interrupted("tunelab: interrupted")
    except BrokenPipeError:  # `tunelab compare DIR | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    sys.exit(rc if isinstance(rc, int) else 0)


def _exit_interrupted(text: str) -> None:
    """Say why, and exit 130 at once: an interrupt that passed through code run by
    ``PyRun_String`` makes Python end a normal exit by killing itself with SIGINT."""
    _ignore_further_signals()
    message(text)
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    os._exit(130)


def _one_line(text: str) -> str:
    return " ".join(text.split())


if __name__ == "__main__":
    main()
