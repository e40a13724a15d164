"""The fraction of bound the runs measured themselves: the figure of merit ``bound_fraction``.

A workload whose runs time their own limit while they run (``leopard``: ``torch.matmul`` in
the run's precision with its threads) records its rate over that limit as ``bound_fraction``
(and the limit as ``gemm_flops_per_s``). :func:`inrun_bounds` is the data step: per point, the
mean over its ok runs and the lowest and highest run. The renderers (:func:`inrun_best_lines`,
:func:`inrun_point_lines`, :func:`inrun_cell`) label it as measured in the run, so that it is
never taken for a fraction of a ``tunelab bounds`` profile (:mod:`tunelab.report.headroom`),
which ``best``, ``compare`` and the report show beside it when one is stored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tunelab.report.formats import point_label

if TYPE_CHECKING:
    import pandas as pd

    from tunelab.stats import BestResult

__all__ = ["FOM", "InRunBound", "inrun_best_lines", "inrun_bounds", "inrun_cell", "inrun_doc",
           "inrun_point_lines"]

FOM = "bound_fraction"
"""The figure of merit a run records for its rate over the limit it measured itself."""
_LIMIT_FOM = "gemm_flops_per_s"
_WHAT = (f"measured in the run: each run's rate / the limit it timed itself while it ran "
         f"(figure of merit {FOM})")


@dataclass(frozen=True)
class InRunBound:
    """One point's in-run fractions of bound: the mean over its ``n`` ok runs that recorded
    one, the lowest and highest, and the mean limit the runs timed (``limit``, FLOP/s; NaN
    when they do not record it)."""

    point: str
    params: Mapping[str, Any]
    mean: float
    low: float
    high: float
    n: int
    limit: float = math.nan

    @property
    def spread(self) -> str:
        """``0.40-0.46 over 3 runs`` (``1 run`` alone)."""
        if self.n == 1:
            return "1 run"
        return f"{self.low:.2f}-{self.high:.2f} over {self.n} runs"


def inrun_bounds(runs: pd.DataFrame) -> dict[str, InRunBound]:
    """Every point whose ok runs recorded a finite ``bound_fraction``, keyed by the point's
    key; empty when no run did."""
    from tunelab.stats import StatsError
    from tunelab.stats.summaries import point_groups, point_params

    column, limit = f"fom.{FOM}", f"fom.{_LIMIT_FOM}"
    if not len(runs) or column not in runs.columns or "status" not in runs.columns:
        return {}
    limits = point_groups(runs, limit) if limit in runs.columns else {}
    found: dict[str, InRunBound] = {}
    for key, group in point_groups(runs, column).items():
        fractions = group.values
        if not fractions.size:
            continue
        try:
            params = point_params(key)
        except StatsError:
            continue
        timed = limits[key].values if key in limits else fractions[:0]
        found[key] = InRunBound(key, params, float(fractions.mean()), float(fractions.min()),
                                float(fractions.max()), int(fractions.size),
                                float(timed.mean()) if timed.size else math.nan)
    return found


def inrun_cell(item: InRunBound | None) -> str:
    """``compare``'s cell: ``0.43 (0.40-0.46)``, the mean alone for one run."""
    if item is None:
        return ""
    if item.n == 1:
        return f"{item.mean:.2f}"
    return f"{item.mean:.2f} ({item.low:.2f}-{item.high:.2f})"


def _limit_text(item: InRunBound) -> str:
    if not math.isfinite(item.limit):
        return ""
    from tunelab.report.bounds import rate_text

    return f"; the limit its runs timed: {rate_text(item.limit, 'FLOP/s')} on average"


def inrun_best_lines(data: Mapping[str, InRunBound], best: BestResult | None) -> list[str]:
    """The best point's in-run fraction of bound in a sentence; nothing when its runs
    recorded none."""
    if best is None:
        return []
    item = data.get(best.best.point)
    if item is None:
        return []
    return [f"In-run fraction of bound: the best point ({point_label(dict(item.params))}) ran "
            f"at {item.mean:.2f} of its bound ({item.spread}{_limit_text(item)}); {_WHAT}."]


def inrun_point_lines(data: Mapping[str, InRunBound]) -> list[str]:
    """One line for every point, highest mean first, for the report."""
    if not data:
        return []
    items = sorted(data.values(), key=lambda i: -i.mean)
    shown = "; ".join(f"{point_label(dict(i.params))}: {i.mean:.2f} ({i.spread})"
                      for i in items)
    return [f"In-run fraction of bound by point (mean, lowest-highest run; {_WHAT}): {shown}."]


def inrun_doc(data: Mapping[str, InRunBound]) -> dict[str, Any]:
    """The ``inrun_bound`` key of a JSON document."""
    return {"fom": FOM, "measured": "in the run",
            "points": [{"point": dict(i.params), "label": point_label(dict(i.params)),
                        "fraction": i.mean, "fraction_min": i.low, "fraction_max": i.high,
                        "n": i.n, "limit": i.limit if math.isfinite(i.limit) else None,
                        "limit_unit": "FLOP/s" if math.isfinite(i.limit) else None}
                       for i in data.values()]}
