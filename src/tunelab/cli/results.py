"""``tunelab compare``, ``best``, ``forecast``, ``report``, ``script``, ``combine``, ``replay``
and ``export``: what a study found, in every form."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from tunelab.cli.common import (
    BaselineStudyOpt,
    DirArg,
    ExcludeDisturbedOpt,
    FormatOpt,
    OutputFormat,
    compare_studies,
    emit,
    exit_if_failed,
    status_counts,
    write_text,
)
from tunelab.errors import TunelabError
from tunelab.report.output import message

__all__ = ["best", "combine", "compare", "export", "forecast", "replay", "report", "script"]


def compare(
    directories: Annotated[list[Path], typer.Argument(
        help="A study directory (every point against its baseline), or two: DIR_A DIR_B "
             "(B judged against A on the points both measured).", show_default=False)],
    baseline_study: BaselineStudyOpt = None,
    exclude_disturbed: ExcludeDisturbedOpt = False,
    fmt: FormatOpt = OutputFormat.text,
) -> None:
    """Compare points: speedup, confidence interval, p-value and verdict.

    With one directory, every point against the study's baseline; with two (or
    --baseline-study), the second study against the first, point by point.
    """
    from tunelab.report.appendices import with_cores, with_layouts, with_storage
    from tunelab.report.headroom import with_headroom
    from tunelab.report.load import load_results
    from tunelab.report.rates import with_rates
    from tunelab.report.views import compare_view, cross_compare_view

    if len(directories) > 2 or (baseline_study is not None and len(directories) != 1):
        raise TunelabError("compare takes one study directory, or two (DIR_A DIR_B), or one "
                           "with --baseline-study DIR_A")
    if baseline_study is not None:
        directories = [baseline_study, *directories]
    if len(directories) == 1:
        results = load_results(directories[0], exclude_disturbed=exclude_disturbed)
        view = with_layouts(compare_view(results), results.runs, results.objective.fom,
                            results.objective.direction)
        view = with_cores(view, results.runs, results.objective.fom, results.objective.direction)
        view = with_rates(with_storage(view, results.runs), results)
        emit(with_headroom(view, results), fmt)
        exit_if_failed(status_counts(results), f"study {results.name!r}")
        return
    a, b = (load_results(d, exclude_disturbed=exclude_disturbed) for d in directories)
    emit(cross_compare_view(compare_studies(a, b), directory_a=str(directories[0]),
                             directory_b=str(directories[1])), fmt)
    counts = status_counts(a)
    for status_name, n in status_counts(b).items():
        counts[status_name] = counts.get(status_name, 0) + n
    exit_if_failed(counts, f"studies {a.name!r} and {b.name!r} together")


def best(directory: DirArg, exclude_disturbed: ExcludeDisturbedOpt = False,
         fmt: FormatOpt = OutputFormat.text) -> None:
    """The best point, and how sure we are that it beats the runner-up."""
    from tunelab.report.headroom import with_best_headroom
    from tunelab.report.load import load_results
    from tunelab.report.views import best_view
    from tunelab.stats import StatsError

    results = load_results(directory, exclude_disturbed=exclude_disturbed)
    try:
        winner, problem = results.best_result(), ""
    except StatsError as exc:
        winner, problem = None, str(exc)
    emit(with_best_headroom(best_view(results, winner, problem), results, winner), fmt)
    exit_if_failed(status_counts(results), f"study {results.name!r}")


def forecast(
    directory: DirArg,
    workers: Annotated[str, typer.Option("--workers", "-n", help="Worker counts to predict, "
                                         "e.g. 8,16,32.", show_default=False)],
    nodes: Annotated[str, typer.Option("--nodes", help="Node counts, e.g. 1,2 (each with "
                                       "every worker count it divides).")] = "1",
    confidence: Annotated[float, typer.Option("--confidence", min=0.5, max=0.999,
                                              help="Of the prediction intervals.")] = 0.95,
    fmt: FormatOpt = OutputFormat.text,
) -> None:
    """The scaling model's throughput at worker counts and layouts (measured or not), each
    with its prediction interval and how far it is extrapolated, or why it cannot say."""
    from tunelab.report.forecast import forecast_view
    from tunelab.report.load import load_results
    from tunelab.stats import StatsError

    counts = _counts("--workers", workers)
    layouts = [(n, k) for k in _counts("--nodes", nodes) for n in counts if n % k == 0]
    if not layouts:
        raise TunelabError(f"--workers {workers} --nodes {nodes}: no worker count is a "
                           "multiple of a node count (workers are spread evenly over nodes)")
    results = load_results(directory)
    try:
        view = forecast_view(results.name, results.runs, layouts, confidence=confidence)
    except StatsError as exc:
        raise TunelabError(f"{directory}: no scaling model: {exc}") from None
    emit(view, fmt)


def _counts(option: str, text: str) -> list[int]:
    """Positive integers from ``8,16,32`` (one-line error naming ``option`` otherwise)."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or any(not 1 <= v <= 1_000_000 for v in values):
        raise TunelabError(f"{option}: expected worker or node counts such as 8,16,32 "
                           f"(each 1 to 1,000,000), got {text!r}")
    return sorted(set(values))


