"""The best point of a study, the runner-up, and how sure we are of the order.

:func:`best` crowns the point most likely best given all runs (:func:`~tunelab.stats.recommend
.recommend`, preferring points measured at least ``min_n`` times: the same point a search
strategy recommends), compares the runner-up (the next most likely) with it and reports the
share of bootstrap resamples in which the winner's mean is better.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tunelab.stats.intervals import compare_with_distribution
from tunelab.stats.labels import failures_text
from tunelab.stats.recommend import recommend
from tunelab.stats.results import DEFAULT_RESAMPLES, BestResult, StatsError, check_direction
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
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    min_n: int = 2,
) -> BestResult:
    """The point most likely best of ``fom``, the runner-up, and how sure we are of them.

    Best and runner-up are the points most likely best given every run
    (:func:`~tunelab.stats.recommend.recommend`; ``p_best`` is the winner's probability)
    among the points with at least ``min_n`` successful values (a single lucky run cannot
    win); only when no point has that many are the points with fewer considered.
    Raises :class:`StatsError` when there are no runs or no successful run with a value.
    """
    check_direction(direction)
    if len(runs) == 0:
        raise StatsError("no runs to choose the best point from")
    column = check_runs(runs, fom)
    name = column.removeprefix("fom.")
    groups = point_groups(runs, column)
    summaries = [point_summary(p, g) for p, g in groups.items()]
    ranked = sorted((s for s in summaries if s.n > 0), key=lambda s: sort_key(s, direction))
    # A single lucky run must not crown a point: prefer points measured at least min_n times.
    candidates = [s for s in ranked if s.n >= min_n] or ranked
    if not candidates:
        totals: dict[str, int] = {}
        for s in summaries:
            for status, count in s.failed.items():
                totals[status] = totals.get(status, 0) + count
        raise StatsError(
            f"no successful run with a value of {name}: {len(runs)} runs ({failures_text(totals)})"
        )
    choice = recommend({p: g.values for p, g in groups.items()}, direction, min_n=min_n)
    p_best = choice.p_best if choice is not None else None
    if choice is not None:  # most likely best first; the same pool (n >= min_n, or all)
        order = {key: i for i, key in enumerate(choice.ranking)}
        candidates.sort(key=lambda s: order.get(s.point, len(order)))
    winner = candidates[0]
    if len(candidates) == 1:
        return BestResult(name, direction, winner, None, None, None, p_best)
    runner_up = candidates[1]
    a, b = groups[runner_up.point], groups[winner.point]
    rounds = (a.rounds, b.rounds) if a.rounds is not None and b.rounds is not None else None
    comparison, distribution = compare_with_distribution(
        a.values, b.values, direction, noise_threshold, confidence, n_resamples, seed, rounds
    )
    p_beats: float | None = None
    if distribution is not None and distribution.size:
        finite = distribution[~np.isnan(distribution)]
        if finite.size:
            p_beats = float(np.mean(finite > 1.0) + 0.5 * np.mean(finite == 1.0))
    return BestResult(name, direction, winner, runner_up, comparison, p_beats, p_best)
