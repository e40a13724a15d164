"""A study ready to run: the :class:`Study` model the runner loops over and the executor
launches, built from a :class:`~tunelab.spec.StudySpec` by :func:`prepare_study` (workload,
space, objective, points, launcher), and where its runs live (:func:`run_dir_of`).
:func:`describe_commands` is ``run --dry-run``: the command of every point, nothing run.
"""

from __future__ import annotations

import hashlib
import math
import os
import shlex
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tunelab.cluster.mpi import Placement
from tunelab.errors import SpaceError, StudyError, WorkloadError
from tunelab.execute.guards import overridden_env, override_note
from tunelab.execute.launchers import LauncherConfig, launcher_config, make_launcher
from tunelab.execute.launchers.base import local_cores
from tunelab.limits import LIMITS
from tunelab.search import (
    RUN_STRATEGIES,
    Budget,
    RunStrategy,
    SearchSettings,
    Strategy,
    make_run_strategy,
    make_strategy,
)
from tunelab.space import Point, Space
from tunelab.spec import ENV_AXIS, ConstraintSpec, StudySpec
from tunelab.workload import ENGINE_FOMS, Objective, RunContext, Workload, get_workload

__all__ = ["Study", "describe_commands", "located", "point_dir_name", "prepare_study",
           "run_dir_of", "shell_quote"]


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
            bound = self._valid_points() * settings.max_repeats  # no point runs more often
            if settings.max_runs is not None:
                return int(min(settings.max_runs, bound))
            n_points = int(min(settings.samples or len(self.space.points()), self._valid_points()))
            return n_points * settings.max_repeats
        n_points = (int(min(self.spec.samples or 0, self._valid_points())) if self.adaptive
                    else len(self.points))
        return n_points * self.spec.repeats

    def _valid_points(self) -> int | float:
        """How many valid points the space has, once it was enumerated at load (constraints
        and derived values a workload never takes left out); for a space too large to
        enumerate, how many its strategy can propose at most (the most points a sampling of
        it found, and the baseline); else no bound (``inf``)."""
        if self.space.valid_count is not None:
            return self.space.valid_count
        if self.space.sampled_most:
            return self.space.sampled_most + (self.baseline is not None)
        return math.inf

    def search_settings(self) -> SearchSettings:
        """The study's ``search`` section."""
        options = dict(self.spec.search_options)
        if "max_wall" in options:
            options["max_wall_s"] = options.pop("max_wall")
        return SearchSettings(strategy=self.spec.strategy, seed=self.spec.seed,
                              samples=self.spec.samples, **options)

    def new_run_strategy(self, started: float | None = None) -> RunStrategy:
        """A fresh run strategy (it replays its history from the store); its ``max_wall``
        counts from ``started`` (a :func:`time.monotonic` reading), else from its first
        request."""
        settings = self.search_settings()
        return make_run_strategy(settings, self.space,
                                 direction=self.objective.direction, repeats=self.spec.repeats,
                                 baseline=self.baseline, env_sets=self.spec.env_sets,
                                 noise_threshold=self.spec.noise_threshold,
                                 budget=Budget(settings.max_runs, settings.max_wall_s,
                                               started=started))

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
            cores=cores or local_cores(),
            repeat=repeat,
            placement=placement or Placement(),
        )


