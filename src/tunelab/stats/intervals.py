"""Comparing two samples: one test per comparison, its estimate, interval and p-value.

Two tests, both on the log scale (timings vary multiplicatively):

* :func:`paired_interval` — the log ratio within each round, then the Student t interval
  of its mean over the rounds (the machine's slow drift cancels within a round);
* :func:`welch_log_ratio` — the log of the ratio of means, its standard error by the delta
  method, Welch–Satterthwaite degrees of freedom (rounds unknown or too few in common);
* :func:`welch_difference` — the difference of means in the figure of merit's own unit,
  for a comparison with a run at or below zero: its logs do not exist, and a ratio of
  means of a figure of merit that crosses zero means nothing (×11.9 [0.000, 3.4e12]).

:func:`compare` picks the paired test when the two samples share at least
:data:`~tunelab.stats.results.MIN_PAIRS` rounds, else Welch's, and reports that one test's
estimate, interval and p-value, so the p shown is the p the verdict used.
:func:`comparison_from_test` turns any such test (also the study-wide pooled one of
:mod:`tunelab.stats.pooled`) into a :class:`~tunelab.stats.results.Comparison`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple

import numpy as np
from scipy import special

from tunelab.stats.power import detectable_change, repeats_needed
from tunelab.stats.results import (
    ADJUST_NONE,
    MIN_PAIRS,
    TEST_PAIRED,
    TEST_WELCH,
    TEST_WELCH_DIFF,
    Comparison,
    PairedInterval,
    StatsError,
    Verdict,
    check_direction,
    verdict_for,
    verdict_for_difference,
)

__all__ = ["TestResult", "compare", "comparison_at_level", "comparison_from_test",
           "paired_interval", "t_p_value", "welch_difference", "welch_log_ratio"]


class TestResult(NamedTuple):
    """One test of B against A on the log scale: ``estimate`` is the log speedup (> 0: B
    better), ``se`` its standard error, ``df`` the degrees of freedom of its t distribution,
    ``p`` the two-sided p-value, ``sd_log`` the noise it saw (per run for Welch and pooled
    tests, per round ratio for the paired one), ``n_pairs`` the rounds it paired (0 for
    Welch), ``n`` the information it rests on: rounds paired, or the smaller side's runs."""

    test: str
    estimate: float
    se: float
    df: float
    p: float
    sd_log: float
    n_pairs: int
    n: int


def t_p_value(estimate: float, se: float, df: float) -> float:
    """Two-sided p of ``estimate / se`` under Student's t with ``df``."""
    if se == 0.0:
        return 1.0 if estimate == 0.0 else 0.0
    return float(2 * special.stdtr(df, -abs(estimate) / se))


def welch_log_ratio(a: np.ndarray, b: np.ndarray, direction: str) -> TestResult:
    """Welch t of log(mean A) − log(mean B) (delta method), oriented so that > 0 means B is
    better; ``sd_log`` is the pooled relative sd of one run. Needs two values a side."""
    ma, mb = float(np.mean(a)), float(np.mean(b))
    rel_a, rel_b = float(np.var(a, ddof=1)) / (ma * ma), float(np.var(b, ddof=1)) / (mb * mb)
    estimate = math.log(ma / mb) if direction == "minimize" else math.log(mb / ma)
    se, df, sd_run = _welch(rel_a, a.size, rel_b, b.size)
    return TestResult(TEST_WELCH, estimate, se, df, t_p_value(estimate, se, df), sd_run, 0,
                      int(min(a.size, b.size)))


def _welch(var_a: float, n_a: int, var_b: float, n_b: int) -> tuple[float, float, float]:
    """Welch's standard error of a difference of two means, its Welch–Satterthwaite degrees
    of freedom and the pooled sd of one run, from each side's variance of one run."""
    mean_a, mean_b = var_a / n_a, var_b / n_b
    se = math.sqrt(mean_a + mean_b)
    sd_run = math.sqrt(((n_a - 1) * var_a + (n_b - 1) * var_b) / (n_a + n_b - 2))
    if se == 0.0:
        return se, float(n_a + n_b - 2), sd_run
    df = (mean_a + mean_b) ** 2 / (mean_a**2 / (n_a - 1) + mean_b**2 / (n_b - 1))
    return se, df, sd_run


def welch_difference(a: np.ndarray, b: np.ndarray, direction: str) -> TestResult:
    """Welch t of mean B − mean A in the figure of merit's unit, oriented so that > 0 means
    B is better; ``sd_log`` is the pooled sd of one run (in that unit, not relative).
    Needs two values a side."""
    ma, mb = float(np.mean(a)), float(np.mean(b))
    estimate = mb - ma if direction == "maximize" else ma - mb
    se, df, sd_run = _welch(float(np.var(a, ddof=1)), a.size, float(np.var(b, ddof=1)), b.size)
    return TestResult(TEST_WELCH_DIFF, estimate, se, df, t_p_value(estimate, se, df), sd_run,
                      0, int(min(a.size, b.size)))


