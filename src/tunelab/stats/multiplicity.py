"""Many points against one baseline, with the family-wise error kept in check.

:func:`compare_to_baseline` compares every point of a study with its baseline by the test of
:mod:`tunelab.stats.pooled` (paired by round, the noise pooled over the study) and decides
the verdicts together by :func:`tunelab.stats.sequential.decide` (Holm; with a
:class:`~tunelab.stats.sequential.SequentialPlan`, looks round by round at spent levels).
Each :class:`~tunelab.stats.results.Comparison` carries that test's estimate, interval and
p, the adjusted p the verdict used, and its minimum detectable change.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from tunelab.stats.intervals import check_settings, compare, comparison_from_test
from tunelab.stats.labels import failures_text
from tunelab.stats.power import detectable_change
from tunelab.stats.results import (
    ADJUST_HOLM,
    ADJUST_NONE,
    ADJUST_SEQUENTIAL,
    Comparison,
    PointComparison,
    StatsError,
    Verdict,
    check_direction,
)
from tunelab.stats.sequential import Decision, SequentialPlan, decide
from tunelab.stats.summaries import (
    Group,
    check_runs,
    point_groups,
    point_params,
    point_summary,
    sort_key,
)

if TYPE_CHECKING:
    import pandas as pd


def compare_to_baseline(
    runs: pd.DataFrame,
    fom: str,
    direction: str,
    baseline_key: str,
    *,
    noise_threshold: float = 0.02,
    confidence: float = 0.95,
    adjust: bool = True,
    plan: SequentialPlan | None = None,
    exclude_disturbed: bool = False,
) -> list[PointComparison]:
    """Compare every point of ``runs`` with the baseline point, ranked best first.

    The baseline is included (``is_baseline=True``, compared with itself by its own test,
    which shows the noise of its repeats). Points without values rank last. The verdicts of
    the other points are decided together (module docstring): with ``adjust`` (Holm) at
    most ``1 - confidence`` of studies give any false verdict; ``plan`` replays the looks of
    a ``repeats: auto`` study. ``exclude_disturbed`` leaves runs flagged disturbed out. A
    point (or a baseline) with a run at or below zero is compared by the difference of
    means (no ratio: :class:`~tunelab.stats.results.Comparison`).
    Raises :class:`StatsError` when the baseline is not in the runs or has no successful
    run.
    """
    check_direction(direction)
    check_settings(confidence, noise_threshold)
    column = check_runs(runs, fom)
    groups = point_groups(runs, column, exclude_disturbed=exclude_disturbed)
    summaries = [point_summary(p, g) for p, g in groups.items()]
    by_key = {s.point: s for s in summaries}
    baseline_key = _canonical_key(baseline_key, by_key)
    base = by_key[baseline_key]
    if base.n == 0:
        counts = {**base.failed, **({"disturbed, left out": base.left_out}
                                    if base.left_out else {})}
        raise StatsError(
            f"baseline point {baseline_key} has no successful run with a value of "
            f"{column.removeprefix('fom.')} ({failures_text(counts)})"
        )
    decisions = decide(groups, baseline_key, direction, confidence=confidence,
                       noise_threshold=noise_threshold, plan=plan, adjust=adjust)
    m = len(decisions)
    adjustment = (ADJUST_SEQUENTIAL if plan is not None
                  else ADJUST_HOLM if adjust and m > 1 else ADJUST_NONE)
    ranked = sorted(summaries, key=lambda s: sort_key(s, direction))
    out = []
    for rank, summary in enumerate(ranked, start=1):
        a, b = groups[baseline_key], groups[summary.point]
        if summary.point == baseline_key:
            comparison = _self_comparison(a, direction, noise_threshold, confidence)
        else:
            comparison = _decided(a, b, decisions[summary.point], direction,
                                  noise_threshold=noise_threshold, confidence=confidence,
                                  adjustment=adjustment, m=m if adjust else 1,
                                  points=len(groups), sequential=plan is not None)
        out.append(PointComparison(rank, summary, comparison, summary.point == baseline_key))
    return out


def still_undecided(
    runs: pd.DataFrame,
    fom: str,
    direction: str,
    baseline_key: str,
    plan: SequentialPlan,
    *,
    noise_threshold: float = 0.02,
    confidence: float = 0.95,
    exclude_disturbed: bool = False,
) -> list[str]:
    """The point keys a ``repeats: auto`` study should run another round of: those whose
    comparison with the baseline is neither decided nor at the budget
    (``plan.max_rounds`` rounds). Empty when every comparison is finished."""
    column = check_runs(runs, fom)
    groups = point_groups(runs, column, exclude_disturbed=exclude_disturbed)
    baseline_key = _canonical_key(baseline_key, {k: None for k in groups})
    decisions = decide(groups, baseline_key, direction, confidence=confidence,
                       noise_threshold=noise_threshold, plan=plan)
    return [k for k, d in decisions.items() if not d.finished]


def _self_comparison(a: Group, direction: str, noise_threshold: float,
                     confidence: float) -> Comparison:
    rounds = (a.pairs_by, a.pairs_by) if a.pairs_by is not None else None
    return compare(a.values, a.values, direction, noise_threshold=noise_threshold,
                   confidence=confidence, rounds=rounds)


def _decided(a: Group, b: Group, d: Decision, direction: str, *, noise_threshold: float,
             confidence: float, adjustment: str, m: int, points: int,
             sequential: bool) -> Comparison:
    """The comparison of B with the baseline A as the family's decision left it."""
    if d.test is None:  # fewer than two values a side (or never looked at)
        rounds = (a.pairs_by, b.pairs_by) if a.pairs_by is not None and b.pairs_by is not None \
            else None
        c = compare(a.values, b.values, direction, noise_threshold=noise_threshold,
                    confidence=confidence, rounds=rounds)
        if c.verdict is Verdict.INSUFFICIENT:
            return c
        return replace(c, verdict=Verdict.INDISTINGUISHABLE, p_adjusted=math.nan,
                       adjustment=adjustment, decided=False if sequential else None)
    alpha = 1 - confidence
    level = d.level if math.isfinite(d.level) else alpha / m
    # one look: Holm's adjusted p; looks round by round: the raw p against its spent level
    # is the adjusted p against alpha. Either way p_adjusted < alpha exactly when rejected
    p_adjusted = (d.p_adjusted if math.isfinite(d.p_adjusted)
                  else min(1.0, d.test.p * alpha / level) if level > 0 else 1.0)
    c = comparison_from_test(
        d.test, a.values, b.values, direction, noise_threshold=noise_threshold,
        confidence=confidence,
        p_adjusted=p_adjusted, level=level, adjustment=adjustment, comparisons=m,
        points=points, decided=d.decided if sequential else None)
    if sequential and d.budget is not None and not c.on_difference:  # stopped early:
        # what the budget would see
        se, at = d.budget
        c = replace(c, detectable=detectable_change(se, d.test.df, at,
                                                    threshold=noise_threshold))
    return c


def _canonical_key(key: str, known: Mapping[str, object]) -> str:
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
    raise StatsError(f"baseline point {key} has no runs in this study (a search whose budget "
                     f"cannot measure every point may leave it out; measured: "
                     f"{sample or 'none'})")
