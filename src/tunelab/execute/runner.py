"""The study runner: plan, launch, parse, judge, store — and resume.

``prepare_study`` turns a :class:`~tunelab.spec.StudySpec` into a :class:`Study` (workload,
space, objective, points). ``run_study`` executes every (point, repeat) not yet in the store,
in a seeded, interleaved order: repeat round by repeat round, points shuffled within a
round, the baseline first, so slow drift of the machine spreads over all points instead of
masquerading as a difference between them. Each finished run is stored in one transaction;
re-running the same study continues where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shlex
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tunelab.cluster.mpi import Placement
from tunelab.errors import StoreError, StudyError, WorkloadError
from tunelab.execute.executor import Executor
from tunelab.execute.guards import check_study_dir
from tunelab.execute.hygiene import study_processes
from tunelab.execute.launchers import (
    Launcher,
    LauncherConfig,
    LocalLauncher,
    launcher_config,
    make_launcher,
)
from tunelab.execute.watch import RunWatch
from tunelab.limits import LIMITS
from tunelab.search import (
    RUN_STRATEGIES,
    RunStrategy,
    SearchSettings,
    Strategy,
    make_run_strategy,
    make_strategy,
)
from tunelab.space import Point, Space
from tunelab.spec import ENV_AXIS, ConstraintSpec, StudySpec
from tunelab.store import RunRecord, Store, StudyLock, open_store
from tunelab.sysinfo import snapshot
from tunelab.workload import Objective, RunContext, Workload, get_workload

__all__ = [
    "FailFast",
    "RunEvent",
    "Study",
    "StudyOutcome",
    "plan_runs",
    "prepare_study",
    "run_study",
]


@dataclass
class Study:
    """A study ready to run: its spec, workload, space, objective and points."""

    spec: StudySpec
    workload: Workload
    space: Space
    objective: Objective
    points: list[Point]
    baseline: Point | None
    adaptive: bool = False
    launcher: LauncherConfig = field(default_factory=LauncherConfig)

    @property
    def decides_repeats(self) -> bool:
        """True when the strategy decides the runs (racing, one-at-a-time, hierarchical)."""
        return self.spec.strategy in RUN_STRATEGIES

    @property
    def planned_runs(self) -> int:
        """How many runs the study makes in all (an upper bound for adaptive searches)."""
        if self.decides_repeats:
            settings = self.search_settings()
            if settings.max_runs is not None:
                return settings.max_runs
            n_points = settings.samples or len(self.space.points())
            return n_points * settings.max_repeats
        n_points = (self.spec.samples or 0) if self.adaptive else len(self.points)
        return n_points * self.spec.repeats

    def search_settings(self) -> SearchSettings:
        """The study's ``search`` section."""
        options = dict(self.spec.search_options)
        if "max_wall" in options:
            options["max_wall_s"] = options.pop("max_wall")
        return SearchSettings(strategy=self.spec.strategy, seed=self.spec.seed,
                              samples=self.spec.samples, **options)

    def new_run_strategy(self) -> RunStrategy:
        """A fresh run strategy (it replays its history from the store)."""
        return make_run_strategy(self.search_settings(), self.space,
                                 direction=self.objective.direction, repeats=self.spec.repeats,
                                 baseline=self.baseline, env_sets=self.spec.env_sets,
                                 noise_threshold=self.spec.noise_threshold)

    def new_strategy(self) -> Strategy:
        """A fresh strategy (adaptive searches replay their history from the store)."""
        return make_strategy(self.spec.strategy, self.space, seed=self.spec.seed,
                             samples=self.spec.samples, direction=self.objective.direction,
                             first=self.baseline, env_sets=self.spec.env_sets,
                             **_sampler(self.spec))

    def context(self, point: Point, run_dir: Path, study_dir: Path, repeat: int = 0, *,
                placement: Placement | None = None, cores: int | None = None) -> RunContext:
        """The run context of ``point`` (values, env set, directories, where it runs)."""
        env_set = {}
        if self.spec.env_sets is not None:
            env_set = self.spec.env_sets[str(point[ENV_AXIS])]
        return RunContext(
            values=self.space.values(point),
            env=env_set,
            run_dir=run_dir,
            study_dir=study_dir,
            study_file=self.spec.path,
            cores=cores or os.cpu_count() or 1,
            repeat=repeat,
            placement=placement or Placement(),
        )


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


