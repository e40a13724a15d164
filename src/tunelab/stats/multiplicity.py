"""Many points against one baseline, with the false discovery rate kept in check.

:func:`compare_to_baseline` compares every point of a study with its baseline (paired by
round where the rounds allow it) and ranks them best first;
:func:`adjust_for_multiple_comparisons` applies Benjamini–Hochberg to the p-values behind the
verdicts, so that a better / worse verdict also needs an adjusted p under ``1 - confidence``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from tunelab.stats.intervals import compare
from tunelab.stats.labels import failures_text
from tunelab.stats.results import (
    DEFAULT_RESAMPLES,
    Comparison,
    PointComparison,
    PointSummary,
    StatsError,
    Verdict,
    check_direction,
)
from tunelab.stats.summaries import (
    check_runs,
    point_groups,
    point_params,
    point_summary,
    sort_key,
)

if TYPE_CHECKING:
    import pandas as pd


def adjust_for_multiple_comparisons(
    comparisons: Sequence[Comparison], *, confidence: float = 0.95
) -> list[Comparison]:
    """Benjamini–Hochberg over ``comparisons`` (one family: k points against one baseline).

    Sets ``p_adjusted`` from the ``p_test`` values (NaN ones are left out of the family) and
    turns a better / worse verdict whose adjusted p is not under ``1 - confidence`` into
    indistinguishable. The false discovery rate is then at most ``1 - confidence``.
    """
    from scipy import stats

    index = [i for i, c in enumerate(comparisons) if not math.isnan(c.p_test)]
    out = list(comparisons)
    if not index:
        return out
    adjusted = stats.false_discovery_control([comparisons[i].p_test for i in index])
    for i, p_adj in zip(index, np.atleast_1d(adjusted), strict=True):
        c = comparisons[i]
        verdict = c.verdict
        if verdict in (Verdict.BETTER, Verdict.WORSE) and not p_adj < 1 - confidence:
            verdict = Verdict.INDISTINGUISHABLE
        out[i] = replace(c, p_adjusted=float(p_adj), verdict=verdict)
    return out


def compare_to_baseline(
    runs: pd.DataFrame,
    fom: str,
    direction: str,
    baseline_key: str,
    *,
    noise_threshold: float = 0.02,
    confidence: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    fdr: bool = True,
) -> list[PointComparison]:
    """Compare every point of ``runs`` with the baseline point, ranked best first.

    The baseline is included (``is_baseline=True``, compared with itself, which shows the
    noise of its own repeats). Points without values rank last. With a ``repeat`` column the
    comparisons are paired by round where the rounds allow it; with ``fdr`` the verdicts of
    the other points are adjusted together (Benjamini–Hochberg, see
    :func:`adjust_for_multiple_comparisons`). Raises :class:`StatsError` when the baseline
    is not in the runs or has no successful run.
    """
    check_direction(direction)
    column = check_runs(runs, fom)
    groups = point_groups(runs, column)
    summaries = [point_summary(p, g) for p, g in groups.items()]
    by_key = {s.point: s for s in summaries}
    baseline_key = _canonical_key(baseline_key, by_key)
    base = by_key[baseline_key]
    if base.n == 0:
        raise StatsError(
            f"baseline point {baseline_key} has no successful run with a value of "
            f"{column.removeprefix('fom.')} ({failures_text(base.failed)})"
        )
    a = groups[baseline_key]
    ranked = sorted(summaries, key=lambda s: sort_key(s, direction))
    comparisons: list[Comparison] = []
    for summary in ranked:
        b = groups[summary.point]
        rounds = (a.rounds, b.rounds) if a.rounds is not None and b.rounds is not None else None
        try:
            comparisons.append(compare(
                a.values,
                b.values,
                direction,
                noise_threshold=noise_threshold,
                confidence=confidence,
                n_resamples=n_resamples,
                seed=seed,
                rounds=rounds,
            ))
        except StatsError as exc:
            raise StatsError(f"point {summary.point}: {exc}") from exc
    if fdr:
        others = [i for i, s in enumerate(ranked) if s.point != baseline_key]
        adjusted = adjust_for_multiple_comparisons([comparisons[i] for i in others],
                                                   confidence=confidence)
        for i, c in zip(others, adjusted, strict=True):
            comparisons[i] = c
    return [PointComparison(rank, summary, comparison, summary.point == baseline_key)
            for rank, (summary, comparison) in enumerate(zip(ranked, comparisons, strict=True),
                                                         start=1)]


def _canonical_key(key: str, known: dict[str, PointSummary]) -> str:
    """Match ``key`` to a point key of the runs, tolerating key order and spacing."""
    if key in known:
        return key
    try:
        wanted = json.loads(key)
    except (TypeError, ValueError):
        wanted = None
    for candidate in known:
        if wanted is not None and point_params(candidate) == wanted:
            return candidate
    sample = ", ".join(list(known)[:3]) + (", …" if len(known) > 3 else "")
    raise StatsError(f"baseline point {key} is not among the runs' points ({sample or 'none'})")
