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

MIN_PAIRS = 3
"""Fewest common rounds for a comparison to be paired by round."""

MAX_REPEATS_HINT = 10_000
"""Largest number of repeats :func:`repeats_needed` reports (beyond it: None)."""

POWER = 0.8
"""The probability at which :attr:`Comparison.detectable` and :func:`repeats_needed` count
a change as detectable."""

HETEROGENEITY_LEVEL = 0.05
"""A comparison whose own noise exceeds the study's pooled noise at this level (F test) is
judged on its own noise instead (see :mod:`tunelab.stats.pooled`)."""

TEST_POOLED_PAIRED = "paired t, pooled noise"
"""Per-round log ratio, its noise pooled over every point of the study (two-way model)."""
TEST_POOLED_ADDITIVE = "t, pooled two-way model"
"""Point against baseline in the study's additive point + block model, pooled noise: where a
split round or reruns left fewer than :data:`MIN_PAIRS` blocks in common
(:mod:`tunelab.stats.additive`)."""
TEST_POOLED = "t, pooled noise"
"""Log means, the noise pooled over every point of the study (no rounds to pair)."""
TEST_PAIRED = "paired t"
"""Per-round log ratio, its own noise."""
TEST_WELCH = "Welch t"
"""Log ratio of means, delta method, Welch–Satterthwaite degrees of freedom."""
TEST_WELCH_DIFF = "Welch t, difference of means"
"""Difference of means in the figure of merit's own unit, Welch–Satterthwaite degrees of
freedom: the test of a comparison with a run at or below zero, where no ratio exists."""

ADJUST_NONE = "none"
ADJUST_HOLM = "Holm"
ADJUST_SEQUENTIAL = "Holm, O'Brien–Fleming spending"


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


def beyond_threshold(effect: float, noise_threshold: float) -> bool:
    """Whether the speedup ``effect`` is a change of at least ``noise_threshold`` either way,
    measured on the log scale: 1.02 and 1/1.02 are the same size of change."""
    return (math.isfinite(effect) and effect > 0
            and abs(math.log(effect)) >= math.log1p(noise_threshold) - 1e-12)


def verdict_for_difference(significant: bool, difference: float) -> Verdict:
    """Better / worse by the sign of ``difference`` (> 0: B better) when the test rejects
    equality; else indistinguishable. No noise threshold: it is a relative change, and a
    figure of merit that crosses zero has no scale to measure one against."""
    if not significant or not math.isfinite(difference) or difference == 0:
        return Verdict.INDISTINGUISHABLE
    return Verdict.BETTER if difference > 0 else Verdict.WORSE