def unpaired_test(a: np.ndarray, b: np.ndarray, direction: str) -> TestResult:
    """Welch's test of B against A: on the log ratio of means when every value is positive,
    else on the difference of means (:func:`welch_difference`)."""
    if np.all(a > 0) and np.all(b > 0):
        return welch_log_ratio(a, b, direction)
    return welch_difference(a, b, direction)


def round_differences(a: np.ndarray, ra: np.ndarray, b: np.ndarray, rb: np.ndarray,
                      direction: str) -> np.ndarray:
    """Per common round (ascending), log A − log B oriented so that > 0 means B is better;
    values sharing a round are averaged on the log scale first. Positive values only."""
    common = np.intersect1d(np.unique(ra), np.unique(rb))
    la, lb = np.log(a), np.log(b)
    d = np.array([la[ra == r].mean() - lb[rb == r].mean() for r in common])
    return -d if direction == "maximize" else d


def paired_test(d: np.ndarray) -> TestResult:
    """Paired t of the per-round log ratios ``d`` (at least two)."""
    n = int(d.size)
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    se = sd / math.sqrt(n)
    return TestResult(TEST_PAIRED, mean, se, float(n - 1), t_p_value(mean, se, n - 1), sd, n, n)


def paired_interval(
    a_values: Sequence[float] | np.ndarray,
    a_rounds: Sequence[int] | np.ndarray,
    b_values: Sequence[float] | np.ndarray,
    b_rounds: Sequence[int] | np.ndarray,
    direction: str,
    confidence: float = 0.95,
) -> PairedInterval | None:
    """B against A within rounds (see the module docstring); None with fewer than two
    common rounds or a non-positive value."""
    check_direction(direction)
    a, b = np.asarray(a_values, dtype=float), np.asarray(b_values, dtype=float)
    ra, rb = np.asarray(a_rounds, dtype=np.int64), np.asarray(b_rounds, dtype=np.int64)
    if a.shape != ra.shape or b.shape != rb.shape:
        raise StatsError("each value needs its round")
    if a.size == 0 or b.size == 0 or np.any(a <= 0) or np.any(b <= 0):
        return None
    d = round_differences(a, ra, b, rb, direction)
    if d.size < 2:
        return None
    t = paired_test(d)
    low, high = _interval(t, confidence)
    complete = d.size == min(np.unique(ra).size, np.unique(rb).size)
    return PairedInterval(math.exp(t.estimate), low, high, t.p, t.n_pairs, complete, t.sd_log)


def _half_width(se: float, df: float, confidence: float) -> float:
    return float(special.stdtrit(df, 0.5 + confidence / 2)) * se if se > 0 else 0.0


def _exp(x: float) -> float:
    """``exp(x)``, infinite past the largest float (an interval at the tiny level of an
    early look of ``repeats: auto`` can be that wide)."""
    return math.exp(x) if x < 709.0 else math.inf


def _interval(t: TestResult, confidence: float) -> tuple[float, float]:
    half = _half_width(t.se, t.df, confidence)
    return _exp(t.estimate - half), _exp(t.estimate + half)


def comparison_at_level(c: Comparison, level: float) -> Comparison:
    """``c`` with its interval at confidence ``1 - level`` (the nominal level its raw p was
    held against) and its minimum detectable change at that level."""
    if not (math.isfinite(c.se_log) and math.isfinite(c.df) and 0 < level < 1):
        return c
    half = _half_width(c.se_log, c.df, 1 - level)
    if c.on_difference:
        return replace(c, diff_low=c.difference - half, diff_high=c.difference + half,
                       ci_level=1 - level)
    log = math.log(c.speedup)
    return replace(c, ci_low=_exp(log - half), ci_high=_exp(log + half),
                   ci_level=1 - level,
                   detectable=detectable_change(c.se_log, c.df, level,
                                                threshold=c.noise_threshold))


