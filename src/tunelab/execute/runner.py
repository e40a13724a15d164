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
from tunelab.execute.guards import (
    check_run_dir,
    check_study_dir,
    command_problem,
    read_output,
    split_finite,
    write_fault,
)
from tunelab.execute.hygiene import study_processes
from tunelab.execute.launchers import LocalLauncher
from tunelab.limits import LIMITS
from tunelab.search import Strategy, make_strategy
from tunelab.space import Point, Space
from tunelab.spec import ENV_AXIS, ConstraintSpec, StudySpec
from tunelab.store import RunRecord, Store, StudyLock, open_store
from tunelab.sysinfo import snapshot
from tunelab.workloads import Objective, RunContext, Workload, get_workload

__all__ = [
    "FailFast",
    "RunEvent",
    "Study",
    "StudyOutcome",
    "plan_runs",
    "prepare_study",
    "run_study",
]

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
    def planned_runs(self) -> int:
        """How many runs the study makes in all (an upper bound for adaptive searches)."""
        n_points = (self.spec.samples or 0) if self.adaptive else len(self.points)
        return n_points * self.spec.repeats

    def new_strategy(self) -> Strategy:
        """A fresh strategy (adaptive searches replay their history from the store)."""
        return make_strategy(self.spec.strategy, self.space, seed=self.spec.seed,
                             samples=self.spec.samples, direction=self.objective.direction,
                             first=self.baseline)

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
    strategy = make_strategy(spec.strategy, space, seed=spec.seed, samples=spec.samples,
                             direction=objective.direction, first=baseline)
    points: list[Point] = []
    if strategy.adaptive:  # proposals depend on results: only the baseline is known now
        points = [baseline] if baseline is not None else []
    else:
        while not strategy.done and (batch := strategy.ask(1024)):
            points.extend(batch)
        if baseline is not None and baseline not in points:
            points.insert(0, baseline)
    if repeats is not None:
        spec = spec.model_copy(update={"repeats": repeats})
    study = Study(spec, workload, space, objective, points, baseline, strategy.adaptive)
    if study.planned_runs > LIMITS.runs:
        raise StudyError(f"{spec.where('repeats')}: the study would make {study.planned_runs:,} "
                         f"runs, more than {LIMITS.runs:,}; use fewer points or repeats")
    return study


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
    with tempfile.TemporaryDirectory(prefix="tunelab-dry-") as tmp:
        for point in study.points:
            scratch = Path(tmp) / point_dir_name(point)
            scratch.mkdir()
            real = study_dir / "runs" / point_dir_name(point) / "r0"
            ctx = study.context(point, scratch, study_dir)
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


def _tail(path: Path) -> str:
    text = read_output(path).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1][-_TAIL_CHARS:] if lines else ""


def run_study(
    study: Study,
    study_dir: Path,
    *,
    on_event: Callable[[RunEvent], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    launcher: LocalLauncher | None = None,
) -> StudyOutcome:
    """Run every missing (point, repeat) of ``study`` in ``study_dir``; resumable."""
    study_dir = Path(study_dir)
    launcher = launcher or LocalLauncher()
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
        host = socket.gethostname()
        finished = previously
        fail_fast = FailFast(len({p.key for p, _ in todo}) if not study.adaptive
                             else study.spec.samples or 0)

        def run_one(point: Point, repeat: int) -> bool:
            """Run and store one run; False when the study must stop."""
            nonlocal finished
            record = _execute(study, store, study_dir, point, repeat, launcher, host, sys_id)
            store.record_run(record)
            finished += 1
            fail_fast.add(record, study_dir)
            if on_event is not None:
                fom = study.objective.fom
                on_event(RunEvent(point, repeat, record.status, record.reason, finished,
                                  total, record.wall_s, fom, record.foms.get(fom)))
            return fail_fast.stop_reason is None

        if not study.adaptive:
            for point, repeat in todo:
                if not run_one(point, repeat):
                    break
        else:
            strategy = study.new_strategy()
            while not strategy.done and (batch := strategy.ask(1)):
                point = batch[0]
                for repeat in range(study.spec.repeats):
                    if (point.key, repeat) not in done and not run_one(point, repeat):
                        break
                if fail_fast.stop_reason is not None:
                    break
                strategy.tell(point, store.objective_mean(point.key, study.objective.fom))
        return StudyOutcome(study_dir, total, previously, finished - previously,
                            store.status_counts(), fail_fast.stop_reason)


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


def _execute(study: Study, store: Store, study_dir: Path, point: Point, repeat: int,
             launcher: LocalLauncher, host: str, sysinfo_id: int) -> RunRecord:
    run_dir = study_dir / "runs" / point_dir_name(point) / f"r{repeat}"
    try:
        if run_dir.exists():  # left over by an interrupted run: start clean
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
    except OSError as exc:
        raise write_fault(exc, run_dir) from None
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
    try:
        cmd = study.workload.command(ctx)
        argv = list(cmd.argv)
        env_extra.update(cmd.env)
        problem = command_problem(argv, env_extra, cmd.cwd or run_dir)
        if problem is not None:
            raise LaunchError(problem)
        try:
            outcome = launcher.run(
                argv, env={**os.environ, **env_extra}, cwd=cmd.cwd or run_dir,
                timeout_s=study.spec.timeout_s, stdout_path=stdout_path,
                stderr_path=stderr_path,
            )
        except OSError as exc:  # the run's own output files could not be written
            raise write_fault(exc, run_dir) from None
        check_run_dir(run_dir, stdout_path, stderr_path)
        rc, wall = outcome.rc, outcome.wall_s
        if outcome.status == "timeout":
            status, reason = "timeout", f"killed after the {study.spec.timeout_s:g} s timeout"
        else:
            status, reason, foms = _parse(study, outcome.rc, stdout_path, stderr_path, run_dir)
    except (LaunchError, WorkloadError) as exc:
        status, reason = "failed", str(exc)
    foms = {**foms, "wall_s": wall}
    if status == "ok":
        status, reason = _check_invariants(study, store, foms)
    return RunRecord(
        point_key=point.key, params=dict(point), repeat=repeat, status=status, reason=reason,
        rc=rc, wall_s=wall, started_at=started, ended_at=_now(), host=host, command=argv,
        env=env_extra, run_dir=str(run_dir.relative_to(study_dir)), foms=foms,
        sysinfo_id=sysinfo_id,
    )


def _parse(study: Study, rc: int | None, stdout_path: Path, stderr_path: Path,
           run_dir: Path) -> tuple[str, str | None, dict[str, float]]:
    stdout, stderr = read_output(stdout_path), read_output(stderr_path)
    try:
        foms, not_finite = split_finite(study.workload.parse(stdout, stderr, run_dir))
    except RunReportedError as exc:
        return "failed", (f"exit code {rc}: {exc}" if rc else str(exc)), {}
    except ParseError as exc:
        if rc == 0:
            return "failed", f"unparsable output: {exc}", {}
        foms, not_finite = {}, None
    if rc != 0:
        tail = _tail(stderr_path) or _tail(stdout_path)
        return "failed", f"exit code {rc}" + (f": {tail}" if tail else ""), foms
    if not_finite is not None:
        return "failed", not_finite, foms
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
            problems.append(f"{name} differs by {diff:.2g} > {tolerance:g} from the study's "
                            f"reference ({foms[name]!r} vs {ref!r})")
    return ("invalid", "; ".join(problems)) if problems else ("ok", None)
