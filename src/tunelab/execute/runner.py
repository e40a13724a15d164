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
import math
import os
import random
import shlex
import shutil
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tunelab.errors import (
    LaunchError,
    ParseError,
    RunReportedError,
    StoreError,
    StudyError,
    WorkloadError,
)
from tunelab.execute.launchers import LocalLauncher
from tunelab.noise import NoiseWatch
from tunelab.search import (
    RUN_STRATEGIES,
    IntermediateTail,
    RunPruner,
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
from tunelab.workloads import Objective, RunContext, Workload, get_workload

__all__ = ["RunEvent", "Study", "StudyOutcome", "plan_runs", "prepare_study", "run_study"]

_TAIL_CHARS = 300


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

    def context(self, point: Point, run_dir: Path, study_dir: Path,
                repeat: int = 0) -> RunContext:
        """The run context of ``point`` (values, env set, directories)."""
        env_set = {}
        if self.spec.env_sets is not None:
            env_set = self.spec.env_sets[str(point[ENV_AXIS])]
        return RunContext(
            values=self.space.values(point),
            env=env_set,
            run_dir=run_dir,
            study_dir=study_dir,
            study_file=self.spec.path,
            cores=os.cpu_count() or 1,
            repeat=repeat,
        )


@dataclass
class RunEvent:
    """Progress report after each run (for progress bars)."""

    point: Point
    repeat: int
    status: str
    reason: str | None
    done: int
    total: int


@dataclass
class StudyOutcome:
    """What a call of :func:`run_study` did."""

    study_dir: Path
    planned: int
    previously_done: int
    ran: int
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def all_ok(self) -> bool:
        """True when every stored run of the study succeeded."""
        return all(n == 0 for s, n in self.counts.items() if s != "ok")


def prepare_study(spec: StudySpec, *, repeats: int | None = None) -> Study:
    """Build the workload, space, strategy and baseline of ``spec``; validate them."""
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
    if not spec.parameters and spec.env_sets is None:
        spec = _with_default_space(spec, workload)
    rules = [ConstraintSpec(_parse_rule(expr, workload), why, f"workload {workload.name}")
             for expr, why in workload.rules()]
    try:
        space = Space.from_spec(spec, rules, workload.constants())
    except Exception as exc:
        if isinstance(exc, StudyError | WorkloadError):
            raise
        raise StudyError(f"{spec.where('constraints')}: {exc}") from None
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
        if repeats < 1:
            raise StudyError(f"--repeats must be at least 1, got {repeats}")
        spec = spec.model_copy(update={"repeats": repeats})
    return Study(spec, workload, space, objective, points, baseline, adaptive)


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
    """One line per point: the command it would run, for ``--dry-run``."""
    lines = []
    with tempfile.TemporaryDirectory(prefix="tunelab-dry-") as tmp:
        for point in study.points:
            run_dir = Path(tmp) / point_dir_name(point)
            run_dir.mkdir()
            ctx = study.context(point, run_dir, study_dir)
            cmd = study.workload.command(ctx)
            env = {**ctx.env, **cmd.env}
            prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
            lines.append(f"[{point.label()}] {prefix + ' ' if prefix else ''}"
                         f"{shlex.join(cmd.argv)}")
    return lines


def _identity_check(store: Store, study: Study) -> None:
    stored = store.get_meta("identity")
    ident = study.spec.identity_hash()
    if stored is not None and stored != ident:
        name = store.get_meta("study_name") or "?"
        raise StoreError(
            f"{store.path.parent}: holds study {name!r} made from a different study file; "
            "use another --dir for the changed study"
        )


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1][-_TAIL_CHARS:] if lines else ""