def verdict_for(significant: bool, effect: float, noise_threshold: float) -> Verdict:
    """Better / worse when the test behind the verdict rejects equality (``significant``)
    and the speedup ``effect`` is a change of at least ``noise_threshold`` (log scale:
    :func:`beyond_threshold`); else indistinguishable."""
    if not significant or not beyond_threshold(effect, noise_threshold):
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
    """Successful runs flagged disturbed (others took a share of their cores; see
    :mod:`tunelab.noise`); counted in ``n`` unless they were left out."""
    left_out: int = 0
    """Successful runs left out of the statistics because they were disturbed."""

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
    """B compared with A by one test. ``speedup > 1`` means B is better.

    ``speedup``, ``ci_low``/``ci_high`` and ``p_value`` are the estimate, the interval (at
    ``confidence``) and the two-sided p-value of the one test that decides the verdict,
    named by ``test`` (:data:`TEST_PAIRED`, :data:`TEST_POOLED_PAIRED`, :data:`TEST_WELCH`,
    :data:`TEST_POOLED`, :data:`TEST_POOLED_ADDITIVE`); ``p_adjusted`` is that p after the
    study's adjustment for many comparisons (``adjustment``: :data:`ADJUST_HOLM`,
    :data:`ADJUST_SEQUENTIAL`, or :data:`ADJUST_NONE`, when it equals ``p_value``), and the
    verdict is better / worse exactly when ``p_adjusted < 1 - confidence`` and the change
    is at least the noise threshold. ``ratio_of_means`` is the plain ratio of the two means
    (descriptive).
    ``se_log`` and ``df`` are the test's standard error of the log speedup and its degrees
    of freedom; ``detectable`` is the minimum detectable change: the smallest true change
    (0.1 = 10 %) this test, at this noise, these runs and this adjustment, would call with
    probability :data:`POWER` (never below the noise threshold; NaN without an estimate;
    for a ``repeats: auto`` comparison that stopped early without rejecting, at the
    budget's last look).
    ``repeats_needed`` is the repeats per point a 5 % change needs for the same.
    ``decided`` (``repeats: auto`` studies) is False while more rounds could still decide
    the comparison, True once it is decided; None for fixed repeats. The values are NaN
    when a side has fewer than two values.

    The interval is at ``ci_level``: the confidence at which the verdict held this
    comparison's raw p (``1 - level``: Holm's step, or the spent level of a look), so it
    excludes no change exactly when ``p_adjusted < 1 - confidence``; ``confidence`` itself
    without an adjustment.

    A comparison with a run at or below zero on either side has no ratio: its test is
    :data:`TEST_WELCH_DIFF`, ``speedup``, ``ci_low``, ``ci_high``, ``ratio_of_means`` and
    ``detectable`` are NaN, and ``difference`` (B − A in the figure of merit's unit,
    oriented so that > 0 means B is better) with ``diff_low``/``diff_high`` carry the
    estimate and its interval.
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
    test: str = TEST_WELCH
    p_adjusted: float = math.nan
    adjustment: str = ADJUST_NONE
    ratio_of_means: float = math.nan
    se_log: float = math.nan
    df: float = math.nan
    n_pairs: int = 0
    detectable: float = math.nan
    repeats_needed: int | None = None
    decided: bool | None = None
    ci_level: float = math.nan
    difference: float = math.nan
    diff_low: float = math.nan
    diff_high: float = math.nan

    @property
    def on_difference(self) -> bool:
        """Whether the test is on the difference of means (no ratio: a run <= 0)."""
        return self.test == TEST_WELCH_DIFF

    @property
    def paired(self) -> bool:
        """Whether the test pairs the runs by round."""
        return self.test in (TEST_PAIRED, TEST_POOLED_PAIRED)

    @property
    def verdict_unadjusted(self) -> Verdict:
        """The verdict the test gives before the adjustment for many comparisons."""
        if self.verdict is Verdict.INSUFFICIENT:
            return self.verdict
        if self.on_difference:
            return verdict_for_difference(self.p_value < 1 - self.confidence, self.difference)
        return verdict_for(self.p_value < 1 - self.confidence, self.speedup,
                           self.noise_threshold)


@dataclass(frozen=True)
class NoiseLevel:
    """The run-to-run noise of a study: pooled within-point standard deviation of the log
    figure of merit (``sd_log`` ≈ relative sd; round effects removed when the runs carry
    rounds), its degrees of freedom, and the repeats per point a ``change`` (5 %) needs to be
    seen in 80 % of studies by the test the verdicts use, with the study's adjustment
    (None: more than :data:`MAX_REPEATS_HINT`, or no estimate). ``detectable`` is the
    median minimum detectable change over the study's comparisons (NaN without them)."""

    sd_log: float
    df: int
    change: float
    repeats_needed: int | None
    detectable: float = math.nan


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

    ``comparison`` is the runner-up (A) against the best (B), so its speedup is usually
    ``>= 1``. ``p_beats_runner_up`` is, from that comparison's own test, the one-sided
    confidence that the best's true value beats the runner-up's (t distribution of the log
    speedup): near 1 for a clear winner, near 0.5 for a coin toss. The share is optimistic
    (winner's curse: the best was picked because its observed mean was best), so trust
    ``comparison.verdict`` for a decision. It, ``runner_up`` and ``comparison`` are None
    with a single point; ``p_beats_runner_up`` is also None when a side has fewer than two
    values.
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
    top_by_mean: PointSummary | None = None
    """The point with the best mean among the candidates, when that is not ``best`` (the
    most likely best weighs each point's runs on the log scale, by their number and the
    noise all points share): ``compare`` lists it first. None when it is ``best``."""
    p_top_by_mean: float | None = None
    """Its probability of being the best given all runs (None with ``top_by_mean``)."""
