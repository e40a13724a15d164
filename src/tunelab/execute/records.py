"""How a finished run becomes its :class:`~tunelab.store.RunRecord`: the status, reason and
figures of merit of its outcome (:func:`run_record`: the output parsed by the workload, a
missing or truncated output ``failed``, never a number; then the study's invariants), and the
scratch files the workload names dropped once the record is stored (:func:`drop_scratch`).
What :class:`~tunelab.execute.executor.Executor` records every run with.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from tunelab.errors import ParseError, RunReportedError
from tunelab.execute.guards import check_run_dir, read_output, split_finite
from tunelab.execute.invariants import check_invariants
from tunelab.execute.launchers.base import Outcome
from tunelab.execute.reasons import MESSAGE_CHARS, failure_reason, printable
from tunelab.store import RunRecord, Store
from tunelab.workload import ENGINE_FOMS, WALL_FOM

if TYPE_CHECKING:
    from tunelab.execute.study import Study

__all__ = ["drop_scratch", "parse_run", "run_record", "timestamp"]


def timestamp() -> str:
    """Now, in UTC, ISO 8601 to the millisecond: the times records and jobs are stored with."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def run_record(study: Study, store: Store, key: str, params: dict[str, object], repeat: int,
               run_dir: Path, argv: list[str], env: dict[str, str], outcome: Outcome, *,
               host: str, study_dir: Path, sysinfo_id: int | None) -> RunRecord:
    """The record of the run ``outcome`` ended (its output parsed, then the invariants
    checked against ``store``); ``host`` where the outcome names none."""
    foms: dict[str, float] = {}
    status: str = outcome.status
    reason = outcome.reason
    if outcome.status == "stopped":  # the pruner stopped it (see execute/launchers/watch.py)
        status = "pruned"
    elif outcome.status == "lost":  # the infrastructure lost it, retries spent
        status = "lost"
    elif reason is not None:  # could not start, or cut off by the scheduler
        status = "timeout" if outcome.status == "timeout" else "failed"
    elif outcome.status == "timeout":
        check_run_dir(run_dir, run_dir / "stdout.txt", run_dir / "stderr.txt")
        reason = f"killed after the {study.spec.timeout_s:g} s timeout"
    else:
        check_run_dir(run_dir, run_dir / "stdout.txt", run_dir / "stderr.txt")
        status, reason, foms = parse_run(study, outcome.rc, run_dir)
    foms = {**foms, WALL_FOM: outcome.wall_s}
    if status == "ok":
        status, reason = check_invariants(study, store, params, foms)
    return RunRecord(
        point_key=key, params=params, repeat=repeat, status=status, reason=reason,
        rc=outcome.rc, wall_s=outcome.wall_s, started_at=outcome.started_at or timestamp(),
        ended_at=outcome.ended_at or timestamp(), host=outcome.host or host,
        command=argv, env=env, run_dir=str(run_dir.relative_to(study_dir)),
        foms=foms, sysinfo_id=sysinfo_id, noise=outcome.noise)


def drop_scratch(study: Study, run_dir: Path) -> None:
    """Delete the scratch files the workload names (:meth:`Workload.scratch`) once the run
    is recorded: only paths inside ``run_dir``; one that cannot be deleted stays."""
    base = run_dir.resolve()
    for path in study.workload.scratch(run_dir):
        target = path.resolve()
        if target == base or not target.is_relative_to(base):
            continue
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)


def parse_run(study: Study, rc: int | None,
              run_dir: Path) -> tuple[str, str | None, dict[str, float]]:
    """(status, reason, FOMs) of a finished run from its output files; a missing or
    truncated output is ``failed``, never a number."""
    stdout_path, stderr_path = run_dir / "stdout.txt", run_dir / "stderr.txt"
    for path in (stdout_path, stderr_path):
        if not path.is_file():
            return "failed", f"output missing: No such file or directory: {path}", {}
    stdout, stderr = read_output(stdout_path), read_output(stderr_path)
    try:
        foms, not_finite = split_finite(study.workload.parse(stdout, stderr, run_dir))
    except RunReportedError as exc:  # the program's own words: made printable, bounded
        why = printable(str(exc), MESSAGE_CHARS)
        return "failed", (f"exit code {rc}: {why}" if rc else why), {}
    except ParseError as exc:
        if rc == 0:
            return "failed", f"unparsable output: {printable(str(exc), MESSAGE_CHARS)}", {}
        foms, not_finite = {}, None
    if rc != 0:
        return "failed", failure_reason(rc, stdout, stderr), foms
    if not_finite is not None:
        return "failed", not_finite, foms
    if study.objective.fom not in ENGINE_FOMS and study.objective.fom not in foms:
        have = ", ".join(sorted(foms)) or "none"
        return "failed", (f"objective FOM {study.objective.fom!r} missing from the output; "
                          f"parsed: {have}"), foms
    return "ok", None, foms
