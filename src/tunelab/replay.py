"""Replay: a finished study as a simulated workload, so any strategy runs offline in seconds.

``tunelab replay DIR -o replay.yaml`` writes a study file whose workload, ``replay``, holds
every recorded run of the study's objective, point by point (a failed run as ``null``), and
the original study's parameters, derived values, constraints (the original workload's
rules among them, with the constants they read, such as ``nk`` and the recording machine's
``cores``) and env sets — so the replayed space is the recorded one. Repeat ``r`` of a point
answers with one of the point's recorded runs, drawn with a generator seeded by (seed, point,
r): the same seed gives the same answers, another seed another draw. Optional drift makes
later runs worse (``per_round``: by repeat; ``per_run``: by the order of runs), to test what
a slowly loaded machine does to verdicts.

:class:`Landscape` is the same data in memory; :func:`replay_strategy` drives a
:class:`~tunelab.search.RunStrategy` against it without starting any process (what
``benchmarks/search_efficiency.py`` does 200 times per strategy).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from tunelab.errors import ParseError, StoreError, TunelabError
from tunelab.limits import LIMITS
from tunelab.search.base import RunStrategy
from tunelab.space import Point, Space
from tunelab.workload import (
    WALL_FOM,
    Command,
    Objective,
    RunContext,
    Workload,
    WorkloadOptions,
    fom_name_problem,
    last_json_object,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "MAX_RECORDED_RUNS",
    "Drift",
    "Landscape",
    "ReplayOptions",
    "ReplayWorkload",
    "Replayed",
    "landscape_from_study",
    "load_landscape",
    "replay_strategy",
    "write_replay_study",
]

MAX_RECORDED_RUNS = 1_000_000
"""Most recorded runs a replay file may hold."""

REPLAYED_WALL_S = "replayed_wall_s"
"""The figure a replay of a study tuned on ``wall_s`` answers with (tunelab measures the
replay's own ``wall_s``)."""

_PRINT = "import sys; print(sys.argv[1]); sys.exit(int(sys.argv[2]))"


class Drift(BaseModel):
    """Runs get worse as a study goes on: by ``per_round`` per repeat index and by
    ``per_run`` per run made (compounded; 0.01 = 1 % worse each time)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    per_round: float = Field(0.0, ge=0.0, le=1.0)
    per_run: float = Field(0.0, ge=0.0, le=1.0)

    def factor(self, repeat: int, index: int) -> float:
        """How much worse (>= 1) the ``index``-th run, repeat ``repeat``, is."""
        return (1.0 + self.per_round) ** repeat * (1.0 + self.per_run) ** index


class _RecordedPoint(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    point: dict[str, int | float | str | bool]
    runs: list[float | None] = Field(min_length=1)

    @field_validator("runs")
    @classmethod
    def _computable(cls, runs: list[float | None]) -> list[float | None]:
        """Only values a run can record: a figure tunelab computes with, or null (failed);
        ``tunelab replay`` never writes NaN, an infinity or 1e308 (such runs failed)."""
        from tunelab.execute.guards import split_finite

        for value in runs:
            if value is not None and split_finite({"run": value})[1] is not None:
                top = LIMITS.fom_magnitude
                raise ValueError(f"a recorded run is a figure of merit tunelab can compute "
                                 f"with (0, or a magnitude from {1 / top:g} to {top:g}) or "
                                 f"null for a failed run, got {value}")
        return runs


class ReplayOptions(WorkloadOptions):
    """Options of the ``replay`` workload (written by ``tunelab replay``)."""

    fom: str
    direction: Literal["minimize", "maximize"] = "minimize"
    seed: int = 0
    drift: Drift = Field(default_factory=lambda: Drift(per_round=0.0, per_run=0.0))
    constants: dict[str, int | float | str | bool] = Field(default_factory=dict)
    source: dict[str, Any] = Field(default_factory=dict)
    points: list[_RecordedPoint] = Field(min_length=1, max_length=MAX_RECORDED_RUNS)

    @field_validator("fom")
    @classmethod
    def _not_wall_s(cls, value: str) -> str:
        if value == WALL_FOM:
            raise ValueError("'wall_s' is what tunelab measures of the replay itself; name the "
                             f"recorded figure differently, e.g. {REPLAYED_WALL_S!r}")
        problem = fom_name_problem(value)
        if problem:
            raise ValueError(problem)
        return value


def _draw(runs: tuple[float | None, ...] | None, seed: int, point: Point,
          repeat: int) -> float | None:
    """One of ``runs``, chosen by a hash of (seed, point, repeat): stable across processes."""
    if not runs:
        return None
    digest = hashlib.blake2b(f"{seed}\0{point.key}\0{repeat}".encode(), digest_size=8).digest()
    return runs[int.from_bytes(digest) % len(runs)]


@dataclass(frozen=True)
class Landscape:
    """Every recorded run of a study's objective, per point (None: a failed run)."""

    name: str
    fom: str
    direction: str
    runs: Mapping[Point, tuple[float | None, ...]]
    space: Space
    baseline: Point | None = None
    env_sets: dict[str, dict[str, str]] | None = None
    noise_threshold: float = 0.02
    repeats: int = 3
    source: Mapping[str, Any] = field(default_factory=dict)

    def draw(self, point: Point, repeat: int, seed: int) -> float | None:
        """The recorded run that repeat ``repeat`` of ``point`` answers with under ``seed``
        (None for a failed run, or a point that was never recorded)."""
        return _draw(self.runs.get(point), seed, point, repeat)

    def means(self) -> dict[Point, float]:
        """Mean of each point's successful recorded runs — the true mean of what a replayed
        run of it answers (points without a successful run are left out)."""
        return {point: math.fsum(ok) / len(ok) for point, runs in self.runs.items()
                if (ok := [v for v in runs if v is not None])}

    def true_best(self) -> tuple[Point, float]:
        """The point with the best true mean, and that mean."""
        means = self.means()
        if not means:
            raise TunelabError(f"landscape {self.name!r} has no successful run")
        sign = 1.0 if self.direction == "minimize" else -1.0
        point = min(means, key=lambda p: (sign * means[p], p.key))
        return point, means[point]

    def within(self, point: Point | None, tolerance: float) -> bool:
        """Whether ``point``'s true mean is within ``tolerance`` (0.05 = 5 %) of the best."""
        if point is None:
            return False
        means = self.means()
        if point not in means:
            return False
        _, best = self.true_best()
        value = means[point]
        if self.direction == "minimize":
            return value <= best * (1 + tolerance)
        return value >= best / (1 + tolerance)

    @property
    def size(self) -> int:
        """Number of recorded points."""
        return len(self.runs)


@dataclass(frozen=True)
class Replayed:
    """What one replay of a strategy did: its choice and the runs it spent."""

    chosen: Point | None
    runs: int
    points: int


def replay_strategy(strategy: RunStrategy, landscape: Landscape, seed: int,
                    drift: Drift | None = None, batch: int = 64) -> Replayed:
    """Run ``strategy`` to its end against ``landscape`` (answers drawn with ``seed``)."""
    drift = drift or Drift(per_round=0.0, per_run=0.0)
    sign = 1.0 if landscape.direction == "minimize" else -1.0
    made = 0
    points: set[Point] = set()
    while not strategy.done:
        requests = strategy.ask_runs(batch)
        if not requests:
            if strategy.done:
                break
            raise TunelabError(f"strategy {strategy.name!r} asked for nothing and is not done")
        for request in requests:
            value = landscape.draw(request.point, request.repeat, seed)
            if value is not None:
                value *= drift.factor(request.repeat, made) ** sign
            strategy.tell_run(request, value)
            made += 1
            points.add(request.point)
    return Replayed(strategy.result(), made, len(points))


# ----------------------------------------------------------------------------------------
# the workload


class ReplayWorkload(Workload):
    """Answers each run with one recorded run of a finished study (see the module doc)."""

    name: ClassVar[str] = "replay"
    description: ClassVar[str] = "a finished study replayed: each run answers with a recorded one"
    Options: ClassVar[type[WorkloadOptions]] = ReplayOptions
    measures_machine: ClassVar[bool] = False

    def __init__(self, options: WorkloadOptions, study_file: Path | None = None) -> None:
        super().__init__(options, study_file)
        assert isinstance(options, ReplayOptions)
        self.opts = options
        self._runs = {Point(p.point): tuple(p.runs) for p in options.points}
        self._names = sorted(options.points[0].point)
        self._made = 0

    @property
    def objective(self) -> Objective:
        return Objective(self.opts.fom, self.opts.direction)

    def declared_foms(self) -> frozenset[str]:
        """The one recorded figure every run answers with."""
        return frozenset({self.opts.fom})

    def constants(self) -> dict[str, Any]:
        return dict(self.opts.constants)

    def command(self, ctx: RunContext) -> Command:
        point = Point({k: ctx.values[k] for k in self._names if k in ctx.values})
        value = _draw(self._runs.get(point), self.opts.seed, point, ctx.repeat)
        if value is not None:
            sign = 1.0 if self.opts.direction == "minimize" else -1.0
            value *= self.opts.drift.factor(ctx.repeat, self._made) ** sign
        self._made += 1
        line = json.dumps({"replay": self.opts.fom, "value": value})
        return Command((sys.executable, "-c", _PRINT, line, "0" if value is not None else "1"))

    def parse(self, stdout: str, stderr: str, run_dir: Path) -> dict[str, float]:
        record = last_json_object(stdout, lambda r: "replay" in r)
        if record is None:
            raise ParseError("no replay line in the output")
        value = record.get("value")
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ParseError("the recorded run failed")
        return {self.opts.fom: float(value)}


# ----------------------------------------------------------------------------------------
# files


def landscape_from_study(directory: str | Path) -> dict[str, Any]:
    """The replay study (a mapping, ready for YAML) of the finished study in ``directory``."""
    from tunelab.execute.study import prepare_study
    from tunelab.spec import StudySpec
    from tunelab.store import open_store

    directory = Path(directory)
    with open_store(directory) as store:
        raw = store.spec()
        runs = store.runs_frame()
        fom, direction = json.loads(store.get_meta("objective") or '["wall_s", "minimize"]')
        info = store.sysinfo()
        study_file = store.get_meta("study_file") or None
        created = store.get_meta("created_at") or ""
    if not len(runs):
        raise StoreError(f"{directory}: the study has no runs to replay")
    path = Path(study_file) if study_file else None
    try:
        study = prepare_study(StudySpec.from_mapping(raw, source=str(path or directory),
                                                     path=path))
    except TunelabError as exc:
        raise TunelabError(f"{directory}: cannot rebuild the study to replay it: {exc}") from exc
    column = f"fom.{fom}"
    if fom == "wall_s":
        fom = REPLAYED_WALL_S
    points: list[dict[str, Any]] = []
    for key, group in runs.sort_values(["point_id", "repeat"]).groupby("point", sort=False):
        values: list[float | None] = []
        for status, value in zip(group["status"], group.get(column, [math.nan] * len(group)),
                                 strict=True):
            ok = status == "ok" and value is not None and math.isfinite(float(value))
            values.append(float(value) if ok else None)
        points.append({"point": json.loads(str(key)), "runs": values})
    constants = {k: v for k, v in study.space.constants.items()
                 if isinstance(v, int | float | str | bool)}
    if isinstance(info.get("logical_cores"), int):
        constants["cores"] = info["logical_cores"]
    rules = [{"expr": c.label, "why": c.why or c.origin} for c in study.space.constraints
             if c.origin != "study"]
    out: dict[str, Any] = {
        "name": f"{raw.get('name') or study.spec.name}-replay",
        "description": f"replay of study {study.spec.name!r}: each run answers with one of "
                       "its recorded runs",
        "workload": {"name": "replay", "options": {
            "fom": fom, "direction": direction, "seed": 0,
            "constants": constants,
            "source": {"study": study.spec.name, "workload": study.spec.workload,
                       "created_at": created, "host": info.get("host", ""),
                       "cpu_model": info.get("cpu_model", ""),
                       "logical_cores": info.get("logical_cores"),
                       "loadavg_at_start": info.get("loadavg"),
                       "runs": len(runs), "disturbed_runs": _disturbed(runs)},
            "points": points,
        }},
    }
    for key in ("parameters", "derived"):
        if raw.get(key):
            out[key] = raw[key]
    constraints = [*rules, *raw.get("constraints", [])]
    if constraints:
        out["constraints"] = constraints
    for key in ("env", "repeats", "baseline"):
        if raw.get(key) is not None:
            out[key] = raw[key]
    out["timeout"] = 60
    out["objective"] = {"fom": fom, "direction": direction}
    out["noise_threshold"] = study.spec.noise_threshold
    return out


def _disturbed(runs: pd.DataFrame) -> int:
    """How many of the recorded runs the noise watch flagged disturbed."""
    from tunelab.stats import DISTURBED_COLUMN

    if DISTURBED_COLUMN not in runs:
        return 0
    return int(runs[DISTURBED_COLUMN].fillna(0).astype(bool).sum())


def write_replay_study(directory: str | Path, output: str | Path) -> dict[str, Any]:
    """Write the replay study of ``directory`` to ``output`` (YAML); returns its ``source``
    (where and how the runs were recorded: ``runs``, ``disturbed_runs`` …)."""
    data = landscape_from_study(directory)
    output = Path(output)
    try:
        output.write_text(_dump(data))
    except OSError as exc:
        raise TunelabError(f"cannot write {output}: {exc.strerror}") from exc
    source: dict[str, Any] = data["workload"]["options"]["source"]
    return source


def _dump(data: dict[str, Any]) -> str:
    """YAML with one line per recorded point (long lists stay readable in a diff)."""

    class _Dumper(yaml.SafeDumper):
        pass

    def flow_map(dumper: yaml.SafeDumper, value: dict[str, Any]) -> yaml.Node:
        flow = all(not isinstance(v, dict | list) for v in value.values())
        return dumper.represent_mapping("tag:yaml.org,2002:map", value, flow_style=flow)

    def flow_list(dumper: yaml.SafeDumper, value: list[Any]) -> yaml.Node:
        flow = all(not isinstance(v, dict | list) for v in value)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flow)

    _Dumper.add_representer(dict, flow_map)
    _Dumper.add_representer(list, flow_list)
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=100,
                     default_flow_style=False, allow_unicode=True)


def load_landscape(path: str | Path) -> Landscape:
    """The landscape held by a replay study file (as ``tunelab replay`` writes it)."""
    from tunelab.spec import load_study

    spec = load_study(path)
    if spec.workload != "replay":
        raise TunelabError(f"{path}: workload is {spec.workload!r}, not a replay study "
                           "(make one with: tunelab replay DIR -o FILE)")
    try:
        options = ReplayOptions.model_validate(spec.workload_options)
    except ValueError as exc:
        first = str(exc).splitlines()
        raise TunelabError(f"{path}: replay options: {' '.join(first[:3])}") from None
    runs = {Point(p.point): tuple(p.runs) for p in options.points}
    if sum(len(r) for r in runs.values()) > MAX_RECORDED_RUNS:
        raise TunelabError(f"{path}: more than {MAX_RECORDED_RUNS} recorded runs")
    space = Space.from_spec(spec, [], options.constants)
    return Landscape(
        name=spec.name, fom=options.fom, direction=options.direction, runs=runs, space=space,
        baseline=Point(spec.baseline) if spec.baseline is not None else None,
        env_sets=spec.env_sets, noise_threshold=spec.noise_threshold, repeats=spec.repeats,
        source=options.source,
    )

