"""The number and label formats every renderer shares, so the terminal, the HTML report and
the plots print exactly the same numbers and names."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from tunelab.space import Point

__all__ = ["DETECTABLE_SHOWN", "VERDICT_STYLES", "byte_rate_prefix", "detectable_text",
           "fmt_mean_sd", "fmt_number", "fmt_ratio", "fmt_spread", "p_text", "point_label"]

VERDICT_STYLES: dict[str, str] = {  # keyed by a Verdict's value (a Verdict is a str): the
    "better": "bold green",        # listings (status, space) import these formats, and
    "worse": "bold red",           # importing tunelab.stats costs them scipy (0.5 s)
    "indistinguishable": "yellow",
    "insufficient data": "dim",
}


def fmt_number(value: float, digits: int = 4) -> str:
    """``digits`` significant digits; an en dash for NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}g}"


SPREAD_RESOLUTION = 1e-12
"""A spread smaller than this fraction of its mean is floating-point rounding (the sd of
equal values computes as 2.7e-16, not 0), not a spread: it is printed as 0."""


def fmt_spread(sd: float, mean: float) -> str:
    """A standard deviation to two significant digits; ``0`` when it is below the
    resolution of floating point at the mean's magnitude (:data:`SPREAD_RESOLUTION`)."""
    if math.isfinite(sd) and math.isfinite(mean) and abs(sd) <= SPREAD_RESOLUTION * abs(mean):
        return "0"
    return fmt_number(sd, 2)


def fmt_mean_sd(mean: float, sd: float) -> str:
    """``mean ± sd`` (the mean alone when the sd is unknown)."""
    if sd is None or math.isnan(sd):
        return fmt_number(mean)
    return f"{fmt_number(mean)} ± {fmt_spread(sd, mean)}"


_BYTE_RATE_PREFIXES = ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s"))


def byte_rate_prefix(values: Iterable[float]) -> tuple[float, str]:
    """The divisor and decimal unit that put the largest of ``values`` (bytes per second)
    at 1 or more: ``(1e9, "GB/s")``, ``(1e6, "MB/s")``, ``(1e3, "kB/s")`` or
    ``(1.0, "B/s")``; NaN and infinities are ignored."""
    top = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
    return next(((d, u) for d, u in _BYTE_RATE_PREFIXES if top >= d), (1.0, "B/s"))


def fmt_ratio(value: float) -> str:
    """A ratio with three decimals (so an interval's side reads 1.004, not 1), in
    scientific notation from 10,000 on; dash for NaN."""
    if value is None or math.isnan(value):
        return "–"
    return f"{value:.3f}" if abs(value) < 1e4 else f"{value:.3g}"


def point_label(params: dict[str, Any]) -> str:
    """``{"np": 4, "env": "am"}`` -> ``np=4 env=am``, ``{}`` -> ``(default)``: the point's
    own key order, by the points' one rule (:meth:`tunelab.space.Point.label_of`)."""
    return Point.label_of(params)


def p_text(p: float) -> str:
    """A p-value for a table: three decimals, ``<0.001``, or a dash for NaN."""
    if math.isnan(p):
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


DETECTABLE_SHOWN = 10.0
"""Detectable changes above this (1000 %) are shown as ``>1000%``: with two runs a side and
Welch's few degrees of freedom the figure runs to 10^19 %, which says no more than that."""


def detectable_text(change: float) -> str:
    """A minimum detectable change as a percentage (empty: unknown; ∞: none; ``>1000%``
    beyond :data:`DETECTABLE_SHOWN`)."""
    if math.isnan(change):
        return ""
    if math.isinf(change):
        return "∞"
    return f">{DETECTABLE_SHOWN:.0%}" if change > DETECTABLE_SHOWN else f"{change:.1%}"
