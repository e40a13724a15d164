"""The study runner: plan, loop, resume.

A :class:`~tunelab.execute.study.Study` (from :func:`~tunelab.execute.study.prepare_study`)
goes in; the :class:`~tunelab.execute.executor.Executor` launches, collects and records each
run. ``run_study`` executes every (point, repeat) not yet in the store,
in a seeded, interleaved order: repeat round by repeat round, points (the baseline too)
shuffled within a round, so slow drift of the machine spreads over all points instead of
masquerading as a difference between them. Each finished run is stored in one transaction;
re-running the same study continues where it stopped.
"""

from __future__ import annotations

import json
import random
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from tunelab.errors import StoreError
from tunelab.execute.executor import Executor
from tunelab.execute.guards import check_study_dir
from tunelab.execute.hygiene import study_processes
from tunelab.execute.launchers import (
    Launcher,
    LocalLauncher,
    make_launcher,
)
from tunelab.execute.launchers.watch import RunWatch
from tunelab.execute.study import Study, located
from tunelab.space import Point
from tunelab.store import RunRecord, Store, StudyLock, open_store
from tunelab.sysinfo import snapshot

__all__ = [
    "FailFast",
    "RunEvent",
    "StudyOutcome",
    "plan_runs",
    "run_study",
]


@dataclass
class RunEvent:
    """Progress report after each run (for progress displays).

    ``value`` is the run's value of the objective ``fom`` (None when it has none).
    """

    point: Point
    repeat: int
    status: str
    reason: str | None
    done: int
    total: int
    wall_s: float = 0.0
    fom: str = "wall_s"
    value: float | None = None


@dataclass
class StudyOutcome:
    """What a call of :func:`run_study` did."""

    study_dir: Path
    planned: int
    previously_done: int
    ran: int
    counts: dict[str, int] = field(default_factory=dict)
    stopped: str | None = None
    """Why the study stopped before its plan was done (see :class:`FailFast`), else None."""
    queued_jobs: int = 0

    @property
    def all_ok(self) -> bool:
        """True when every stored run of the study succeeded."""
        return self.stopped is None and all(n == 0 for s, n in self.counts.items()
                                            if s != "ok")


_JOB_TOKEN = re.compile(r"(tunelab-|jobs/)[0-9a-f]{12}\b")


class FailFast:
    """Stops a study whose every point failed its first run the same way.

    Fed each finished run of this invocation (:meth:`add`). Once the first run made here of
    each of ``n_points`` points has ``failed`` (or was ``lost`` by the infrastructure every
    time it was submitted) with one and the same reason (pw.x's
    ``Error in routine …`` line, or an exit code and message; the run's own directory is
    blanked out of it), :attr:`stop_reason` is the one line to stop with: the remaining runs
    would only repeat the error. A first run that ended any other way (ok, invalid, timed
    out, or failed differently) disarms it for good. Workload-independent.
    """

    def __init__(self, n_points: int) -> None:
        self.n_points = n_points
        self._seen: set[str] = set()
        self._reason: str | None = None
        self._armed = n_points > 0

    def add(self, record: RunRecord, study_dir: Path) -> None:
        """Take a finished run into account."""
        if not self._armed or record.point_key in self._seen:
            return
        self._seen.add(record.point_key)
        reason = _blank_run_dir(record.reason or "", record.run_dir, study_dir)
        if record.status not in ("failed", "lost") or not reason or (
                self._reason is not None and reason != self._reason):
            self._armed = False
            return
        self._reason = reason

    @property
    def stop_reason(self) -> str | None:
        """The line to stop with, or None while the study should go on."""
        if not self._armed or self._reason is None or len(self._seen) < self.n_points:
            return None
        return (f"the first run of each of the {self.n_points} points failed the same way, "
                f"so the other runs were not started: {self._reason}")


def _blank_run_dir(reason: str, run_dir: str, study_dir: Path) -> str:
    """``reason`` without what differs from run to run of one failure: the run's directory
    and the batch job's token (``tunelab-<token>``, ``jobs/<token>.json``)."""
    for form in (str((Path(study_dir) / run_dir).resolve()), str(Path(study_dir) / run_dir),
                 run_dir):
        if form:
            reason = reason.replace(form, "<run dir>")
    return _JOB_TOKEN.sub(r"\g<1><job>", reason)