def run_study(
    study: Study,
    study_dir: Path,
    *,
    on_event: Callable[[RunEvent], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    launcher: LocalLauncher | None = None,
    wait_quiet: bool = False,
) -> StudyOutcome:
    """Run every missing (point, repeat) of ``study`` in ``study_dir``; resumable.

    Every run is sampled by a :class:`~tunelab.noise.NoiseWatch`; with ``wait_quiet`` each
    run waits first until other processes leave the machine quiet (at most
    :data:`tunelab.noise.MAX_QUIET_WAIT_S`)."""
    study_dir = Path(study_dir)
    launcher = launcher or LocalLauncher()
    watch = NoiseWatch()
    pruner = RunPruner(study.objective.direction) if study.search_settings().prune else None
    study.workload.check()
    lock = StudyLock(study_dir)
    with lock.held(), open_store(study_dir, create=True) as store:
        _identity_check(store, study)
        plan = plan_runs(study.points, study.spec.repeats, study.spec.seed, study.baseline)
        store.set_meta({
            "identity": study.spec.identity_hash(),
            "study_name": study.spec.name,
            "study_file": str(study.spec.path or ""),
            "spec": json.dumps(study.spec.raw, default=str),
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
        host = socket.gethostname()
        finished = previously

        def run_one(point: Point, repeat: int) -> None:
            nonlocal finished
            if wait_quiet:
                watch.wait_quiet()
            record = _execute(study, store, study_dir, point, repeat, launcher, host, sys_id,
                              watch, pruner)
            store.record_run(record)
            finished += 1
            if on_event is not None:
                on_event(RunEvent(point, repeat, record.status, record.reason, finished,
                                  total))

        if study.decides_repeats:  # the strategy asks for runs; stored ones answer at once
            fom = study.objective.fom
            runner = study.new_run_strategy()
            while not runner.done and (requests := runner.ask_runs(64)):
                for request in requests:
                    if (request.point.key, request.repeat) not in done:
                        run_one(request.point, request.repeat)
                    runner.tell_run(request, store.run_value(request.point.key, request.repeat,
                                                             fom))
        elif not study.adaptive:
            for point, repeat in todo:
                run_one(point, repeat)
        else:
            strategy = study.new_strategy()
            while not strategy.done and (batch := strategy.ask(1)):
                point = batch[0]
                for repeat in range(study.spec.repeats):
                    if (point.key, repeat) not in done:
                        run_one(point, repeat)
                strategy.tell(point, store.objective_mean(point.key, study.objective.fom))
        return StudyOutcome(study_dir, total, previously, finished - previously,
                            store.status_counts())


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _execute(study: Study, store: Store, study_dir: Path, point: Point, repeat: int,
             launcher: LocalLauncher, host: str, sysinfo_id: int,
             watch: NoiseWatch | None = None, pruner: RunPruner | None = None) -> RunRecord:
    run_dir = study_dir / "runs" / point_dir_name(point) / f"r{repeat}"
    if run_dir.exists():  # left over by an interrupted run: start clean
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    stdout_path, stderr_path = run_dir / "stdout.txt", run_dir / "stderr.txt"
    ctx = study.context(point, run_dir, study_dir, repeat)
    started = _now()
    argv: list[str] = []
    env_extra: dict[str, str] = dict(ctx.env)
    status: str = "failed"
    reason: str | None = None
    rc: int | None = None
    wall = 0.0
    foms: dict[str, float] = {}
    noise: dict[str, float | None] | None = None
    try:
        cmd = study.workload.command(ctx)
        argv = list(cmd.argv)
        env_extra.update(cmd.env)
        before = watch.start() if watch is not None else None
        trial = pruner.begin() if pruner is not None else None
        outcome = launcher.run(
            argv, env={**os.environ, **env_extra}, cwd=cmd.cwd or run_dir,
            timeout_s=study.spec.timeout_s, stdout_path=stdout_path, stderr_path=stderr_path,
            should_stop=_pruning_check(pruner, trial, stdout_path, study.objective.fom),
            poll_s=0.2,
        )
        if watch is not None and before is not None:
            noise = watch.stop(before).as_dict()
        rc, wall = outcome.rc, outcome.wall_s
        if outcome.status == "stopped" and trial is not None:
            last = trial.steps[-1] if trial.steps else (trial.pruned_at, math.nan)
            status, reason = "pruned", (f"pruned at step {trial.pruned_at}: "
                                        f"{study.objective.fom} {last[1]:.4g} behind the "
                                        "median of earlier runs")
        elif outcome.status == "timeout":
            status, reason = "timeout", f"killed after the {study.spec.timeout_s:g} s timeout"
        else:
            status, reason, foms = _parse(study, outcome.rc, stdout_path, stderr_path, run_dir)
    except (LaunchError, WorkloadError) as exc:
        status, reason = "failed", str(exc)
    foms = {**foms, "wall_s": wall}
    if status == "ok":
        status, reason = _check_invariants(study, store, foms)
    if pruner is not None and trial is not None:
        pruner.end(trial, foms.get(study.objective.fom) if status == "ok" else None)
    return RunRecord(
        point_key=point.key, params=dict(point), repeat=repeat, status=status, reason=reason,
        rc=rc, wall_s=wall, started_at=started, ended_at=_now(), host=host, command=argv,
        env=env_extra, run_dir=str(run_dir.relative_to(study_dir)), foms=foms,
        sysinfo_id=sysinfo_id, noise=noise,
    )


def _pruning_check(pruner: RunPruner | None, trial: Any, stdout_path: Path,
                   fom: str) -> Callable[[], bool] | None:
    """What the launcher asks while a run runs: should the pruner stop it now?"""
    if pruner is None or trial is None:
        return None
    tail = IntermediateTail(stdout_path, fom)
    return lambda: any(pruner.report(trial, step, value) for step, value in tail.read())


def _parse(study: Study, rc: int | None, stdout_path: Path, stderr_path: Path,
           run_dir: Path) -> tuple[str, str | None, dict[str, float]]:
    stdout = stdout_path.read_text(errors="replace")
    stderr = stderr_path.read_text(errors="replace")
    try:
        foms = study.workload.parse(stdout, stderr, run_dir)
    except RunReportedError as exc:
        return "failed", (f"exit code {rc}: {exc}" if rc else str(exc)), {}
    except ParseError as exc:
        if rc == 0:
            return "failed", f"unparsable output: {exc}", {}
        foms = {}
    if rc != 0:
        tail = _tail(stderr_path) or _tail(stdout_path)
        return "failed", f"exit code {rc}" + (f": {tail}" if tail else ""), foms
    if study.objective.fom != "wall_s" and study.objective.fom not in foms:
        have = ", ".join(sorted(foms)) or "none"
        return "failed", (f"objective FOM {study.objective.fom!r} missing from the output; "
                          f"parsed: {have}"), foms
    return "ok", None, foms


def _check_invariants(study: Study, store: Store,
                      foms: dict[str, float]) -> tuple[str, str | None]:
    problems = []
    for name, tolerance in study.workload.invariants().items():
        if name not in foms:
            continue
        ref_raw = store.get_meta(f"reference.{name}")
        if ref_raw is None:
            store.set_meta({f"reference.{name}": repr(foms[name])})
            continue
        ref = float(ref_raw)
        diff = abs(foms[name] - ref)
        if diff > tolerance:
            problems.append(f"{name} = {foms[name]!r} differs from the study's reference "
                            f"{ref!r} by {diff:.3g} (tolerance {tolerance:g})")
    return ("invalid", "; ".join(problems)) if problems else ("ok", None)
