"""The ``tunelab`` command line.

Exit codes: 0 success; 1 the study finished but some runs failed; 2 bad input (any
:class:`~tunelab.errors.TunelabError`, printed as one line); 130 interrupted.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer
from rich.console import Console

from tunelab.errors import TunelabError

app = typer.Typer(
    name="tunelab",
    help="Run, tune and report performance experiments of HPC and AI workloads.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

def _mount_subcommands() -> None:
    """Workload programs with CLIs of their own (their heavy imports happen on use only)."""
    from tunelab.bench.cli import app as bench_app
    from tunelab.leopard.cli import app as leopard_app

    app.add_typer(bench_app, name="bench",
                  help="Benchmark programs tunelab owns (the all-to-all merge).")
    app.add_typer(leopard_app, name="leopard",
                  help="Leopard DNA U-Net: synthetic data, training, prediction.")


_mount_subcommands()

StudyArg = Annotated[Path, typer.Argument(help="Study file (YAML).", show_default=False)]
DirArg = Annotated[Path, typer.Argument(help="Study directory (holds tunelab.db).",
                                        show_default=False)]


def _default_dir(name: str) -> Path:
    return Path("runs") / name


def _raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@app.command()
def run(
    study_file: StudyArg,
    directory: Annotated[Path | None, typer.Option("--dir", help="Study directory "
                                                   "(default: runs/<study name>).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the commands only.")] = False,
    repeats: Annotated[int | None, typer.Option("--repeats", help="Override the study's "
                                                "repeats.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    wait_quiet: Annotated[bool, typer.Option("--wait-quiet", help="Before each run, wait "
                                             "until other processes leave the machine "
                                             "quiet (at most 10 minutes).")] = False,
) -> None:
    """Run a study (resumes where a previous run of it stopped)."""
    from tunelab.execute.runner import describe_commands, prepare_study, run_study
    from tunelab.spec import load_study

    spec = load_study(study_file)
    study = prepare_study(spec, repeats=repeats)
    study_dir = directory or _default_dir(spec.name)
    if dry_run:
        for line in describe_commands(study, study_dir):
            console.print(line, markup=False, soft_wrap=True)
        console.print(f"{_plan_text(study)} (dry run: nothing was run)")
        return
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    from tunelab.report.progress import StudyProgress

    with StudyProgress(console, enabled=not quiet) as progress:
        try:
            outcome = run_study(study, study_dir, on_start=progress.start,
                                on_event=progress.update, wait_quiet=wait_quiet)
        except KeyboardInterrupt:
            progress.stop()
            err_console.print(f"tunelab: interrupted; finished runs are stored in {study_dir}. "
                              "Run the same command again to resume.", soft_wrap=True)
            raise typer.Exit(130) from None
    counts = ", ".join(f"{n} {s}" for s, n in sorted(outcome.counts.items()))
    console.print(f"{study.spec.name}: {outcome.ran} runs now, {outcome.previously_done} "
                  f"done before, {outcome.planned} planned ({counts}). Results: {study_dir}")
    _print_ranking(study_dir)
    if not outcome.all_ok:
        raise typer.Exit(1)


def _print_ranking(study_dir: Path) -> None:
    from tunelab.report.summary import load_results
    from tunelab.report.table import summary_table

    results = load_results(study_dir)
    if results.comparisons or results.summaries:
        console.print(summary_table(results, width=console.width))


@app.command()
def status(directory: DirArg) -> None:
    """Show how far a study is and its latest failures."""
    from tunelab.space import Point
    from tunelab.store import open_store

    with open_store(directory) as store:
        planned = int(store.get_meta("planned_runs") or 0)
        counts = store.status_counts()
        done = sum(counts.values())
        name = store.get_meta("study_name")
        detail = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no runs yet"
        console.print(f"study {name!r} in {directory}: {done}/{planned} runs done ({detail})")
        for key, rep, st, reason in store.failures(limit=10):
            console.print(f"  {st:8s} {Point.from_key(key).label()} repeat {rep}: {reason}",
                          markup=False)


@app.command()
def space(
    study_file: StudyArg,
    show: Annotated[int, typer.Option("--show", help="How many points to print.")] = 10,
) -> None:
    """Count the valid points of a study's space and what each constraint excluded."""
    from tunelab.execute.runner import prepare_study

    study = prepare_study(_load(study_file))
    summary, points = study.space.summarize()
    console.print(f"{summary.valid} valid points of {summary.total} combinations "
                  f"({', '.join(study.space.names) or 'no parameters'})")
    why = {c.label: c.why for c in study.space.constraints if c.why}
    origin = {c.label: c.origin for c in study.space.constraints}
    for label, n in sorted(summary.excluded.items(), key=lambda kv: -kv[1]):
        source = f" [{origin[label]}]" if origin.get(label, "study") != "study" else ""
        reason = f": {why[label]}" if label in why else ""
        console.print(f"  excluded {n:>6} by {label}{source}{reason}", markup=False,
                      soft_wrap=True)
    for point in points[:show]:
        console.print(f"  {point.label()}", markup=False)
    if len(points) > show:
        console.print(f"  … and {len(points) - show} more")
    console.print(f"will run {_plan_text(study)}")


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