def report(
    directory: DirArg,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="HTML file "
                                                "(default: DIR/report.html).")] = None,
    baseline_study: BaselineStudyOpt = None,
    exclude_disturbed: ExcludeDisturbedOpt = False,
) -> None:
    """Write the plots (PNG) and a self-contained HTML report; print the report's path."""
    from tunelab.report.load import load_results
    from tunelab.report.writer import write_report

    results = load_results(directory, exclude_disturbed=exclude_disturbed)
    cross = None
    if baseline_study is not None:
        cross = compare_studies(load_results(baseline_study,
                                             exclude_disturbed=exclude_disturbed), results)
    try:
        path = write_report(results, output or directory / "report.html", cross=cross)
    except OSError as exc:
        raise TunelabError(f"cannot write {exc.filename or output or directory}: "
                           f"{exc.strerror or exc}; write the report elsewhere with --output "
                           "FILE") from None
    sys.stdout.write(f"{path}\n")
    exit_if_failed(status_counts(results), f"study {results.name!r}")


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
    site: Annotated[str | None, typer.Option(
        help="The scheduler's dialect: slurm, slurm-pmi2, slurm-none (Slurm); pbspro, "
             "openpbs, gadi, torque (PBS); default: the study's, else slurm / pbspro.")] = None,
) -> None:
    """Render a batch job script (PBS or Slurm) for the study's best configuration."""
    from tunelab.report.batch import best_job_script
    from tunelab.spec import parse_duration

    try:
        walltime_s = parse_duration(walltime) if walltime is not None else None
    except ValueError as exc:
        raise TunelabError(f"--walltime {exc}") from None
    script = best_job_script(directory, scheduler=scheduler, walltime_s=walltime_s, mem=mem,
                             project=project, queue=queue, job_name=job_name,
                             modules=module, directives=directive, site=site)
    beside = ", ".join(script.files)
    if output is None:
        sys.stdout.write(script.text)
        if beside:
            message(f"the script expects beside it: {beside} (--output FILE writes them too)")
        return
    try:
        script.write(output)
    except OSError as exc:
        raise TunelabError(f"cannot write {exc.filename or output}: {exc.strerror or exc}") \
            from None
    message(f"job script written to {output}" + (f", with {beside} beside it" if beside else ""))


def combine(
    directory: DirArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="Study file to write.")],
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write the follow-up study: env sets that were better than the baseline, combined."""
    from tunelab.report.combine import combine_better_options, left_out_text
    from tunelab.report.load import load_results

    if output.exists() and not force:
        raise TunelabError(f"{output} exists; pass --force to overwrite it")
    combination = combine_better_options(load_results(directory))
    write_text(output, combination.study_yaml)
    message(f"better than the baseline: {', '.join(combination.winners)}")
    if combination.left_out:
        many = len(combination.left_out) > 8
        message(f"left out{f' {len(combination.left_out)} env sets' if many else ''}: "
                f"{left_out_text(combination.left_out)}"
                + (f" (each is named in {output}'s header)" if many else ""))
    message(f"wrote {output}; run it with: tunelab run {output}")


def replay(
    directory: DirArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="Replay study file to write.")],
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a replay study: the finished study as a workload answering with its recorded runs."""
    from tunelab.replay import write_replay_study

    if output.exists() and not force:
        raise TunelabError(f"{output} exists; pass --force to overwrite it")
    source = write_replay_study(directory, output)
    message(f"wrote {output}; run any strategy on it offline: tunelab run {output}")
    if source["disturbed_runs"]:
        message(f"note: {source['disturbed_runs']} of its {source['runs']} recorded runs were "
                "disturbed by other processes; the replay answers with them as recorded, so "
                "its noise is partly theirs")


def export(
    directory: DirArg,
    fmt: Annotated[str, typer.Option("--format", "-f", help="csv, parquet or json.")] = "csv",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Output file "
                                                "(default: DIR/runs.<format>; - for standard "
                                                "output).")] = None,
) -> None:
    """Export every run with its parameters, figures of merit and environment."""
    from tunelab.report.export import export_runs

    formats = ("csv", "parquet", "json")
    if fmt not in formats:
        raise TunelabError(f"unknown export format {fmt!r}; valid: {', '.join(formats)}")
    target = output or directory / f"runs.{fmt}"
    n = export_runs(directory, fmt, None if str(target) == "-" else target)
    message(f"{n} runs written to {'standard output' if str(target) == '-' else target}")
