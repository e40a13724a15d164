"""The values a study is made of, and their checks: parameters, environment sets, durations.

:class:`ParameterSpec` (a parameter's finite list of values) and :class:`ConstraintSpec` are
parts of a :class:`~tunelab.spec.StudySpec`; :func:`parse_parameter` and :func:`parse_env`
turn a study file's ``parameters`` entries and ``env`` section into them, raising a
line-precise :class:`~tunelab.errors.StudyError`; :func:`parse_duration` reads ``timeout``
and ``max_wall``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from tunelab.errors import StudyError
from tunelab.expr import Expression
from tunelab.limits import LIMITS
from tunelab.spec.lines import StudyLines

__all__ = [
    "ENV_AXIS",
    "ConstraintSpec",
    "ParameterSpec",
    "Scalar",
    "parse_duration",
    "parse_env",
    "parse_parameter",
    "parse_repeats",
    "value_text",
]

AUTO_MIN_REPEATS = 3
"""``repeats: auto`` starts with this many rounds of every point (a paired verdict needs 3)."""
AUTO_MAX_REPEATS = 10
"""… and stops adding rounds at this many (the budget), unless ``{max: N}`` says otherwise."""

Scalar = int | float | str | bool
ENV_AXIS = "env"


def value_text(value: Any) -> str:
    """How a label writes a parameter value (``np=4 mode=fast``): as it is, except a string
    that would read as another value — a number (``'0'``, ``'1e3'``), ``'True'``,
    ``'False'``, ``'None'`` — or as none (empty, or holding whitespace), which is quoted,
    so that ``x=0`` and ``x='0'`` tell an integer and a string apart."""
    if isinstance(value, str) and _reads_as_another(value):
        return repr(value)
    return str(value)


def _reads_as_another(text: str) -> bool:
    if not text or any(c.isspace() for c in text) or text in ("True", "False", "None"):
        return True
    try:
        float(text)  # '0', '-1.5', '1e3', '1_000', 'nan', 'inf'
    except ValueError:
        return False
    return True


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


def parse_repeats(value: Any, lines: StudyLines) -> tuple[int, tuple[int, int] | None]:
    """The study file's ``repeats``: a count (``5``), ``auto`` or ``{min: 3, max: 20}`` (as
    many rounds as the comparisons with the baseline need, within those bounds). Returns
    (the rounds planned at most, (min, max) when automatic else None)."""
    top = LIMITS.repeats
    usage = (f"must be a whole number from 1 to {top:,}, 'auto', or {{min: M, max: N}} "
             f"with {AUTO_MIN_REPEATS} <= M <= N <= {top:,}")
    if value == "auto":
        return AUTO_MAX_REPEATS, (AUTO_MIN_REPEATS, AUTO_MAX_REPEATS)
    if isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= top:
            raise lines.error(("repeats",), f"'repeats': {usage}; got {value}")
        return value, None
    if isinstance(value, dict):
        unknown = sorted(str(k) for k in value if k not in ("min", "max"))
        if unknown:
            raise lines.error(("repeats", unknown[0]),
                              f"'repeats': unknown field {unknown[0]!r}; it takes min and max")
        low = value.get("min", AUTO_MIN_REPEATS)
        high = value.get("max", max(AUTO_MAX_REPEATS, low) if isinstance(low, int) else 0)
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high))
        if ok and AUTO_MIN_REPEATS <= low <= high <= top:
            return high, (low, high)
        raise lines.error(("repeats",),
                          f"'repeats': {usage}; got {{min: {low!r}, max: {high!r}}}")
    raise lines.error(("repeats",), f"'repeats': {usage}; got {value!r}")


def parse_duration(value: float | str) -> float:
    """Seconds from ``90``, ``"90s"``, ``"5m"``, ``"1h30m"``, at most ``LIMITS.duration_s``
    however it is written (``1.0e+300``, ``"99999999999999999999h"``, ``.inf``); ValueError
    otherwise."""
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
    if not 0 < seconds <= LIMITS.duration_s:  # NaN and the infinities fail it too
        raise ValueError(f"must be a positive duration of at most {LIMITS.duration_s:,} s "
                         f"({LIMITS.duration_s // 86400} days), got {value!r}")
    return seconds


def parse_parameter(name: str, value: Any, lines: StudyLines) -> ParameterSpec:
    """The parameter ``name`` of the ``parameters`` section: a list of values, ``values:``,
    or a ``type`` (int, pow2, bool) with its range."""
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


def parse_env(
    env: dict[str, dict[str, Any] | None] | None, lines: StudyLines
) -> dict[str, dict[str, str]] | None:
    """The ``env`` section's environment sets (values as strings), or None without one."""
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