def plan_runs(points: list[Point], repeats: int, seed: int) -> list[tuple[Point, int]]:
    """The interleaved, seeded run order: round by round, each round shuffled — the
    baseline too, so the study's first run (often slower: cold caches, a warming CPU) is
    not always the baseline's, which would tilt every comparison with it the same way.

    Rounds already planned do not change when ``repeats`` grows, so resuming with more
    repeats keeps the runs already done.
    """
    rng = random.Random(seed)
    order: list[tuple[Point, int]] = []
    for r in range(repeats):
        round_points = list(points)
        rng.shuffle(round_points)
        order.extend((p, r) for p in round_points)
    return order


def _identity_check(store: Store, study: Study) -> None:
    stored = store.get_meta("identity")
    ident = study.spec.identity_hash()
    if stored is not None and stored != ident:
        name = store.get_meta("study_name") or "?"
        raise StoreError(
            f"{store.path.parent}: holds study {name!r} made from a different study file; "
            "use another --dir for the changed study"
        )


def run_study(
    study: Study,
    study_dir: Path,
    *,
    on_event: Callable[[RunEvent], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    launcher: Launcher | None = None,
    detach: bool = False,
    wait_quiet: bool = False,
    rerun_disturbed: int = 0,
    on_note: Callable[[str], None] | None = None,
) -> StudyOutcome:
    """Run every missing (point, repeat) of ``study`` in ``study_dir``; resumable.

    Runs go through ``launcher`` (default: the study's ``launcher:`` section). Jobs an
    earlier, interrupted controller left in a batch queue are re-attached first. With
    ``detach`` the jobs are submitted and the call returns without waiting for them
    (``tunelab status`` collects them). Runs executed here (the local launcher) are watched
    by a :class:`~tunelab.noise.NoiseWatch`: a machine whose cores others already take is
    said through ``on_note`` before the first run; with ``wait_quiet`` each run waits first
    until others leave its cores quiet (at most :data:`tunelab.noise.MAX_QUIET_WAIT_S`);
    with ``rerun_disturbed`` each run flagged disturbed is run again, up to that many times.
    ``repeats: auto`` (``study.spec.auto_repeats``) adds rounds of the points whose
    comparison with the baseline is undecided (:func:`tunelab.stats.still_undecided`).
    """
    study_dir = Path(study_dir)
    launcher = launcher or make_launcher(study.launcher)
    watch = _watch(study, launcher, wait_quiet)
    with located(study.spec, "workload", "options"):
        study.workload.check()
    check_study_dir(study_dir)
    lock = StudyLock(study_dir)
    with lock.held(), open_store(study_dir, create=True) as store, \
            study_processes(study_dir, store) as processes:
        _identity_check(store, study)
        # runs a killed controller left running die before anything runs
        processes.sweep(on_note)
        if watch is not None and watch.noise is not None and on_note is not None:
            busy = watch.noise.busy_now()
            if busy is not None:
                on_note(f"{study.spec.name}: {busy}")
        plan = plan_runs(study.points, study.spec.repeats, study.spec.seed)
        store.set_meta({
            "identity": study.spec.identity_hash(),
            "study_name": study.spec.name,
            "study_file": str(study.spec.path or ""),
            "spec": json.dumps(study.spec.raw, default=str),
            "spec_yaml": _study_text(study.spec.path),
            "objective": json.dumps([study.objective.fom, study.objective.direction]),
            "baseline": study.baseline.key if study.baseline is not None else "",
            "noise_threshold": str(study.spec.noise_threshold),
            "planned_runs": str(study.planned_runs),
            "repeats": str(study.spec.repeats),
            "repeats_auto": json.dumps(list(study.spec.auto_repeats))
            if study.spec.auto_repeats else "",
            "workload": study.workload.name,
            "fom_units": json.dumps(dict(study.workload.fom_units)),
            **({"created_at": _now()} if store.get_meta("created_at") is None else {}),
        })
        done = store.completed()
        total = study.planned_runs
        todo = [] if study.adaptive else [(p, r) for p, r in plan if (p.key, r) not in done]
        previously = len(done) if study.adaptive else total - len(todo)
        sys_id = store.add_sysinfo(_now(), snapshot(study.workload.tool_versions()))
        if on_start is not None:
            on_start(previously, total)
        finished = previously
        fail_fast = FailFast(len({p.key for p, _ in todo}) if not study.adaptive
                             else study.spec.samples or 0)

        def record(run: RunRecord) -> None:
            nonlocal finished
            store.record_run(run)
            if watch is not None:
                watch.recorded(run)
            finished += 1
            fail_fast.add(run, study_dir)
            if on_event is not None:
                fom = study.objective.fom
                on_event(RunEvent(Point.from_key(run.point_key), run.repeat, run.status,
                                  run.reason, finished, total, run.wall_s, fom,
                                  run.foms.get(fom)))

        executor = Executor(study, store, study_dir, launcher, host=socket.gethostname(),
                            sysinfo_id=sys_id, on_record=record,
                            stop=lambda: fail_fast.stop_reason is not None,
                            on_note=on_note)
        with executor.session(detach=detach):
            if study.decides_repeats:  # the strategy asks for runs; stored ones answer
                _race(study, store, executor, fail_fast)
            elif study.spec.auto_repeats is not None:
                _auto_rounds(study, store, executor, fail_fast)
            elif not study.adaptive:
                executor.execute(todo)
            else:
                strategy = study.new_strategy()
                references = _references(study, store)
                while not strategy.done and (batch := strategy.ask(1)):
                    point = batch[0]
                    executor.execute([(point, r) for r in range(study.spec.repeats)])
                    if executor.detached and executor.active:
                        break  # an adaptive search needs the results: resume collects them
                    if fail_fast.stop_reason is not None:
                        break
                    if _moved(references, references := _references(study, store)):
                        strategy = study.new_strategy()  # told runs were judged again
                        continue
                    strategy.tell(point, store.objective_mean(point.key, study.objective.fom))
            if rerun_disturbed and not executor.detached:
                _rerun_disturbed(study, store, executor, rerun_disturbed, fail_fast)
        return StudyOutcome(study_dir, total, previously, finished - previously,
                            store.status_counts(), fail_fast.stop_reason,
                            queued_jobs=len(executor.active))


def _race(study: Study, store: Store, executor: Executor, fail_fast: FailFast) -> None:
    """Drive a run strategy: each batch of requested runs goes to the executor at once
    (a batch launcher runs them side by side), then every request is answered from the
    store — runs stored by an earlier invocation answer at once, which is how such a study
    resumes."""
    fom = study.objective.fom
    started = time.monotonic()  # max_wall counts from here, whatever strategy is made again
    runner = study.new_run_strategy(started)
    references = _references(study, store)
    while not runner.done and (requests := runner.ask_runs(64)):
        executor.execute([(r.point, r.repeat) for r in requests])
        if (executor.detached and executor.active) or fail_fast.stop_reason is not None:
            return  # the strategy needs the results: resuming collects them
        if _moved(references, references := _references(study, store)):
            runner = study.new_run_strategy(started)  # told runs were judged again (below)
            continue
        for request in requests:
            runner.tell_run(request, store.run_value(request.point.key, request.repeat, fom))


def _references(study: Study, store: Store) -> dict[str, str | None]:
    """The stored reference of each of the workload's invariants (None: not set yet)."""
    return {name: store.get_meta(f"reference.{name}") for name in study.workload.invariants()}


def _moved(before: dict[str, str | None], now: dict[str, str | None]) -> bool:
    """Whether a reference that was set has moved, so that stored runs were judged again
    (:mod:`tunelab.execute.invariants`): a strategy told their old verdicts then starts
    over from the store, as a resumed study does, and decides on what the store now says."""
    return any(value is not None and now.get(name) != value for name, value in before.items())


def _auto_rounds(study: Study, store: Store, executor: Executor, fail_fast: FailFast) -> None:
    """``repeats: auto``: every point for the plan's first rounds, then round by round the
    baseline and the points whose comparison is still undecided, until none is or the
    budget (the plan's last round) is spent. Rounds already stored answer at once (resume);
    each round's order is shuffled, seeded (the baseline too, :func:`plan_runs`)."""
    from tunelab.stats import SequentialPlan, still_undecided

    assert study.spec.auto_repeats is not None and study.baseline is not None
    low, high = study.spec.auto_repeats
    plan = SequentialPlan(low, high)
    rng = random.Random(study.spec.seed)
    pending = list(study.points)
    for r in range(high):
        if r >= low:
            undecided = set(still_undecided(
                store.runs_frame(), study.objective.fom, study.objective.direction,
                study.baseline.key, plan, noise_threshold=study.spec.noise_threshold))
            if not undecided:
                return
            pending = [p for p in study.points if p.key in undecided or p == study.baseline]
        order = list(pending)
        rng.shuffle(order)  # the baseline too (plan_runs)
        done = store.completed()
        executor.execute([(p, r) for p in order if (p.key, r) not in done])
        if (executor.detached and executor.active) or fail_fast.stop_reason is not None:
            return  # the next round needs these results: resuming collects them


def _rerun_disturbed(study: Study, store: Store, executor: Executor, times: int,
                     fail_fast: FailFast) -> None:
    """Run each ok run the noise watch flagged disturbed again, up to ``times`` times (the
    discarded runs are noted in the store's meta ``discarded_runs``)."""
    points = {p.key: p for p in study.points}
    for _ in range(times):
        runs = store.disturbed_runs()
        if not runs or fail_fast.stop_reason is not None:
            return
        store.discard_runs(runs, _now())
        executor.done -= {(key, repeat) for key, repeat, _ in runs}
        executor.execute([(points.get(key) or Point.from_key(key), repeat)
                          for key, repeat, _ in runs])


def _watch(study: Study, launcher: Launcher, wait_quiet: bool) -> RunWatch | None:
    """The noise watch (and pruner) for runs this process executes: given to a local
    launcher that has none yet; None for batch launchers (their runs run elsewhere). A
    workload that measures nothing of this machine (a replay) gets no noise watch."""
    if not isinstance(launcher, LocalLauncher):
        return None
    if launcher.watch is None:
        from tunelab.execute.gpuwatch import GpuWatch
        from tunelab.noise import NoiseWatch

        pruner = None
        if study.search_settings().prune:
            from tunelab.search import RunPruner

            pruner = RunPruner(study.objective.direction)
        noise = NoiseWatch() if study.workload.measures_machine else None
        launcher.watch = RunWatch(study.objective.fom, noise=noise, pruner=pruner,
                                  wait_quiet=wait_quiet,
                                  gpus=GpuWatch.here() if noise is not None else None)
    return launcher.watch


def collect_study(study: Study, study_dir: Path) -> tuple[StudyOutcome, dict[str, int]]:
    """Collect what the study's batch jobs finished (``tunelab status``): re-attach, record,
    close ended jobs; submit nothing. Returns the outcome and the active jobs per phase
    (``queued``, ``running``)."""
    study_dir = Path(study_dir)
    launcher = make_launcher(study.launcher)
    with StudyLock(study_dir).held(), open_store(study_dir, write=True) as store:
        _identity_check(store, study)
        before = len(store.completed())
        executor = Executor(study, store, study_dir, launcher, host=socket.gethostname(),
                            sysinfo_id=None, on_record=store.record_run)
        executor.reattach()
        phases: dict[str, int] = {}
        statuses = launcher.poll([a.job_id for a in executor.active.values()]) \
            if executor.active else {}
        for status in statuses.values():
            phases[status.phase] = phases.get(status.phase, 0) + 1
        done = len(store.completed())
        total = int(store.get_meta("planned_runs") or study.planned_runs)
        return (StudyOutcome(study_dir, total, before, done - before, store.status_counts(),
                             queued_jobs=len(executor.active)), phases)


def _study_text(path: Path | None) -> str:
    """The study file as the user wrote it (shown by the HTML report); empty if unreadable."""
    if path is None:
        return ""
    try:
        return Path(path).read_text(errors="replace")[:200_000]
    except OSError:
        return ""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
