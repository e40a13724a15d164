"""The number and label formats every renderer shares, so the terminal, the HTML report and
the plots print exactly the same numbers and names."""

from __future__ import annotations

import math
from typing import Any

from tunelab.stats import Verdict

__all__ = ["VERDICT_STYLES", "fmt_number", "fmt_ratio", "p_text", "point_label"]

VERDICT_STYLES = {
    Verdict.BETTER: "bold green",
    Verdict.WORSE: "bold red",
    Verdict.INDISTINGUISHABLE: "yellow",
    Verdict.INSUFFICIENT: "dim",
}


def fmt_number(value: float, digits: int = 4) -> str:
    """``digits`` significant digits; an en dash for NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}g}"


def fmt_ratio(value: float) -> str:
    """A ratio with three decimals (so an interval's side reads 1.004, not 1); dash for NaN."""
    if value is None or math.isnan(value):
        return "–"
    return f"{value:.3f}"


def point_label(params: dict[str, Any]) -> str:
    """``{"np": 4, "env": "am"}`` -> ``np=4 env=am`` (the point's own key order)."""
    if not params:
        return "(default)"
    return " ".join(f"{k}={v}" for k, v in params.items())


def p_text(p: float) -> str:
    """A p-value for a table: three decimals, ``<0.001``, or a dash for NaN."""
    if math.isnan(p):
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3f}"
