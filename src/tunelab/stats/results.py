"""The records and vocabulary of :mod:`tunelab.stats`: frozen results, the verdict and its rule.

Everything the other modules of the package return is defined here — :class:`PointSummary`,
:class:`Comparison` (with its :class:`PairedInterval`), :class:`NoiseLevel`,
:class:`PointComparison`, :class:`BestResult` — together with :class:`StatsError`, the
:class:`Verdict` vocabulary, :func:`verdict_for` (the rule that turns an interval into a
verdict), the objective directions and the package's constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tunelab.errors import TunelabError

DIRECTIONS = ("minimize", "maximize")
DEFAULT_RESAMPLES = 9999
"""Bootstrap resamples per comparison (scipy's default; vectorised, a few ms for n ≤ 100)."""

MIN_PAIRS = 3
"""Fewest complete rounds for the paired interval to decide a verdict."""

MAX_REPEATS_HINT = 10_000
"""Largest number of repeats :func:`repeats_needed` reports (beyond it: None)."""


class StatsError(TunelabError):
    """Statistics that cannot be computed from the runs given (no runs, unknown FOM, …)."""


def check_direction(direction: str) -> None:
    """Raise :class:`StatsError` unless ``direction`` is one of :data:`DIRECTIONS`."""
    if direction not in DIRECTIONS:
        raise StatsError(
            f"objective direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}"
        )


class Verdict(StrEnum):
    """Outcome of comparing B against A (see :func:`compare`)."""

    BETTER = "better"
    WORSE = "worse"
    INDISTINGUISHABLE = "indistinguishable"
    INSUFFICIENT = "insufficient data"


def verdict_for(low: float, high: float, effect: float, noise_threshold: float) -> Verdict:
    """The verdict of an interval ``[low, high]`` of the speedup around ``effect``: better /
    worse when it excludes 1 and the change is at least ``noise_threshold``, else
    indistinguishable (also for a NaN end)."""
    if (
        math.isnan(low)
        or math.isnan(high)
        or low <= 1.0 <= high
        or abs(effect - 1.0) < noise_threshold
    ):
        return Verdict.INDISTINGUISHABLE
    return Verdict.BETTER if effect > 1.0 else Verdict.WORSE


@dataclass(frozen=True)
class PointSummary:
    """Descriptive statistics of one point's successful runs.

    ``failed`` maps each non-ok status (``failed``, ``timeout``, ``invalid``, and
    ``missing`` for ok runs without a finite value of the figure of merit) to its count.
    With ``n == 0`` the statistics are NaN; ``std`` is the sample standard deviation
    (``ddof=1``), NaN for ``n == 1``.
    """

    point: str
    params: dict[str, Any]
    n: int
    mean: float
    median: float
    std: float
    min: float
    max: float
    failed: dict[str, int] = field(default_factory=dict)
    disturbed: int = 0
    """Successful runs taken while the machine was busier than at the study's start."""

    @property
    def n_failed(self) -> int:
        """Runs of this point that did not yield a value."""
        return sum(self.failed.values())

    @property
    def n_total(self) -> int:
        """All runs of this point, successful or not."""
        return self.n + self.n_failed


@dataclass(frozen=True)
class PairedInterval:
    """B against A within rounds: the geometric mean of the per-round ratios (> 1: B
    better), its Student t interval over ``n_pairs`` rounds and the paired t-test p-value.
    ``complete`` is True when every run of the side with fewer runs had a partner."""

    speedup: float
    ci_low: float
    ci_high: float
    p_value: float
    n_pairs: int
    complete: bool
    sd_log: float = math.nan
    """Standard deviation of the per-round log ratio (the paired noise)."""


@dataclass(frozen=True)
class Comparison:
    """B compared with A. ``speedup > 1`` means B is better (see module docstring).

    ``ci_low``/``ci_high`` bound the speedup at the requested confidence; they and
    ``p_value`` are NaN when a side has fewer than two values. ``paired`` is the paired
    interval when the runs carry rounds; ``method`` says which interval decided the verdict
    (``paired`` or ``unpaired``) and ``p_test`` is that test's p-value; ``p_adjusted`` is
    it after the Benjamini–Hochberg adjustment over the study's comparisons (equal to
    ``p_test`` for a lone comparison). ``repeats_needed`` is the power hint: repeats per
    point for a 5 % change to be seen in 80 % of studies at this comparison's noise.
    """

    speedup: float
    ci_low: float
    ci_high: float
    p_value: float
    verdict: Verdict
    n_a: int
    n_b: int
    confidence: float = 0.95
    noise_threshold: float = 0.02
    paired: PairedInterval | None = None
    method: str = "unpaired"
    p_test: float = math.nan
    p_adjusted: float = math.nan
    repeats_needed: int | None = None

    @property
    def verdict_unadjusted(self) -> Verdict:
        """The verdict the deciding interval gives before the multiple-comparison step."""
        if self.verdict is Verdict.INSUFFICIENT:
            return self.verdict
        if self.method == "paired" and self.paired is not None:
            p = self.paired
            return verdict_for(p.ci_low, p.ci_high, p.speedup, self.noise_threshold)
        return verdict_for(self.ci_low, self.ci_high, self.speedup, self.noise_threshold)


@dataclass(frozen=True)
class NoiseLevel:
    """The run-to-run noise of a study: pooled within-point standard deviation of the log
    figure of merit (``sd_log`` ≈ relative sd), its degrees of freedom, and the repeats per
    point a ``change`` (5 %) needs to be seen in 80 % of studies (None: more than
    :data:`MAX_REPEATS_HINT`, or no estimate)."""

    sd_log: float
    df: int
    change: float
    repeats_needed: int | None


@dataclass(frozen=True)
class PointComparison:
    """One point compared with the study's baseline (A = baseline, B = this point)."""

    rank: int
    summary: PointSummary
    comparison: Comparison
    is_baseline: bool = False

    @property
    def point(self) -> str:
        """The point's canonical JSON key."""
        return self.summary.point


@dataclass(frozen=True)
class BestResult:
    """The best point by mean, the runner-up, and how sure we are of the order.

    ``comparison`` is the runner-up (A) against the best (B), so its speedup is ``>= 1``.
    ``p_beats_runner_up`` is the fraction of bootstrap resamples in which the best's mean
    is better than the runner-up's (ties count half): near 1 for a clear winner, near 0.5
    for a coin toss. The share is optimistic (winner's curse: the best was picked because
    its observed mean was best): two points drawn from one distribution with 5 runs each
    gave a median of 0.77 and >= 0.95 in 17 % of 200 trials, so trust ``comparison.verdict``
    for a decision. It, ``runner_up`` and ``comparison`` are None with a single point;
    ``p_beats_runner_up`` is also None when a side has fewer than two values.
    """

    fom: str
    direction: str
    best: PointSummary
    runner_up: PointSummary | None
    comparison: Comparison | None
    p_beats_runner_up: float | None
    p_best: float | None = None
    """The probability that ``best`` is the best point given all runs
    (:mod:`tunelab.stats.recommend`); None while no point has two successful runs."""
