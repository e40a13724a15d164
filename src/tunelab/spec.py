"""Study files: YAML in, a validated :class:`StudySpec` out, with line-precise errors.

``load_study(path)`` reads the YAML with line numbers kept, validates its structure with
pydantic, then checks every parameter, derived value, constraint, environment set, the
baseline and the objective. Every problem is one :class:`~tunelab.errors.StudyError` of the
form ``study.yaml:12: parameter 'npool': 'step' must be a positive integer, got 0``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tunelab.errors import StudyError
from tunelab.expr import Expression, ExpressionError
from tunelab.limits import LIMITS
from tunelab.safeyaml import load_yaml

__all__ = [
    "ConstraintSpec",
    "ParameterSpec",
    "StudySpec",
    "load_study",
    "parse_duration",
]

Scalar = int | float | str | bool
ENV_AXIS = "env"


@dataclass(frozen=True)
class ParameterSpec:
    """One parameter and its finite list of values, in the order the study gives them."""

    name: str
    values: tuple[Scalar, ...]


@dataclass(frozen=True)
class ConstraintSpec:
    """A constraint expression, why it exists, and where it was written."""

    expr: Expression
    why: str | None = None
    origin: str = "study"  # "study", or "workload <name>" for a workload's built-in rule

    @property
    def label(self) -> str:
        """How reports name the constraint."""
        return self.expr.source


class _Workload(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str
    options: dict[str, Any] = Field(default_factory=dict)


class _Objective(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    fom: str
    direction: Literal["minimize", "maximize"] = "minimize"


StrategyName = Literal["grid", "random", "optuna", "racing", "one-at-a-time", "hierarchical"]


class _Search(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    strategy: StrategyName = "grid"
    seed: int = 0
    samples: int | None = Field(default=None, ge=1, le=LIMITS.samples)
    # run strategies and samplers (see docs/search.md)
    sampler: Literal["tpe", "gp", "cmaes"] = "tpe"
    propose: Literal["grid", "random", "optuna"] = "grid"
    min_repeats: int = Field(default=2, ge=1, le=LIMITS.repeats)
    max_repeats: int = Field(default=10, ge=1, le=LIMITS.repeats)
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    indifference: float | None = Field(default=None, ge=0, lt=1)
    max_runs: int | None = Field(default=None, ge=1, le=LIMITS.runs)
    max_wall: float | str | None = None
    per_round: int = Field(default=2, ge=1, le=1000)
    groups: list[list[str]] | None = Field(default=None, max_length=100)
    prune: bool = False


class _Constraint(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    expr: str
    why: str | None = None


class _StudyFile(BaseModel):
    """The raw structure of a study file (types only; meaning is checked afterwards)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: str | None = None
    description: str | None = None
    workload: _Workload
    parameters: dict[str, Any] = Field(default_factory=dict)
    derived: dict[str, str] = Field(default_factory=dict)
    constraints: list[str | _Constraint] = Field(default_factory=list)
    env: dict[str, dict[str, Any] | None] | None = None
    repeats: int = Field(default=3, ge=1, le=LIMITS.repeats)
    baseline: dict[str, Any] | None = None
    timeout: Any = 600  # a number or a duration string; parse_duration checks it
    objective: _Objective | None = None
    search: _Search = Field(default_factory=_Search)
    noise_threshold: float = Field(default=0.02, ge=0, lt=1)
    launcher: Any = None  # validated by tunelab.execute.launchers.config

    @field_validator("name")
    @classmethod
    def _name_is_simple(cls, v: str | None) -> str | None:
        if v is not None:
            problem = name_problem(v)
            if problem:
                raise ValueError(problem)
        return v


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a study (it names the default study directory), or None."""
    if len(name) > LIMITS.name_chars:
        return f"must be at most {LIMITS.name_chars} characters ({len(name)} given)"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        return "must be letters, digits, '-', '_' or '.' (starting with a letter or digit)"
    return None


class StudySpec(BaseModel):
    """A validated study. Build it with :func:`load_study` (or :meth:`from_mapping`)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str
    path: Path | None
    raw: dict[str, Any]
    workload: str
    workload_options: dict[str, Any]
    parameters: tuple[ParameterSpec, ...]
    derived: dict[str, Expression]
    constraints: tuple[ConstraintSpec, ...]
    env_sets: dict[str, dict[str, str]] | None
    repeats: int
    baseline: dict[str, Scalar] | None
    timeout_s: float
    objective_fom: str | None
    objective_direction: Literal["minimize", "maximize"] | None
    strategy: StrategyName
    seed: int
    samples: int | None
    search_options: dict[str, Any] = {}
    """The ``search`` section's other fields (sampler, racing and budget settings)."""
    noise_threshold: float
    lines: dict[tuple[Any, ...], int] = {}

    def where(self, *path: Any) -> str:
        """``file:line`` of the deepest known part of ``path`` (for error messages)."""
        source = str(self.path) if self.path is not None else "<study>"
        for depth in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:depth]))
            if line is not None:
                return f"{source}:{line}"
        return source

    @property
    def parameter_names(self) -> list[str]:
        """Parameter names in file order, with the ``env`` axis last when present."""
        names = [p.name for p in self.parameters]
        return [*names, ENV_AXIS] if self.env_sets is not None else names

    def identity_hash(self) -> str:
        """Hash of what makes two study files the same study (repeats, the description and
        where the runs execute — the launcher — may differ)."""
        ident = {k: v for k, v in self.raw.items()
                 if k not in ("repeats", "description", "launcher")}
        blob = json.dumps(ident, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @classmethod
    def from_mapping(
        cls, data: Any, *, source: str = "<study>", path: Path | None = None
    ) -> StudySpec:
        """Validate an already-parsed mapping (no line numbers in errors)."""
        return _build(data, _Lines(source, {}), path)


def load_study(path: str | Path) -> StudySpec:
    """Read and validate the study file at ``path``."""
    path = Path(path)
    data, lines = load_yaml(_read_study_text(path), str(path))
    return _build(data, _Lines(str(path), lines), path.resolve())


def _read_study_text(path: Path) -> str:
    """The study file's text, read no further than the size limit (a FIFO, a device or a
    huge file is refused before it is read)."""
    limit = LIMITS.study_file_bytes
    try:
        if stat.S_ISDIR(os.stat(path).st_mode):
            raise IsADirectoryError
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block, a device not end
            raise StudyError(f"{path}: not a regular file")
        with open(path, "rb") as f:
            blob = f.read(limit + 1)
    except FileNotFoundError:
        raise StudyError(f"{path}: study file not found") from None
    except IsADirectoryError:
        raise StudyError(f"{path}: is a directory, not a study file") from None
    except OSError as exc:
        raise StudyError(f"{path}: cannot read study file: {exc.strerror or exc}") from None
    if len(blob) > limit:
        raise StudyError(f"{path}: larger than {limit >> 20} MiB; a study file is a short "
                         "description, not data")
    try:
        return blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StudyError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def parse_duration(value: float | str) -> float:
    """Seconds from ``90``, ``"90s"``, ``"5m"``, ``"1h30m"``; ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"must be a duration such as 90, '90s', '5m' or '1h', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif len(value) > 64:
        raise ValueError(f"must be a duration such as 90, '90s', '5m' or '1h', got a string of "
                         f"{len(value):,} characters")
    else:
        match = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*"
                             r"(?:(\d+(?:\.\d+)?)s?)?\s*", value)
        if not value.strip() or match is None:
            raise ValueError(f"must be a duration such as 90, '90s', '5m' or '1h', got {value!r}")
        h, m, s = (float(g) if g else 0.0 for g in match.groups())
        seconds = h * 3600 + m * 60 + s
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"must be a positive duration, got {value!r}")
    return seconds


# --- line numbers ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Lines:
    source: str
    lines: Mapping[tuple[Any, ...], int]

    def error(self, path: tuple[Any, ...], message: str) -> StudyError:
        """A StudyError located at the deepest known line of ``path``."""
        for depth in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:depth]))
            if line is not None:
                return StudyError(f"{self.source}:{line}: {message}")
        return StudyError(f"{self.source}: {message}")


# --- building the spec ----------------------------------------------------------------


def _build(data: Any, lines: _Lines, path: Path | None) -> StudySpec:
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise lines.error((), f"a study file must be a mapping of fields, but it is {kind}")
    try:
        raw = _StudyFile.model_validate(data)
    except ValidationError as exc:
        raise _pydantic_error(exc, lines, data) from None

    if len(raw.parameters) > LIMITS.parameters:
        raise lines.error(("parameters",), f"more than {LIMITS.parameters} parameters")
    parameters = tuple(
        _parse_parameter(name, value, lines) for name, value in raw.parameters.items()
    )
    names = [p.name for p in parameters]
    for name in names:
        if not name.isidentifier():
            raise lines.error(("parameters", name), f"parameter {name!r} must be an identifier")
    env_sets = _parse_env(raw.env, lines)
    if env_sets is not None and ENV_AXIS in names:
        raise lines.error(
            ("parameters", ENV_AXIS),
            "parameter 'env' clashes with the environment-set axis; rename it",
        )

    derived: dict[str, Expression] = {}
    for dname, source in raw.derived.items():
        where = ("derived", dname)
        if dname in names or dname == ENV_AXIS:
            raise lines.error(where, f"derived value {dname!r} has the name of a parameter")
        try:
            derived[dname] = Expression.parse(source)
        except ExpressionError as exc:
            raise lines.error(where, f"derived value {dname!r}: {exc}") from None

    constraints = []
    for i, item in enumerate(raw.constraints):
        source, why = (item, None) if isinstance(item, str) else (item.expr, item.why)
        try:
            constraints.append(ConstraintSpec(Expression.parse(source), why))
        except ExpressionError as exc:
            raise lines.error(("constraints", i),
                              f"constraint {_shorten(source)!r}: {exc}") from None

    try:
        timeout_s = parse_duration(raw.timeout)
    except ValueError as exc:
        raise lines.error(("timeout",), f"'timeout' {exc}") from None

    search = raw.search
    needs_samples = search.strategy in ("random", "optuna") or (
        search.strategy == "racing" and search.propose == "random")
    if needs_samples and search.samples is None:
        what = "racing with propose: random" if search.strategy == "racing" else \
            f"search strategy {search.strategy!r}"
        raise lines.error(("search",), f"{what} needs 'samples: N'")
    if search.min_repeats > search.max_repeats:
        raise lines.error(("search", "min_repeats"), f"'min_repeats' ({search.min_repeats}) is "
                          f"larger than 'max_repeats' ({search.max_repeats})")
    search_options = search.model_dump(exclude={"strategy", "seed", "samples"},
                                       exclude_defaults=True)
    if search.max_wall is not None:
        try:
            search_options["max_wall"] = parse_duration(search.max_wall)
        except ValueError as exc:
            raise lines.error(("search", "max_wall"), f"'max_wall' {exc}") from None

    baseline = None
    if raw.baseline is not None:
        baseline = dict(raw.baseline)
        known = set(names) | ({ENV_AXIS} if env_sets is not None else set())
        for key in baseline:
            if key not in known:
                raise lines.error(
                    ("baseline", key),
                    f"baseline names {key!r}, which is not a parameter; "
                    f"parameters: {', '.join(sorted(known)) or 'none'}",
                )
        missing = known - set(baseline)
        if missing:
            raise lines.error(
                ("baseline",), f"baseline does not give a value for {', '.join(sorted(missing))}"
            )

    return StudySpec(
        name=raw.name or _name_from_file(path, lines),
        path=path,
        raw=data,
        workload=raw.workload.name,
        workload_options=raw.workload.options,
        parameters=parameters,
        derived=derived,
        constraints=tuple(constraints),
        env_sets=env_sets,
        repeats=raw.repeats,
        baseline=baseline,
        timeout_s=timeout_s,
        objective_fom=raw.objective.fom if raw.objective else None,
        objective_direction=raw.objective.direction if raw.objective else None,
        strategy=raw.search.strategy,
        seed=raw.search.seed,
        samples=raw.search.samples,
        search_options=search_options,
        noise_threshold=raw.noise_threshold,
        lines=dict(lines.lines),
    )


def _name_from_file(path: Path | None, lines: _Lines) -> str:
    """The study's name when the file gives none: the file's stem, if it is a valid name."""
    if path is None:
        return "study"
    problem = name_problem(path.stem)
    if problem:
        raise lines.error((), f"the study has no 'name:' and its file name {path.stem!r} "
                              f"cannot name it ({problem}); add 'name: ...' to the file")
    return path.stem


def _parse_parameter(name: str, value: Any, lines: _Lines) -> ParameterSpec:
    where = ("parameters", name)

    def fail(key: str | None, message: str) -> StudyError:
        return lines.error((*where, key) if key else where, f"parameter {name!r}: {message}")

    if isinstance(value, list):
        return ParameterSpec(name, _check_values(value, fail))
    if not isinstance(value, dict):
        raise fail(None, f"must be a list of values or a mapping with 'type', got {value!r}")
    if "values" in value:
        extra = set(value) - {"values"}
        if extra:
            raise fail(sorted(extra)[0], f"unknown key {sorted(extra)[0]!r} beside 'values'")
        if not isinstance(value["values"], list):
            raise fail("values", f"'values' must be a list, got {value['values']!r}")
        return ParameterSpec(name, _check_values(value["values"], fail))
    kind = value.get("type")
    allowed_keys = {"int": {"type", "min", "max", "step"}, "pow2": {"type", "min", "max"},
                    "bool": {"type"}}
    if kind not in allowed_keys:
        raise fail(
            "type" if "type" in value else None,
            f"'type' must be one of int, pow2, bool (or give 'values'), got {kind!r}",
        )
    extra = set(value) - allowed_keys[kind]
    if extra:
        key = sorted(extra)[0]
        raise fail(key, f"unknown key {key!r} for type {kind}; valid: "
                        f"{', '.join(sorted(allowed_keys[kind]))}")
    if kind == "bool":
        return ParameterSpec(name, (False, True))

    def integer(key: str, default: int | None = None, positive: bool = False) -> int:
        raw = value.get(key, default)
        if raw is None:
            raise fail(None, f"type {kind} needs {key!r}")
        if isinstance(raw, bool) or not isinstance(raw, int) or (positive and raw <= 0):
            qualifier = "a positive integer" if positive else "an integer"
            raise fail(key, f"{key!r} must be {qualifier}, got {raw!r}")
        return raw

    if kind == "int":
        lo, hi, step = integer("min"), integer("max"), integer("step", 1, positive=True)
        if hi < lo:
            raise fail("max", f"'max' ({hi}) is smaller than 'min' ({lo})")
        if (hi - lo) // step + 1 > LIMITS.parameter_values:
            raise fail(None, f"more than {LIMITS.parameter_values:,} values; use a larger "
                             "'step'")
        return ParameterSpec(name, tuple(range(lo, hi + 1, step)))
    lo, hi = integer("min", positive=True), integer("max", positive=True)
    if hi < lo:
        raise fail("max", f"'max' ({hi}) is smaller than 'min' ({lo})")
    values = tuple(2**k for k in range(0, hi.bit_length() + 1) if lo <= 2**k <= hi)
    if not values:
        raise fail(None, f"no power of two lies between {lo} and {hi}")
    return ParameterSpec(name, values)


def _check_values(values: list[Any], fail: Any) -> tuple[Scalar, ...]:
    if not values:
        raise fail(None, "the list of values is empty")
    if len(values) > LIMITS.parameter_values:
        raise fail(None, f"more than {LIMITS.parameter_values:,} values")
    seen: set[tuple[type, Any]] = set()
    for v in values:
        if not isinstance(v, int | float | str | bool) or (isinstance(v, float) and
                                                           not math.isfinite(v)):
            raise fail(None, f"values must be numbers, strings or booleans, got {v!r}")
        if (type(v), v) in seen:
            raise fail(None, f"value {v!r} is listed twice")
        seen.add((type(v), v))
    return tuple(values)


def _parse_env(
    env: dict[str, dict[str, Any] | None] | None, lines: _Lines
) -> dict[str, dict[str, str]] | None:
    if env is None:
        return None
    if not env:
        raise lines.error(("env",), "'env' must name at least one environment set")
    sets: dict[str, dict[str, str]] = {}
    for set_name, variables in env.items():
        sets[set_name] = {}
        for var, val in (variables or {}).items():
            where = ("env", set_name, var)
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(var)):
                raise lines.error(where, f"env set {set_name!r}: {var!r} is not a variable name")
            if isinstance(val, bool) or not isinstance(val, str | int | float):
                raise lines.error(
                    where,
                    f"env set {set_name!r}: {var} must be a string or number, got {val!r} "
                    "(quote values such as 'y', 'on' or 'yes')",
                )
            sets[set_name][str(var)] = str(val)
    return sets


def _data_path(loc: tuple[Any, ...], data: Any, missing: bool) -> tuple[Any, ...]:
    """``loc`` without pydantic's union-member tags (``str``, ``_Constraint``): the parts
    that index into the study file's data, plus the field's name when it is missing."""
    path: list[Any] = []
    node = data
    for i, part in enumerate(loc):
        indexes = (isinstance(node, dict) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node))
        if indexes:
            node = node[part]
            path.append(part)
        elif missing and i == len(loc) - 1:
            path.append(part)
    return tuple(path)


def _pydantic_error(exc: ValidationError, lines: _Lines, data: Any) -> StudyError:
    err = exc.errors()[0]
    loc = _data_path(tuple(err["loc"]), data, err["type"] == "missing")
    field = ".".join(str(p) for p in loc) or "study"
    if err["type"] == "extra_forbidden":
        parent = loc[:-1]
        model: type[BaseModel] = _StudyFile
        for part in parent:
            sub = model.model_fields.get(str(part))
            ann = getattr(sub, "annotation", None) if sub else None
            model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else model
        valid = ", ".join(model.model_fields)
        return lines.error(loc, f"unknown field {field!r}; valid fields here: {valid}")
    if err["type"] == "missing":
        return lines.error(loc[:-1], f"missing required field {field!r}")
    message = err["msg"].removeprefix("Value error, ")
    message = message[0].lower() + message[1:] if message else message
    return lines.error(loc, f"{field!r}: {message}, got {_shorten(repr(err.get('input')))}")


def _shorten(text: str, width: int = 80) -> str:
    """``text`` cut for an error message."""
    return text if len(text) <= width else text[:width - 1] + "…"