class FailFast:
    """Stops a study whose every point failed its first run the same way.

    Fed each finished run of this invocation (:meth:`add`). Once the first run made here of
    each of ``n_points`` points has ``failed`` with one and the same reason (pw.x's
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
        if record.status != "failed" or not reason or (
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
    for form in (str((Path(study_dir) / run_dir).resolve()), str(Path(study_dir) / run_dir),
                 run_dir):
        if form:
            reason = reason.replace(form, "<run dir>")
    return reason


def prepare_study(spec: StudySpec, *, repeats: int | None = None,
                  dry_run: bool = False) -> Study:
    """Build the workload, space, strategy and baseline of ``spec``; validate them.

    ``dry_run`` (``space``, ``run --dry-run``) tells the workload to start no program."""
    if repeats is not None and not 1 <= repeats <= LIMITS.repeats:
        raise StudyError(f"--repeats must be between 1 and {LIMITS.repeats:,}, got {repeats}")
    cls = get_workload(spec.workload)
    try:
        options = cls.Options.model_validate(spec.workload_options)
    except ValidationError as exc:
        err = exc.errors()[0]
        field_name = ".".join(str(p) for p in err["loc"]) or "options"
        where = spec.where("workload", "options", *err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        raise StudyError(
            f"{where}: workload {spec.workload!r} option {field_name!r}: {msg}"
        ) from None
    workload = cls(options, spec.path)
    workload.dry_run = dry_run
    launcher = launcher_config(spec)
    if not spec.parameters and spec.env_sets is None:
        spec = _with_default_space(spec, workload)
    rules = [ConstraintSpec(_parse_rule(expr, workload), why, f"workload {workload.name}")
             for expr, why in workload.rules()]
    try:
        space = Space.from_spec(spec, rules, {**_launcher_constants(spec, launcher),
                                              **workload.constants()})
    except Exception as exc:
        if isinstance(exc, StudyError | WorkloadError):
            raise
        raise StudyError(f"{spec.where('constraints')}: {exc}") from None
    try:
        workload.validate(frozenset([*space.names, *space.derived, *space.constants]))
    except WorkloadError as exc:
        raise StudyError(f"{spec.where('workload', 'options')}: workload {spec.workload!r}: "
                         f"{exc}") from None
    baseline = None
    if spec.baseline is not None:
        baseline = Point(spec.baseline)
        reason = space.why_not(baseline)
        if reason is not None:
            raise StudyError(f"{spec.where('baseline')}: the baseline is not a valid point: "
                             f"{reason}")
    objective = workload.objective
    if spec.objective_fom is not None:
        objective = Objective(spec.objective_fom, spec.objective_direction or "minimize")
    adaptive = True
    points: list[Point] = []
    if spec.strategy not in RUN_STRATEGIES:
        strategy = make_strategy(spec.strategy, space, seed=spec.seed, samples=spec.samples,
                                 direction=objective.direction, first=baseline,
                                 env_sets=spec.env_sets, **_sampler(spec))
        adaptive = strategy.adaptive
    if adaptive:  # proposals depend on results: only the baseline is known now
        points = [baseline] if baseline is not None else []
    else:
        while not strategy.done and (batch := strategy.ask(1024)):
            points.extend(batch)
        if baseline is not None and baseline not in points:
            points.insert(0, baseline)
    if repeats is not None:
        spec = spec.model_copy(update={"repeats": repeats})
    study = Study(spec, workload, space, objective, points, baseline, adaptive, launcher)
    if study.planned_runs > LIMITS.runs:
        raise StudyError(f"{spec.where('repeats')}: the study would make {study.planned_runs:,} "
                         f"runs, more than {LIMITS.runs:,}; use fewer points or repeats")
    return study


def _launcher_constants(spec: StudySpec, launcher: LauncherConfig) -> dict[str, Any]:
    """``cores_per_node`` and, on a cluster, ``cores``: the cores a run may use (the nodes'
    size times the most nodes a run asks for)."""
    per_node = launcher.cores_per_node or os.cpu_count() or 1
    if not launcher.batch:
        return {"cores_per_node": per_node}
    nodes = [int(v) for p in spec.parameters if p.name == "nodes" for v in p.values
             if isinstance(v, int | float) and not isinstance(v, bool)]
    most = max([launcher.nodes or 1, *nodes])
    return {"cores_per_node": per_node, "cores": per_node * most}


def _sampler(spec: StudySpec) -> dict[str, Any]:
    sampler = spec.search_options.get("sampler")
    return {"sampler": sampler} if sampler else {}


def _parse_rule(expr: str, workload: Workload) -> Any:
    from tunelab.expr import Expression, ExpressionError

    try:
        return Expression.parse(expr)
    except ExpressionError as exc:  # a bug in the workload, not in the user's study
        raise WorkloadError(f"workload {workload.name!r} has an invalid rule: {exc}") from None


def _with_default_space(spec: StudySpec, workload: Workload) -> StudySpec:
    default = workload.default_space()
    if not default:
        raise StudyError(f"{spec.where()}: the study names no parameters and workload "
                         f"{workload.name!r} has no default space")
    raw = {**spec.raw, "parameters": default}
    return StudySpec.from_mapping(raw, source=str(spec.path), path=spec.path)


def plan_runs(points: list[Point], repeats: int, seed: int,
              baseline: Point | None = None) -> list[tuple[Point, int]]:
    """The interleaved, seeded run order: round by round, shuffled, baseline first.

    Rounds already planned do not change when ``repeats`` grows, so resuming with more
    repeats keeps the runs already done.
    """
    rng = random.Random(seed)
    order: list[tuple[Point, int]] = []
    for r in range(repeats):
        round_points = list(points)
        rng.shuffle(round_points)
        if r == 0 and baseline is not None and baseline in round_points:
            round_points.remove(baseline)
            round_points.insert(0, baseline)
        order.extend((p, r) for p in round_points)
    return order


def point_dir_name(point: Point) -> str:
    """A short, stable directory name for a point."""
    return hashlib.sha1(point.key.encode()).hexdigest()[:12]


def describe_commands(study: Study, study_dir: Path) -> list[str]:
    """One line per point: the command it would run, for ``--dry-run``.

    Workloads (prepared with ``dry_run=True``) build the commands in a scratch directory
    that is removed afterwards; the lines show the run directories a real run would use.
    """
    lines = []
    launcher = make_launcher(study.launcher)
    with tempfile.TemporaryDirectory(prefix="tunelab-dry-") as tmp:
        for point in study.points:
            scratch = Path(tmp) / point_dir_name(point)
            scratch.mkdir()
            real = study_dir / "runs" / point_dir_name(point) / "r0"
            needs = study.workload.needs(study.space.values(point))
            ctx = study.context(point, scratch, study_dir, placement=launcher.placement(
                needs, scratch), cores=launcher.cores_per_node)
            cmd = study.workload.command(ctx)
            env = {**ctx.env, **cmd.env}
            prefix = " ".join(f"{k}={shell_quote(v)}" for k, v in sorted(env.items()))
            line = (f"[{point.label()}] {prefix + ' ' if prefix else ''}"
                    f"{' '.join(shell_quote(a) for a in cmd.argv)}")
            lines.append(line.replace(str(scratch), str(real)))
    return lines


def shell_quote(arg: str) -> str:
    """``arg`` quoted for a POSIX shell, on one line: an argument holding a line break or
    another control character is written in bash's ``$'…'`` form."""
    if not any(ord(c) < 32 or ord(c) == 127 for c in arg):
        return shlex.quote(arg)
    escaped = "".join(
        {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(c)
        or (f"\\x{ord(c):02x}" if ord(c) < 32 or ord(c) == 127 else c)
        for c in arg)
    return f"$'{escaped}'"


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
) -> StudyOutcome:
    """Run every missing (point, repeat) of ``study`` in ``study_dir``; resumable.

    Runs go through ``launcher`` (default: the study's ``launcher:`` section). Jobs an
    earlier, interrupted controller left in a batch queue are re-attached first. With
    ``detach`` the jobs are submitted and the call returns without waiting for them
    (``tunelab status`` collects them). Runs executed here (the local launcher) are sampled
    by a :class:`~tunelab.noise.NoiseWatch`; with ``wait_quiet`` each waits first until
    other processes leave the machine quiet (at most :data:`tunelab.noise.MAX_QUIET_WAIT_S`).
    """
    study_dir = Path(study_dir)
    launcher = launcher or make_launcher(study.launcher)
    watch = _watch(study, launcher, wait_quiet)
    study.workload.check()
    check_study_dir(study_dir)
    lock = StudyLock(study_dir)
    with lock.held(), open_store(study_dir, create=True) as store, \
            study_processes(study_dir, store) as processes:
        _identity_check(store, study)
        processes.sweep()  # runs a killed controller left running die before anything runs
        plan = plan_runs(study.points, study.spec.repeats, study.spec.seed, study.baseline)
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
            "workload": study.workload.name,
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
                            stop=lambda: fail_fast.stop_reason is not None)
        with executor.session(detach=detach):
            if study.decides_repeats:  # the strategy asks for runs; stored ones answer
                _race(study, store, executor, fail_fast)
            elif not study.adaptive:
                executor.execute(todo)
            else:
                strategy = study.new_strategy()
                while not strategy.done and (batch := strategy.ask(1)):
                    point = batch[0]
                    executor.execute([(point, r) for r in range(study.spec.repeats)])
                    if executor.detached and executor.active:
                        break  # an adaptive search needs the results: resume collects them
                    if fail_fast.stop_reason is not None:
                        break
                    strategy.tell(point, store.objective_mean(point.key, study.objective.fom))
        return StudyOutcome(study_dir, total, previously, finished - previously,
                            store.status_counts(), fail_fast.stop_reason,
                            queued_jobs=len(executor.active))


