"""The best point of a study, the runner-up, and how sure we are of the order.

:func:`best` crowns the point most likely best given all runs (:func:`~tunelab.stats.recommend
.recommend`, preferring points measured at least ``min_n`` times: the same point a search
strategy recommends), compares the runner-up (the next most likely) with it by
:func:`~tunelab.stats.intervals.compare` (paired by round where they share rounds) and
reports, from that comparison's own test, the one-sided confidence that the winner is the
better one.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tunelab.stats.intervals import compare
from tunelab.stats.labels import failures_text
from tunelab.stats.recommend import recommend
from tunelab.stats.results import BestResult, Comparison, StatsError, check_direction
from tunelab.stats.summaries import check_runs, point_groups, point_summary, sort_key

if TYPE_CHECKING:
    import pandas as pd


def best(
    runs: pd.DataFrame,
    fom: str,
    direction: str,
    *,
    noise_threshold: float = 0.02,
    confidence: float = 0.95,
    min_n: int = 2,
    exclude_disturbed: bool = False,
) -> BestResult:
    """The point most likely best of ``fom``, the runner-up, and how sure we are of them.

    Best and runner-up are the points most likely best given every run
    (:func:`~tunelab.stats.recommend.recommend`; ``p_best`` is the winner's probability)
    among the points with at least ``min_n`` successful values (a single lucky run cannot
    win); only when no point has that many are the points with fewer considered.
    ``exclude_disturbed`` leaves runs flagged disturbed out.
    Raises :class:`StatsError` when there are no runs or no successful run with a value.
    """
    check_direction(direction)
    if len(runs) == 0:
        raise StatsError("no runs to choose the best point from")
    column = check_runs(runs, fom)
    name = column.removeprefix("fom.")
    groups = point_groups(runs, column, exclude_disturbed=exclude_disturbed)
    summaries = [point_summary(p, g) for p, g in groups.items()]
    ranked = sorted((s for s in summaries if s.n > 0), key=lambda s: sort_key(s, direction))
    # A single lucky run must not crown a point: prefer points measured at least min_n times.
    candidates = [s for s in ranked if s.n >= min_n] or ranked
    if not candidates:
        totals: dict[str, int] = {}
        left_out = sum(s.left_out for s in summaries)
        for s in summaries:
            for status, count in s.failed.items():
                totals[status] = totals.get(status, 0) + count
        if left_out:
            totals["disturbed, left out"] = left_out
        raise StatsError(
            f"no successful run with a value of {name}: {len(runs)} runs ({failures_text(totals)})"
        )
    top = candidates[0]  # the best mean: first in compare's order
    choice = recommend({p: g.values for p, g in groups.items()}, direction, min_n=min_n)
    p_best = choice.p_best if choice is not None else None
    if choice is not None:  # most likely best first; the same pool (n >= min_n, or all)
        order = {key: i for i, key in enumerate(choice.ranking)}
        candidates.sort(key=lambda s: order.get(s.point, len(order)))
    winner = candidates[0]
    top_by_mean = top if top.point != winner.point else None
    p_top = (choice.p_best_of.get(top.point) if top_by_mean is not None
             and choice is not None else None)
    if len(candidates) == 1:
        return BestResult(name, direction, winner, None, None, None, p_best)
    runner_up = candidates[1]
    a, b = groups[runner_up.point], groups[winner.point]
    rounds = (a.pairs_by, b.pairs_by) if a.pairs_by is not None and b.pairs_by is not None \
        else None
    comparison = compare(a.values, b.values, direction, noise_threshold=noise_threshold,
                         confidence=confidence, rounds=rounds)
    return BestResult(name, direction, winner, runner_up, comparison,
                      _confidence_better(comparison), p_best, top_by_mean, p_top)


def _confidence_better(c: Comparison) -> float | None:
    """P(T_df < estimate / se): the one-sided confidence that B beats A, the estimate the
    log speedup (or, without a ratio, the difference of means)."""
    from scipy import stats

    if c.on_difference:
        estimate = c.difference
    elif math.isfinite(c.speedup) and c.speedup > 0:
        estimate = math.log(c.speedup)
    else:
        return None
    if not (math.isfinite(estimate) and math.isfinite(c.se_log) and math.isfinite(c.df)):
        return None
    if c.se_log == 0:
        return 1.0 if estimate > 0 else 0.0 if estimate < 0 else 0.5
    return float(stats.t.cdf(estimate / c.se_log, c.df))