def prepare_study(spec: StudySpec, *, repeats: int | None = None,
                  dry_run: bool = False) -> Study:
    """Build the workload, space, strategy and baseline of ``spec``; validate them.

    ``dry_run`` (``space``, ``run --dry-run``) tells the workload to start no program."""
    if repeats is not None and not 1 <= repeats <= LIMITS.repeats:
        raise StudyError(f"--repeats must be between 1 and {LIMITS.repeats:,}, got {repeats}")
    with located(spec, "workload", "name"):
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
    with located(spec, "workload", "options"):
        workload = cls(options, spec.path)
        workload.dry_run = dry_run
    _check_parameters(spec, workload)
    launcher = launcher_config(spec)
    workload.runs_here = not launcher.batch
    with located(spec, "workload", "options"):
        if not spec.parameters and spec.env_sets is None:
            spec = _with_default_space(spec, workload)
        rules = [ConstraintSpec(_parse_rule(expr, workload), why, f"workload {workload.name}")
                 for expr, why in workload.rules()]
        constants = {**_launcher_constants(spec, launcher), **workload.constants()}
    try:
        space = Space.from_spec(spec, rules, constants, _refuses(workload))
    except SpaceError as exc:
        raise StudyError(f"{_space_where(spec, exc)}: {exc}") from None
    except Exception as exc:
        if isinstance(exc, StudyError | WorkloadError):
            raise
        raise StudyError(f"{spec.where('constraints')}: {exc}") from None
    _check_reads(spec, cls, space)
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
        problem = _objective_problem(spec.objective_fom, workload)
        if problem:
            raise StudyError(f"{spec.where('objective', 'fom')}: 'objective.fom' "
                             f"{spec.objective_fom!r}: {problem}")
        objective = Objective(spec.objective_fom, spec.objective_direction or "minimize")
    adaptive = True
    points: list[Point] = []
    try:
        if space.enumerable:  # every rule and derived value checked once, whatever searches
            space.points()
        else:  # too large: what its rules leave out is estimated from random draws
            space.estimate()
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
    except SpaceError as exc:
        raise StudyError(f"{_space_where(spec, exc)}: {exc}") from None
    _check_values(spec, workload, space, points)
    if repeats is not None:  # a fixed count from the command line
        spec = spec.model_copy(update={"repeats": repeats, "auto_repeats": None})
    if spec.auto_repeats is not None and (adaptive or spec.strategy in RUN_STRATEGIES):
        raise StudyError(f"{spec.where('repeats')}: repeats: auto needs the points known up "
                         f"front (search strategy grid); {spec.strategy!r} chooses its own")
    study = Study(spec, workload, space, objective, points, baseline, adaptive, launcher)
    if study.decides_repeats:  # its settings are checked as it is made: now, not at the run
        with located(spec, "search"):
            study.new_run_strategy()
    if study.planned_runs > LIMITS.runs:
        raise StudyError(f"{spec.where('repeats')}: the study would make {study.planned_runs:,} "
                         f"runs, more than {LIMITS.runs:,}; use fewer points or repeats")
    return study


@contextmanager
def located(spec: StudySpec, *path: Any) -> Iterator[None]:
    """Errors of the block that do not name the study file yet become
    :class:`~tunelab.errors.StudyError` located at ``path`` (``file:line: …``)."""
    try:
        yield
    except (WorkloadError, SpaceError, StudyError) as exc:
        text = str(exc)
        if isinstance(exc, StudyError) and spec.path is not None and \
                text.startswith(str(spec.path)):
            raise
        raise StudyError(f"{spec.where(*path)}: {text}") from None


def _space_where(spec: StudySpec, exc: SpaceError) -> str:
    """Where the part of the study a :class:`SpaceError` is about was written: a derived
    value, a constraint (a workload's built-in rule: its workload), else the parameters."""
    kind, name = exc.subject or ("", "")
    if kind == "derived" and name in spec.derived:
        return spec.where("derived", name)
    if kind == "constraint":
        for index, constraint in enumerate(spec.constraints):
            if constraint.label == name:
                return spec.where("constraints", index)
        return spec.where("workload", "name")
    if kind == "parameter" and any(p.name == name for p in spec.parameters):
        return spec.where("parameters", name)
    return spec.where("parameters")


def _check_reads(spec: StudySpec, cls: type[Workload], space: Space) -> None:
    """Refuse a parameter the workload's command does not use (:attr:`Workload.reads`):
    its points would all run the same command."""
    if cls.reads is None:
        return
    for name in space.names:
        if name != ENV_AXIS and name not in cls.reads:
            raise StudyError(
                f"{spec.where('parameters', name)}: workload {spec.workload!r} does not use a "
                f"parameter {name!r}: every value would run the same command; its "
                f"parameters are {', '.join(sorted(cls.reads))}")


def _check_parameters(spec: StudySpec, workload: Workload) -> None:
    """Refuse a parameter value the workload can never take
    (:meth:`~tunelab.workload.Workload.check_parameter`), at that parameter: bad input, not
    a point for a rule to exclude."""
    for parameter in spec.parameters:
        for value in parameter.values:
            try:
                workload.check_parameter(parameter.name, value)
            except WorkloadError as exc:
                raise StudyError(f"{spec.where('parameters', parameter.name)}: workload "
                                 f"{spec.workload!r} parameter {parameter.name!r}: value "
                                 f"{value!r}: {exc}") from None


