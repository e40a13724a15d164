"""The raw structure of a study file: one pydantic model per section (types only).

:class:`StudyFile` validates the shape of the parsed YAML (which fields, which types, the
bounds of :data:`~tunelab.limits.LIMITS`); what the values mean is checked afterwards, by
:mod:`tunelab.spec.study`. :func:`pydantic_error` turns pydantic's first complaint into one
line-precise :class:`~tunelab.errors.StudyError`.

The section models keep private names (``_Search``, ...); pydantic quotes them in its
messages (``input should be a valid dictionary or instance of _Search``), so
:func:`pydantic_error` says what shape the section has instead.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tunelab.errors import StudyError
from tunelab.limits import LIMITS
from tunelab.spec.lines import StudyLines, shorten

__all__ = ["SEED_MAX", "StrategyName", "StudyFile", "name_problem", "pydantic_error"]

SEED_MAX = 2**32 - 1
"""The largest search seed: numpy's and optuna's generators take 32-bit seeds."""


class _Workload(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str
    options: dict[str, Any] = Field(default_factory=dict)


class _Objective(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    fom: str
    direction: Literal["minimize", "maximize"] = "minimize"


StrategyName = Literal["grid", "random", "optuna", "auto", "racing", "one-at-a-time",
                       "hierarchical"]


class _Search(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    strategy: StrategyName = "grid"
    seed: int = Field(default=0, ge=0, le=SEED_MAX)
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


class StudyFile(BaseModel):
    """The raw structure of a study file (types only; meaning is checked afterwards)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: str | None = None
    description: str | None = None
    workload: _Workload
    parameters: dict[str, Any] = Field(default_factory=dict)
    derived: dict[str, str] = Field(default_factory=dict)
    constraints: list[str | _Constraint] = Field(default_factory=list)
    env: dict[str, dict[str, Any] | None] | None = None
    repeats: Any = 3  # a count, "auto" or {min, max}: tunelab.spec.values.parse_repeats
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


def pydantic_error(exc: ValidationError, lines: StudyLines, data: Any) -> StudyError:
    """The first problem :class:`StudyFile` found in ``data``, at its line."""
    err = _first_error(exc.errors())
    loc = _data_path(tuple(err["loc"]), data, err["type"] == "missing")
    field = ".".join(str(p) for p in loc) or "study"
    if err["type"] == "extra_forbidden":
        valid = ", ".join(_model_of(loc[:-1]).model_fields)
        return lines.error(loc, f"unknown field {field!r}; valid fields here: {valid}")
    if err["type"] == "missing":
        return lines.error(loc[:-1], f"missing required field {field!r}")
    got = shorten(repr(err.get("input")))
    if err["type"] == "model_type":  # a section given as a scalar or a list
        fields = _model_of(loc).model_fields
        return lines.error(loc, f"{field!r} must be a mapping with the fields "
                                f"{', '.join(fields)}, got {got}")
    if err["loc"] and err["loc"][-1] == "[key]":  # a key YAML read as a number or boolean
        owner = ".".join(str(p) for p in loc[:-1]) or "study"
        return lines.error(loc, f"{owner!r}: the key {got} must be a string (YAML reads an "
                                "unquoted 1, 1.5, yes, on or null as a number, boolean or null; "
                                "quote it)")
    message = err["msg"].removeprefix("Value error, ")
    message = message[0].lower() + message[1:] if message else message
    return lines.error(loc, f"{field!r}: {message}, got {got}")


def _first_error(errors: list[Any]) -> Any:
    """The error to report: the first, except that a mapping given where a string or a
    section may stand (``constraints: [{...}]``) is judged as the section."""
    first = errors[0]
    loc = tuple(first["loc"])
    if isinstance(first.get("input"), dict) and loc and loc[-1] == "str":  # the str branch
        for other in errors[1:]:
            there = tuple(other["loc"])
            if there[:len(loc) - 1] == loc[:-1] and len(there) >= len(loc) \
                    and there[len(loc) - 1] != "str":
                return other
    return first


def _model_of(loc: tuple[Any, ...]) -> type[BaseModel]:
    """The section model at ``loc`` (the study file's own model when none matches)."""
    model: type[BaseModel] = StudyFile
    for part in loc:
        sub = model.model_fields.get(str(part))
        ann = getattr(sub, "annotation", None) if sub else None
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            for arg in getattr(ann, "__args__", ()):  # Optional[...] and unions
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    model = arg
    return model
