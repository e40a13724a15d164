"""Power: the smallest change a comparison can see, and how many repeats a change needs.

Both model the test that decides the verdicts (:mod:`tunelab.stats.intervals`,
:mod:`tunelab.stats.pooled`): a two-sided t test of the log speedup at the nominal level the
study's adjustment leaves one comparison (``(1 - confidence) / comparisons``: Holm's first
step, the strictest), with the noncentral t distribution for its power.

* :func:`detectable_change` — the minimum detectable change: the smallest true change the
  test would call with probability :data:`~tunelab.stats.results.POWER`, from its standard
  error and degrees of freedom;
* :func:`repeats_needed` — repeats per point for a given change to reach that power.
"""

from __future__ import annotations

import math

from scipy import special

from tunelab.stats.results import MAX_REPEATS_HINT, MIN_PAIRS, POWER

__all__ = ["detectable_change", "power_of", "repeats_needed"]


def power_of(shift: float, df: float, level: float) -> float:
    """Probability that a two-sided t test at nominal ``level`` with ``df`` degrees of
    freedom rejects when the true effect is ``shift`` standard errors (noncentral t)."""
    if not math.isfinite(df) or df > 1e6:
        z = float(special.ndtri(1 - level / 2))
        return float(special.ndtr(shift - z) + special.ndtr(-shift - z))
    crit = float(special.stdtrit(df, 1 - level / 2))
    shift = abs(shift)
    upper = float(1 - special.nctdtr(df, shift, crit))
    lower = float(special.nctdtr(df, shift, -crit))  # the far tail: NaN when negligible
    if math.isnan(upper):  # far out in the tail: the normal approximation
        scale = math.sqrt(1 + crit * crit / (2 * df))
        return float(special.ndtr((shift - crit) / scale) + special.ndtr((-shift - crit) / scale))
    return upper + (0.0 if math.isnan(lower) else lower)


def detectable_change(se_log: float, df: float, level: float, *, power: float = POWER,
                      threshold: float = 0.0) -> float:
    """The minimum detectable change (0.1 = 10 %): the smallest true change a two-sided t
    test at nominal ``level`` with standard error ``se_log`` (of the log speedup) and ``df``
    degrees of freedom calls with probability ``power``; never below ``threshold`` (a
    smaller change is called indistinguishable anyway). NaN for an unknown noise."""
    from scipy.optimize import brentq

    if not (math.isfinite(se_log) and se_log >= 0 and df > 0 and 0 < level < 1):
        return math.nan
    if se_log == 0:
        return threshold
    # the normal approximation's shift, then the noncentral t's root near it
    guess = float(special.stdtrit(df, 1 - level / 2) + special.ndtri(power))
    low, high = max(0.0, guess - 2.0), guess + 2.0
    while power_of(high, df, level) < power:
        low, high = high, high * 2
        if high > 1e6:
            return math.inf
    if power_of(low, df, level) >= power:
        low = 0.0
    shift = float(brentq(lambda s: power_of(s, df, level) - power, low, high, xtol=1e-5))
    if shift * se_log > 50:
        return math.inf
    return max(math.expm1(shift * se_log), threshold)


def repeats_needed(sd_log: float, change: float = 0.05, *, power: float = POWER,
                   confidence: float = 0.95, paired: bool = False, comparisons: int = 1,
                   points: int = 2) -> int | None:
    """Repeats per point for a true ``change`` (0.05 = 5 %) to give a verdict with
    probability ``power``, by the test the verdicts use at the level the study's
    adjustment leaves one of its ``comparisons``.

    ``sd_log`` is the noise: the sd of one run's log figure of merit (≈ relative sd), or,
    with ``paired``, of the per-round log ratio (the paired test on the comparison's own
    noise: standard error ``sd / sqrt(n)``, ``n - 1`` degrees of freedom). Unpaired with
    ``points > 2``: the study-wide pooled paired test, standard error ``sd * sqrt(2 / n)``
    on ``(points - 1)(n - 1)`` degrees of freedom; unpaired with two points: Welch's,
    ``2n - 2``. Paired tests need at least :data:`~tunelab.stats.results.MIN_PAIRS` rounds.
    None when more than :data:`~tunelab.stats.results.MAX_REPEATS_HINT` or ``sd_log`` is
    not a finite number."""
    if not (math.isfinite(sd_log) and sd_log >= 0) or change <= 0:
        return None
    pooled = not paired and points > 2
    floor = MIN_PAIRS if paired or pooled else 2
    if sd_log == 0:
        return floor
    level = (1 - confidence) / max(1, comparisons)
    delta = math.log1p(change)

    def enough(n: int) -> bool:
        if paired:
            se, df = sd_log / math.sqrt(n), n - 1
        elif pooled:
            se, df = sd_log * math.sqrt(2 / n), (points - 1) * (n - 1)
        else:
            se, df = sd_log * math.sqrt(2 / n), 2 * n - 2
        return power_of(delta / se, df, level) >= power

    if not enough(floor):
        low, high = floor, floor * 2  # enough(low) is False; find a high that is enough
        while not enough(high):
            low, high = high, high * 2
            if low > MAX_REPEATS_HINT:
                return None
        while high - low > 1:  # bisection: enough(high), not enough(low)
            mid = (low + high) // 2
            low, high = (low, mid) if enough(mid) else (mid, high)
        floor = high
    return floor if floor <= MAX_REPEATS_HINT else None
