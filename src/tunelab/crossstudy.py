"""Two studies compared point by point: B (a new machine, version, change) against A.

:func:`compare_studies` is pure: two runs tables and an objective in, a frozen
:class:`StudyComparison` out. Each point that both studies measured is judged with the same
statistics as a comparison with the baseline inside one study (:func:`tunelab.stats.compare`:
Welch's t of the log ratio of means — the two studies' rounds ran at different times, so
nothing pairs them — its interval, p and verdict), and the verdicts of all common points are
adjusted together by Holm (:func:`tunelab.stats.holm_family`), so at most ``1 - confidence``
of comparisons of two equal studies call any point different, each interval at the level
Holm held its p to (:func:`tunelab.stats.holm_levels`), so that it excludes no change exactly
when the verdict is faster or slower; points measured by only one
study are listed, not judged. Two studies whose figure of merit or direction differ cannot be
compared: :func:`check_comparable` refuses them with one line. With ``exclude_disturbed`` the
runs the noise watch flagged are left out of both sides, as in one study.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tunelab.stats import (
    DISTURBED_COLUMN,
    Comparison,
    PointSummary,
    StatsError,
    compare,
    fom_column,
    holm_family,
    summarize,
)

if TYPE_CHECKING:
    import pandas as pd

    from tunelab.workload import Objective

__all__ = ["CrossPoint", "StudyComparison", "check_comparable", "compare_studies"]


@dataclass(frozen=True)
class CrossPoint:
    """One point measured by both studies: A's and B's summaries, B judged against A."""

    rank: int
    params: dict[str, Any]
    a: PointSummary
    b: PointSummary
    comparison: Comparison


@dataclass(frozen=True)
class StudyComparison:
    """Study B against study A: the common points (best speedup first) and the rest."""

    name_a: str
    name_b: str
    objective: Objective
    points: tuple[CrossPoint, ...]
    only_a: tuple[PointSummary, ...]
    only_b: tuple[PointSummary, ...]
    confidence: float
    noise_threshold: float
    notes: tuple[str, ...] = ()
    """How far the verdicts can be trusted: each study's own load (the noise watch)."""


def check_comparable(name_a: str, objective_a: Objective, name_b: str,
                     objective_b: Objective) -> None:
    """Raise :class:`StatsError` unless both studies optimise the same FOM the same way."""
    if (objective_a.fom, objective_a.direction) != (objective_b.fom, objective_b.direction):
        raise StatsError(
            f"cannot compare study {name_b!r} ({objective_b.fom}, {objective_b.direction}) "
            f"with study {name_a!r} ({objective_a.fom}, {objective_a.direction}): the figure "
            "of merit or its direction differ"
        )


def _canonical(point_key: str) -> str:
    try:
        params = json.loads(point_key)
    except (TypeError, ValueError):
        return point_key
    return json.dumps(params, sort_keys=True) if isinstance(params, dict) else point_key


def _summaries(runs: pd.DataFrame, fom: str, exclude: bool) -> dict[str, PointSummary]:
    if not len(runs):
        return {}
    return {_canonical(s.point): s for s in summarize(runs, fom, exclude_disturbed=exclude)}


def _values(runs: pd.DataFrame, fom: str, exclude: bool) -> dict[str, list[float]]:
    """Every point's successful values of ``fom`` (without the runs flagged disturbed, with
    ``exclude``), in run order, keyed by canonical point key: one pass over the runs (each
    key decoded once), whatever the number of points."""
    column = fom_column(fom)
    if not len(runs) or column not in runs.columns:
        return {}
    keep = runs["status"] == "ok"
    if exclude and DISTURBED_COLUMN in runs.columns:
        keep &= ~(runs[DISTURBED_COLUMN].fillna(0).astype(float) > 0)
    ok = runs[keep]
    out: dict[str, list[float]] = {}
    for key, value in zip(ok["point"].map(_canonical), ok[column].to_numpy(dtype=float),
                          strict=True):
        if value == value:  # not NaN
            out.setdefault(key, []).append(float(value))
    return out


def compare_studies(
    runs_a: pd.DataFrame,
    runs_b: pd.DataFrame,
    objective: Objective,
    *,
    name_a: str = "A",
    name_b: str = "B",
    noise_threshold: float = 0.02,
    confidence: float = 0.95,
    exclude_disturbed: bool = False,
) -> StudyComparison:
    """Judge every point of ``runs_b`` that ``runs_a`` also measured, B against A.

    Points are matched by their parameter values (key order does not matter). The result
    ranks the common points by speedup, best first; points without a value on a side rank
    last with an ``insufficient data`` verdict. ``exclude_disturbed`` leaves the runs
    flagged disturbed out of both sides.
    """
    fom = objective.fom.removeprefix("fom.")
    ex = exclude_disturbed
    a_sum, b_sum = _summaries(runs_a, fom, ex), _summaries(runs_b, fom, ex)
    common = [k for k in b_sum if k in a_sum]
    a_values, b_values = _values(runs_a, fom, ex), _values(runs_b, fom, ex)
    judged = []
    for key in common:
        try:
            comparison = compare(a_values.get(key, []), b_values.get(key, []),
                                 objective.direction, noise_threshold=noise_threshold,
                                 confidence=confidence)
        except StatsError as exc:
            raise StatsError(f"point {key}: {exc}") from exc
        judged.append((key, comparison))
    judged = list(zip([key for key, _ in judged], holm_family([c for _, c in judged]),
                      strict=True))
    judged.sort(key=lambda kc: (kc[1].speedup != kc[1].speedup,  # NaN last
                                -kc[1].speedup if kc[1].speedup == kc[1].speedup else 0.0,
                                kc[0]))
    points = tuple(
        CrossPoint(rank, dict(b_sum[key].params), a_sum[key], b_sum[key], comparison)
        for rank, (key, comparison) in enumerate(judged, start=1)
    )
    return StudyComparison(
        name_a=name_a,
        name_b=name_b,
        objective=objective,
        points=points,
        only_a=tuple(s for k, s in sorted(a_sum.items()) if k not in b_sum),
        only_b=tuple(s for k, s in sorted(b_sum.items()) if k not in a_sum),
        confidence=confidence,
        noise_threshold=noise_threshold,
    )