def _race(study: Study, store: Store, executor: Executor, fail_fast: FailFast) -> None:
    """Drive a run strategy: each batch of requested runs goes to the executor at once
    (a batch launcher runs them side by side), then every request is answered from the
    store — runs stored by an earlier invocation answer at once, which is how such a study
    resumes."""
    fom = study.objective.fom
    runner = study.new_run_strategy()
    while not runner.done and (requests := runner.ask_runs(64)):
        executor.execute([(r.point, r.repeat) for r in requests])
        if (executor.detached and executor.active) or fail_fast.stop_reason is not None:
            return  # the strategy needs the results: resuming collects them
        for request in requests:
            runner.tell_run(request, store.run_value(request.point.key, request.repeat, fom))


def _watch(study: Study, launcher: Launcher, wait_quiet: bool) -> RunWatch | None:
    """The noise watch (and pruner) for runs this process executes: given to a local
    launcher that has none yet; None for batch launchers (their runs run elsewhere)."""
    if not isinstance(launcher, LocalLauncher):
        return None
    if launcher.watch is None:
        from tunelab.noise import NoiseWatch

        pruner = None
        if study.search_settings().prune:
            from tunelab.search import RunPruner

            pruner = RunPruner(study.objective.direction)
        launcher.watch = RunWatch(study.objective.fom, noise=NoiseWatch(), pruner=pruner,
                                  wait_quiet=wait_quiet)
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