def comparison_from_test(
    t: TestResult, a: np.ndarray, b: np.ndarray, direction: str, *,
    noise_threshold: float, confidence: float, p_adjusted: float | None = None,
    level: float | None = None, adjustment: str = ADJUST_NONE, comparisons: int = 1,
    points: int = 2, decided: bool | None = None,
) -> Comparison:
    """The :class:`Comparison` of test ``t`` of sample B (``b``) against A (``a``).

    ``p_adjusted`` (default: the test's own p) decides the verdict against
    ``1 - confidence``; ``level`` is the nominal level the raw p needed (default:
    ``(1 - confidence) / comparisons``), at which the minimum detectable change is
    computed, and the interval at ``1 - level``, so that it excludes no change exactly when
    ``p_adjusted < 1 - confidence``; ``comparisons`` and ``points`` size the power hint."""
    alpha = 1 - confidence
    p_adj = t.p if p_adjusted is None else p_adjusted
    at = alpha / comparisons if level is None else level
    if t.test == TEST_WELCH_DIFF:
        half = _half_width(t.se, t.df, 1 - at)
        nan = math.nan
        return Comparison(
            nan, nan, nan, t.p, verdict_for_difference(p_adj < alpha, t.estimate),
            int(a.size), int(b.size), confidence, noise_threshold, t.test, p_adj, adjustment,
            nan, t.se, t.df, 0, nan, None, decided, 1 - at, t.estimate,
            t.estimate - half, t.estimate + half)
    low, high = _interval(t, 1 - at)
    speedup = math.exp(t.estimate)
    ma, mb = float(np.mean(a)), float(np.mean(b))
    ratio = ma / mb if direction == "minimize" else mb / ma
    detectable = detectable_change(t.se, t.df, at, threshold=noise_threshold)
    needed = repeats_needed(t.sd_log, confidence=confidence, paired=t.test == TEST_PAIRED,
                            comparisons=comparisons, points=points if t.n_pairs else 2)
    return Comparison(
        speedup, low, high, t.p, verdict_for(p_adj < alpha, speedup, noise_threshold),
        int(a.size), int(b.size), confidence, noise_threshold, t.test, p_adj, adjustment,
        ratio, t.se, t.df, t.n_pairs, detectable, needed, decided, 1 - at)


def check_settings(confidence: float, noise_threshold: float) -> None:
    """Raise :class:`StatsError` for a confidence outside (0, 1) or a negative threshold."""
    if not 0 < confidence < 1:
        raise StatsError(f"confidence must lie strictly between 0 and 1, got {confidence}")
    if noise_threshold < 0:
        raise StatsError(f"noise threshold must be >= 0, got {noise_threshold}")


def clean_sample(values: Sequence[float] | np.ndarray, rounds: Sequence[int] | np.ndarray | None,
                 side: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Finite values (and their rounds); raises :class:`StatsError` when the rounds do not
    match the values one to one."""
    x = np.asarray(values, dtype=float).ravel()
    r = None if rounds is None else np.asarray(rounds).ravel()
    if r is not None and r.size != x.size:
        raise StatsError(f"sample {side} has {x.size} values but {r.size} rounds")
    keep = np.isfinite(x)
    return x[keep], (None if r is None else r[keep].astype(np.int64))


def choose_test(a: np.ndarray, ra: np.ndarray | None, b: np.ndarray, rb: np.ndarray | None,
                direction: str) -> TestResult:
    """The paired test over common rounds when there are at least
    :data:`~tunelab.stats.results.MIN_PAIRS` of them (positive values), else Welch's
    (:func:`unpaired_test`: on the difference of means where a value is <= 0)."""
    if ra is not None and rb is not None and np.all(a > 0) and np.all(b > 0):
        d = round_differences(a, ra, b, rb, direction)
        if d.size >= MIN_PAIRS:
            return paired_test(d)
    return unpaired_test(a, b, direction)


def compare(
    a_values: Sequence[float] | np.ndarray,
    b_values: Sequence[float] | np.ndarray,
    direction: str,
    *,
    noise_threshold: float = 0.02,
    confidence: float = 0.95,
    rounds: tuple[Sequence[int] | np.ndarray, Sequence[int] | np.ndarray] | None = None,
) -> Comparison:
    """Compare sample B against sample A of a figure of merit optimised in ``direction``.

    With ``rounds`` (the round of each value of A and of B) and at least
    :data:`~tunelab.stats.results.MIN_PAIRS` rounds in common, the paired t test over those
    rounds decides; else the Welch t of the log ratio of means. The result carries that
    test's estimate, interval and p-value (module docstring) and the verdict: better /
    worse when p < ``1 - confidence`` and the change is at least ``noise_threshold``.
    ``insufficient data`` with fewer than two values a side. NaN and infinite values are
    dropped. Raises :class:`StatsError` for an unknown direction, a confidence outside
    (0, 1), a negative threshold, rounds that do not match the values, or a non-positive
    mean.
    """
    check_direction(direction)
    check_settings(confidence, noise_threshold)
    a, ra = clean_sample(a_values, rounds[0] if rounds is not None else None, "A")
    b, rb = clean_sample(b_values, rounds[1] if rounds is not None else None, "B")
    nan = math.nan
    if a.size == 0 or b.size == 0:
        return Comparison(nan, nan, nan, nan, Verdict.INSUFFICIENT, a.size, b.size,
                          confidence, noise_threshold)
    if a.size < 2 or b.size < 2:
        ma, mb = float(np.mean(a)), float(np.mean(b))
        ratio = ((ma / mb if direction == "minimize" else mb / ma)
                 if np.all(a > 0) and np.all(b > 0) else nan)
        return Comparison(ratio, nan, nan, nan, Verdict.INSUFFICIENT, a.size, b.size,
                          confidence, noise_threshold, ratio_of_means=ratio)
    t = choose_test(a, ra, b, rb, direction)
    return comparison_from_test(t, a, b, direction, noise_threshold=noise_threshold,
                                confidence=confidence)