@app.command()
def compare(directory: DirArg) -> None:
    """Compare every point with the baseline: speedup, 95% CI, p-value, verdict."""
    from tunelab.report.summary import load_results
    from tunelab.report.table import summary_table

    console.print(summary_table(load_results(directory), width=console.width))


@app.command()
def best(directory: DirArg) -> None:
    """The best point, and how sure we are that it beats the runner-up."""
    from tunelab.report.summary import load_results
    from tunelab.report.table import best_panel

    results = load_results(directory)
    console.print(best_panel(results.best_result(), results.objective))


@app.command()
def report(
    directory: DirArg,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="HTML file "
                                                "(default: DIR/report.html).")] = None,
) -> None:
    """Write the plots (PNG) and a self-contained HTML report; print the table."""
    from tunelab.report.summary import load_results, write_report
    from tunelab.report.table import summary_table

    results = load_results(directory)
    console.print(summary_table(results, width=console.width))
    path = write_report(results, output or directory / "report.html")
    console.print(f"report: {path}")


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
        console.print(text, markup=False, highlight=False, soft_wrap=True, end="")
    else:
        output.write_text(text)
        console.print(f"job script written to {output}")


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
    output.write_text(combination.study_yaml)
    console.print(f"better than the baseline: {', '.join(combination.winners)}", markup=False)
    for name, verdict in combination.left_out:
        console.print(f"left out: {name} ({verdict})", markup=False)
    console.print(f"wrote {output}; run it with: tunelab run {output}", markup=False)


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
    console.print(f"wrote {output}; run any strategy on it offline: tunelab run {output}",
                  markup=False)


@app.command()
def export(
    directory: DirArg,
    fmt: Annotated[str, typer.Option("--format", "-f", help="csv, parquet or json.")] = "csv",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Output file "
                                                "(default: DIR/runs.<format>).")] = None,
) -> None:
    """Export every run with its parameters and figures of merit."""
    from tunelab.store import open_store

    formats = ("csv", "parquet", "json")
    if fmt not in formats:
        raise TunelabError(f"unknown export format {fmt!r}; valid: {', '.join(formats)}")
    with open_store(directory) as store:
        frame = store.runs_frame()
    path = output or directory / f"runs.{fmt}"
    if fmt == "csv":
        frame.to_csv(path, index=False)
    elif fmt == "parquet":
        frame.to_parquet(path, index=False)
    else:
        frame.to_json(path, orient="records", indent=1)
    console.print(f"{len(frame)} runs written to {path}")


@app.command()
def workloads() -> None:
    """List the installed workloads."""
    from tunelab.workloads import available_workloads

    for name, entry in available_workloads().items():
        if isinstance(entry, str):
            console.print(f"{name:10s} [red]unavailable[/red]: {entry}")
        else:
            console.print(f"{name:10s} {entry.description}", markup=False)


@app.command()
def init(
    workload: Annotated[str, typer.Argument(help="Workload name.", show_default=False)],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Study file to write "
                                                "(default: <workload>-study.yaml).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented example study for a workload."""
    from tunelab.workloads import get_workload
    from tunelab.workloads.examples import example_study

    cls = get_workload(workload)
    path = output or Path(f"{workload}-study.yaml")
    if path.exists() and not force:
        raise TunelabError(f"{path} exists; pass --force to overwrite it")
    path.write_text(example_study(cls))
    console.print(f"wrote {path}; try: tunelab space {path}")


def main() -> None:
    """Console-script entry point: one-line errors, exit status 2 on bad input."""
    try:
        rc = app(standalone_mode=False)  # returns a typer.Exit's code instead of raising it
    except TunelabError as exc:
        err_console.print(f"tunelab: error: {exc}", markup=False, soft_wrap=True)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err_console.print("tunelab: interrupted")
        sys.exit(130)
    except typer.exceptions.TyperException as exc:  # usage errors (unknown option, …)
        show = getattr(exc, "show", None)
        if show is None:
            raise
        show()
        sys.exit(int(getattr(exc, "exit_code", 2)))
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