def _refuses(workload: Workload) -> Callable[[str, Any], str | None]:
    """What the space asks of each derived value: why ``workload`` never takes it
    (:meth:`~tunelab.workload.Workload.check_parameter`, which refuses a parameter's value
    at load), or None. A combination whose derived value it never takes is no point of the
    space — never run, never a failed run or trial of any strategy — and the space says so
    once per derived value (:attr:`~tunelab.space.Space.broken`)."""

    def refuses(name: str, value: Any) -> str | None:
        try:
            workload.check_parameter(name, value)
        except WorkloadError as exc:
            return f"a value workload {workload.name!r} never takes: {exc}"
        return None

    return refuses


def _check_values(spec: StudySpec, workload: Workload, space: Space,
                  points: list[Point]) -> None:
    """Refuse a point known before the study runs whose values cannot make the workload's
    command (``space``, ``--dry-run`` and ``run`` alike), at the option at fault (a derived
    value the workload never takes left the space already, see :func:`_refuses`)."""
    for point in points:
        values = space.values(point)
        try:
            workload.check_values(values)
        except WorkloadError as exc:
            if exc.option and exc.option[0] in point:  # an option the point's parameter set
                where = spec.where("parameters", exc.option[0])
            elif exc.option and exc.option[0] in spec.derived:  # or a derived value
                where = spec.where("derived", exc.option[0])
            else:
                where = spec.where("workload", "options", *exc.option)
            raise StudyError(f"{where}: workload {spec.workload!r}: point {point.label()}: "
                             f"{exc}") from None


def _objective_problem(fom: str, workload: Workload) -> str | None:
    """Why no run of ``workload`` can give the objective ``fom`` (a blank name, or one
    the workload declares it never produces), or None."""
    if not fom.strip():
        return "a FOM name must not be empty or blank"
    declared = workload.declared_foms()
    if declared is None or fom in declared or fom in ENGINE_FOMS:
        return None
    names = sorted(declared | ENGINE_FOMS)
    shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
    return f"workload {workload.name!r} produces no such figure of merit; it produces {shown}"


def _launcher_constants(spec: StudySpec, launcher: LauncherConfig) -> dict[str, Any]:
    """``cores_per_node`` and, on a cluster, ``cores``: the cores a run may use (the nodes'
    size times the most nodes a run asks for)."""
    per_node = launcher.cores_per_node or ((os.cpu_count() or 1) if launcher.batch
                                           else local_cores())
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
        raise StudyError(f"{spec.where('parameters')}: the study names no parameters and "
                         f"workload {workload.name!r} has no default space")
    raw = {**spec.raw, "parameters": default}
    return StudySpec.from_mapping(raw, source=str(spec.path), path=spec.path)


def point_dir_name(point: Point) -> str:
    """A short, stable directory name for a point."""
    return hashlib.sha1(point.key.encode()).hexdigest()[:12]


def describe_commands(study: Study, study_dir: Path,
                      notes: list[str] | None = None) -> list[str]:
    """One line per point: the command it would run, for ``--dry-run``; ``notes`` receives
    the note a real run gives for variables the workload sets over the user's.

    Workloads (prepared with ``dry_run=True``) build the commands in a scratch directory
    that is removed afterwards; the lines show the run directories a real run would use.
    """
    lines = []
    said: dict[str, None] = {}
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
            said.update(dict.fromkeys(overridden_env(cmd.env, ctx.env, os.environ)))
            prefix = " ".join(f"{k}={shell_quote(v)}" for k, v in sorted(env.items()))
            line = (f"[{point.label()}] {prefix + ' ' if prefix else ''}"
                    f"{' '.join(shell_quote(a) for a in cmd.argv)}")
            lines.append(line.replace(str(scratch), str(real)))
    if said and notes is not None:
        notes.append(override_note(study.workload.name, list(said)))
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


def run_dir_of(study_dir: Path, point: Point, repeat: int) -> Path:
    """The directory of one run: ``runs/<hash of the point>/r<repeat>``."""
    return study_dir / "runs" / point_dir_name(point) / f"r{repeat}"
