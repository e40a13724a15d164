"""``tunelab run``, ``status`` and ``space``: a study run, followed, and looked at before."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tunelab.cli.common import (
    DirArg,
    FormatOpt,
    Interrupted,
    OutputFormat,
    StudyArg,
    default_dir,
    emit,
    exit_if_failed,
    failed_runs,
    ignore_further_signals,
    load,
    plan_text,
    raise_keyboard_interrupt,
)
from tunelab.errors import TunelabError, handle_stop_signals
from tunelab.limits import LIMITS
from tunelab.report.output import message

if TYPE_CHECKING:
    from tunelab.space import Space
    from tunelab.spec import StudySpec

__all__ = ["run", "space", "status", "stored_spec"]


def run(
    study_file: StudyArg,
    directory: Annotated[Path | None, typer.Option("--dir", help="Study directory "
                                                   "(default: runs/<study name>).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the commands only: runs "
                                          "nothing, writes nothing.")] = False,
    repeats: Annotated[int | None, typer.Option("--repeats", help="Override the study's "
                                                "repeats (a fixed count, also for a study "
                                                "with repeats: auto).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress display and no "
                                        "notes before the first run.")] = False,
    detach: Annotated[bool, typer.Option("--detach", help="Batch launchers: submit the jobs "
                                         "and exit; 'tunelab status DIR' collects them.")]
    = False,
    wait_quiet: Annotated[bool, typer.Option("--wait-quiet", help="Before each run, wait "
                                             "until other processes leave its cores quiet, "
                                             "and its disks once a run waited for its own "
                                             "I/O (at most 10 minutes).")] = False,
    rerun_disturbed: Annotated[int, typer.Option("--rerun-disturbed", min=0,
                                                 max=LIMITS.repeats, help="Run each "
                                                 "run the noise watch flagged disturbed "
                                                 "again, up to N times.")] = 0,
    fmt: FormatOpt = OutputFormat.text,
) -> None:
    """Run a study (resumes where a previous run of it stopped; re-attaches to its jobs).

    Progress goes to standard error: a bar on a terminal, one line per finished run
    otherwise. The ranked results go to standard output.
    """
    from tunelab.execute.runner import run_study
    from tunelab.execute.study import describe_commands, prepare_study
    from tunelab.report.progress import study_progress
    from tunelab.spec import load_study

    spec = load_study(study_file)
    study = prepare_study(spec, repeats=repeats, dry_run=dry_run)
    study_dir = directory or default_dir(spec.name)
    if not quiet:
        for rule, why in study.space.broken.items():
            where = spec.where("derived", rule) if rule in study.space.derived \
                else spec.where("constraints")
            count, verb = _left_out(study.space, rule)
            message(f"{where}: {count} left out where {why}; "
                    f"'tunelab space {study_file}' {verb} them")
    if dry_run:
        notes: list[str] = []
        for line in describe_commands(study, study_dir, notes):
            sys.stdout.write(line + "\n")
        for note in notes:
            message(note)
        for fact in study.workload.facts():
            message(f"{study.workload.name}: {fact}")
        message(f"{plan_text(study)} (dry run: nothing was run)")
        return
    handle_stop_signals(raise_keyboard_interrupt, hangup=not study.launcher.batch)
    with study_progress(quiet=quiet) as progress:
        try:
            outcome = run_study(study, study_dir, on_start=progress.start,
                                on_event=progress.update, detach=detach,
                                wait_quiet=wait_quiet, rerun_disturbed=rerun_disturbed,
                                on_note=None if quiet else message)
        except KeyboardInterrupt:
            ignore_further_signals()
            progress.stop()
            cancelled = " its batch jobs were cancelled;" if study.launcher.batch else ""
            raise Interrupted(f"tunelab: interrupted;{cancelled} finished runs are stored in "
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
    exit_if_failed(outcome.counts, f"study {study.spec.name!r}")


def _left_out(space: Space, rule: str) -> tuple[str, str]:
    """How many combinations of ``space`` ``rule`` leaves out (``2 of 4 combinations are``;
    of a space too large to enumerate, the estimate from random draws), and what
    ``tunelab space`` does with them (lists, counts: exactly, or the same estimate where
    its rules do not prune it early enough to enumerate)."""
    n = space.left_out.get(rule)
    if n:
        return f"{n:,} of {space.size:,} combinations are", "lists"
    if space.valid_count is not None:  # enumerated: the rule left out none of it
        return "combinations are", "counts"
    estimate = space.estimate()
    return (f"of {space.size:,} combinations, "
            f"{estimate.estimated(estimate.excluded.get(rule, 0))} are", "counts")


def _print_ranking(study_dir: Path, fmt: OutputFormat) -> None:
    from tunelab.report.appendices import with_cores
    from tunelab.report.load import load_results
    from tunelab.report.rates import with_rates
    from tunelab.report.views import compare_view
    from tunelab.stats import StatsError

    try:
        results = load_results(study_dir)
    except StatsError as exc:  # e.g. no run produced the objective: the failures say why
        message(f"tunelab: no ranking: {exc}")
        return
    if results.comparisons or results.summaries:
        emit(with_rates(with_cores(compare_view(results), results.runs, results.objective.fom,
                                   results.objective.direction), results), fmt)


def status(directory: DirArg, fmt: FormatOpt = OutputFormat.text) -> None:
    """Show how far a study is and its latest failures (exit 1 when runs failed); collect
    what its batch jobs finished."""
    from tunelab.report.listings import FailureLine, LostAttempt, StatusData, status_view
    from tunelab.space import Point
    from tunelab.store import open_store

    jobs_line = _collect_jobs(directory)
    with open_store(directory) as store:
        lost_total, lost = store.lost_attempts(limit=10)
        data = StatusData(
            name=store.get_meta("study_name") or directory.name,
            directory=str(directory),
            planned=int(store.get_meta("planned_runs") or 0),
            counts=store.status_counts(),
            failures=tuple(FailureLine(dict(Point.from_key(key)), rep, st, reason)
                           for key, rep, st, reason in store.failures(limit=10)),
            jobs=jobs_line or "",
            lost_total=lost_total,
            lost=tuple(LostAttempt(dict(Point.from_key(key)), rep, state, node, reason)
                       for key, rep, state, node, reason in lost),
        )
    emit(status_view(data), fmt)
    if failed_runs(data.counts):
        raise typer.Exit(1)


def _collect_jobs(directory: Path) -> str | None:
    """Collect the finished runs of a study's open batch jobs (when no ``tunelab run``
    holds the study); a line on its jobs, or None when it has none."""
    from tunelab.store import open_store

    with open_store(directory) as store:
        open_jobs = store.open_jobs()
    if not open_jobs:
        return None
    from tunelab.errors import StoreError
    from tunelab.execute.runner import collect_study
    from tunelab.execute.study import prepare_study
    spec = stored_spec(directory)
    try:
        outcome, phases = collect_study(prepare_study(spec), directory)
    except StoreError:  # a tunelab run controls the study: it collects
        return f"jobs: {len(open_jobs)} open (a running 'tunelab run' collects them)"
    detail = ", ".join(f"{n} {p}" for p, n in sorted(phases.items())) or "none left"
    return f"jobs: {outcome.queued_jobs} active ({detail}); {outcome.ran} runs collected now"


def stored_spec(directory: Path) -> StudySpec:
    """The study a study directory was run from, as its store keeps it (relative paths in
    it resolve against the study file's directory, as when it ran)."""
    import json

    from tunelab.spec import StudySpec
    from tunelab.store import open_store

    with open_store(directory) as store:
        raw = json.loads(store.get_meta("spec") or "{}")
        study_file = store.get_meta("study_file") or ""
    return StudySpec.from_mapping(raw, source=study_file or str(directory),
                                  path=Path(study_file) if study_file else None)


def _study_or_directory(path: Path) -> StudySpec:
    """A study file, or the study a study directory holds."""
    from tunelab.store import DB_NAME

    if path.is_dir():
        if not (path / DB_NAME).is_file():
            raise TunelabError(f"{path}: is a directory, not a study file, and holds no "
                               f"{DB_NAME} (it is no study directory either)")
        return stored_spec(path)
    return load(path)


def space(
    study_file: Annotated[Path, typer.Argument(
        help="Study file (YAML), or a study directory (its stored study).",
        show_default=False)],
    show: Annotated[int, typer.Option("--show", help="How many points to list.")] = 10,
    fmt: FormatOpt = OutputFormat.text,
) -> None:
    """Count the valid points of a study's space and what each constraint excluded (of a
    study file, or of the study a study directory holds)."""
    from tunelab.errors import SpaceError
    from tunelab.execute.study import prepare_study
    from tunelab.report.listings import DERIVED_SOURCE, SpaceView, space_view
    from tunelab.space import SpaceSummary

    if show < 0:
        raise TunelabError(f"--show must be >= 0, got {show}")
    study = prepare_study(_study_or_directory(study_file), dry_run=True)
    summary: SpaceSummary | None = None
    estimate: SpaceSummary | None = None
    try:
        summary, points = study.space.summarize()
    except SpaceError:  # too large to enumerate: a sampling search (grid was refused above)
        points = study.points
        estimate = study.space.estimate()
    counts = summary or estimate
    why = {c.label: c.why or "" for c in study.space.constraints}
    why.update(counts.broken if counts else {})
    origin = {c.label: c.origin for c in study.space.constraints}
    exclusions = tuple(
        (label, n, origin.get(label, DERIVED_SOURCE if label in study.space.derived
                              else "study"), why.get(label, ""))
        for label, n in sorted((counts.excluded if counts else {}).items(),
                               key=lambda kv: -kv[1]))
    data = SpaceView(
        study=study.spec.name, names=tuple(study.space.names), total=study.space.size,
        valid=summary.valid if summary else None, exclusions=exclusions,
        points=tuple(dict(p) for p in points[:show]), plan=plan_text(study),
        plan_doc={"points": None if study.adaptive else len(study.points),
                  "repeats": study.spec.repeats, "runs": study.planned_runs,
                  "strategy": study.spec.strategy, "adaptive": study.adaptive},
        facts=tuple(f"{study.workload.name}: {fact}" for fact in study.workload.facts()),
        estimate=estimate,
    )
    emit(space_view(data), fmt)
