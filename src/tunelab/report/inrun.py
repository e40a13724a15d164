"""The fraction of bound the runs measured themselves: the figure of merit ``bound_fraction``.

A workload whose runs time their own limit while they run (``leopard``: ``torch.matmul`` in
the run's precision with its threads) records its rate over that limit as ``bound_fraction``
(and the limit as ``gemm_flops_per_s``). :func:`inrun_bounds` is the data step: per point, the
mean over its ok runs and the lowest and highest run. The renderers (:func:`inrun_best_lines`,
:func:`inrun_point_lines`, :func:`inrun_cell`) label it as measured in the run, so that it is
never taken for a fraction of a ``tunelab bounds`` profile (:mod:`tunelab.report.headroom`),
which ``best``, ``compare`` and the report show beside it when one is stored.

A fraction above 1 is no fraction of a bound: the run reached more than the limit it timed,
so either others' load slowed the timing of that limit more than the run's own work (on a
shared machine others took the cores while the GEMM ran and not while the steps did, or the
same load slowed a GEMM of all threads more than the steps), or the model's own kernels beat
the GEMM (oneDNN's convolutions on a CPU: ResNet-18's training step ran at 152 GFLOP/s beside
torch.matmul's 126-134 in one process on the 2-core EPYC). Such a run is **left out** of its
point's mean, lowest and highest, and said: counted, with its values, in every line and cell
that shows the point (``1 run above 1 left out (2.40): it outran the limit it timed (others'
load slowed that timing more than the work, or the model's kernels beat the GEMM): no
bound``); a point whose every run is above 1 shows no fraction. Averaged
in, a 2.40 would have made a point of 0.45 and 0.40 "run at 1.08 of its bound".
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
_ABOVE = ("the run outran the limit it timed (others' load slowed that timing more than its "
          "work, or its kernels beat the GEMM): no bound")


@dataclass(frozen=True)
class InRunBound:
    """One point's in-run fractions of bound: the mean over its ``n`` ok runs that recorded
    one at most 1, the lowest and highest, and the mean limit those runs timed (``limit``,
    FLOP/s; NaN when they do not record it); ``above``: the fractions above 1 left out (NaN
    mean, lowest and highest where every run's is)."""

    point: str
    params: Mapping[str, Any]
    mean: float
    low: float
    high: float
    n: int
    limit: float = math.nan
    above: tuple[float, ...] = ()

    @property
    def spread(self) -> str:
        """``0.40-0.46 over 3 runs`` (``1 run`` alone), and the runs left out."""
        kept = ("" if self.n == 0 else "1 run" if self.n == 1
                else f"{self.low:.2f}-{self.high:.2f} over {self.n} runs")
        return "; ".join(t for t in (kept, self.left_out) if t)

    @property
    def left_out(self) -> str:
        """``1 run above 1 left out (1.45): its limit was timed …``; empty when none."""
        if not self.above:
            return ""
        k = len(self.above)
        values = ", ".join(f"{f:.2f}" for f in sorted(self.above))
        return (f"{k} run{'s' if k > 1 else ''} above 1 left out ({values}): "
                f"{'it' if k == 1 else 'they'} outran the limit {'it' if k == 1 else 'they'} "
                f"timed (others' load slowed that timing more than the work, or the model's "
                f"kernels beat the GEMM): no bound")

    @property
    def mean_text(self) -> str:
        """``0.43``, or ``none`` where every run was above 1."""
        return f"{self.mean:.2f}" if self.n else "none"


def inrun_bounds(runs: pd.DataFrame) -> dict[str, InRunBound]:
    """Every point whose ok runs recorded a finite ``bound_fraction``, keyed by the point's
    key; the runs above 1 left out of its figures (:attr:`InRunBound.above`); empty when no
    run recorded one."""
    from tunelab.stats import StatsError
    from tunelab.stats.summaries import point_groups, point_params

    column, limit = f"fom.{FOM}", f"fom.{_LIMIT_FOM}"
    if not len(runs) or column not in runs.columns or "status" not in runs.columns:
        return {}
    # the limits of the runs whose fraction held (at most 1), as the figures are
    limits = (point_groups(runs[~(runs[column].astype(float) > 1)], limit)
              if limit in runs.columns else {})
    found: dict[str, InRunBound] = {}
    for key, group in point_groups(runs, column).items():
        if not group.values.size:
            continue
        try:
            params = point_params(key)
        except StatsError:
            continue
        fractions = group.values[group.values <= 1]
        above = tuple(float(f) for f in group.values[group.values > 1])
        timed = limits[key].values if key in limits else fractions[:0]
        if not fractions.size:
            found[key] = InRunBound(key, params, math.nan, math.nan, math.nan, 0,
                                    above=above)
            continue
        found[key] = InRunBound(key, params, float(fractions.mean()), float(fractions.min()),
                                float(fractions.max()), int(fractions.size),
                                float(timed.mean()) if timed.size else math.nan, above)
    return found


def inrun_cell(item: InRunBound | None) -> str:
    """``compare``'s cell: ``0.43 (0.40-0.46)``, the mean alone for one run; ``+1 above 1
    left out`` after it (``none`` before it where every run was)."""
    if item is None:
        return ""
    out = "none" if item.n == 0 else f"{item.mean:.2f}" if item.n == 1 else (
        f"{item.mean:.2f} ({item.low:.2f}-{item.high:.2f})")
    if item.above:
        out += f"; {len(item.above)} above 1 left out"
    return out


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
    label = point_label(dict(item.params))
    if item.n == 0:
        return [f"In-run fraction of bound: none for the best point ({label}): "
                f"{item.left_out}; {_WHAT}."]
    return [f"In-run fraction of bound: the best point ({label}) ran "
            f"at {item.mean:.2f} of its bound ({item.spread}{_limit_text(item)}); {_WHAT}."]


def inrun_point_lines(data: Mapping[str, InRunBound]) -> list[str]:
    """One line for every point, highest mean first (those of none last), for the report."""
    if not data:
        return []
    items = sorted(data.values(), key=lambda i: -i.mean if i.n else math.inf)
    shown = "; ".join(f"{point_label(dict(i.params))}: {i.mean_text} ({i.spread})"
                      for i in items)
    return [f"In-run fraction of bound by point (mean, lowest-highest run; {_WHAT}): {shown}."]


def inrun_doc(data: Mapping[str, InRunBound]) -> dict[str, Any]:
    """The ``inrun_bound`` key of a JSON document (``fraction`` null where every run of a
    point was above 1; ``above_1_left_out``: those runs' fractions)."""
    def number(x: float) -> float | None:
        return x if math.isfinite(x) else None

    return {"fom": FOM, "measured": "in the run", "above_1": f"left out: {_ABOVE}",
            "points": [{"point": dict(i.params), "label": point_label(dict(i.params)),
                        "fraction": number(i.mean), "fraction_min": number(i.low),
                        "fraction_max": number(i.high), "n": i.n,
                        "above_1_left_out": list(i.above),
                        "limit": number(i.limit),
                        "limit_unit": "FLOP/s" if math.isfinite(i.limit) else None}
                       for i in data.values()]}
