"""Deciding many comparisons with the baseline, once or round after round, at a known error.

**The family.** A study compares its m other points with the baseline. A false verdict in any
of them makes a false study, so the verdicts control the family-wise error: Holm's step-down
procedure (valid under any dependence; the comparisons share the baseline's runs): a
comparison is rejected at ``alpha / (m - r)`` once r others are, until none is left
rejectable. At most ``1 - confidence`` of studies whose points all equal the baseline call
any point faster or slower.

**Looking again** (``repeats: auto``, :class:`SequentialPlan`). The study adds a round of the
undecided points (and the baseline) after each look, from ``min_rounds`` rounds up to
``max_rounds``. Testing each look at the full level would inflate the error (with ten looks,
a 5 % test calls a false difference in about 20 % of studies), so each comparison spends
its level over the looks by the Lan–DeMets O'Brien–Fleming spending function
``alpha(t) = 2 − 2 Φ(z_{1−alpha/2} / sqrt(t))`` of the information fraction ``t = c /
max_rounds`` (c: the rounds it has paired so far): :func:`spending_levels` computes the
nominal level of each look by the recursive integration of Armitage, McPherson and Rowe,
on the z scale of a Brownian motion, and the t test's p is held against it (Jennison &
Turnbull's significance-level approach). Holm's step-down composes with it (Maurer & Bretz,
2013: group-sequential graphical procedures): a rejection passes its level on to the
others for the current and later looks. With one look at ``t = 1`` the nominal level is the
level itself, so a fixed design is the same procedure with a single look.

A comparison is **decided** when it is rejected; when its interval at ``1 − 2 (1 −
confidence)`` (a two one-sided tests equivalence check at the study's level) lies inside the
noise threshold: no change that matters is left to find; or when, on its current trend, the
budget's last look would reject it with a probability under :data:`FUTILITY` (conditional
power, the B-value of Lan & Wittes: the stochastic curtailment of group-sequential
designs): more rounds would very likely end indistinguishable anyway. Stopping to accept
equality never raises the false-verdict rate. A comparison still undecided at
``max_rounds`` stays undecided (indistinguishable, and said so). One that has fewer than
two successful runs on a side after ``min_rounds`` is finished (insufficient data): the
rounds of a point that keeps failing, or of every point when the baseline does, would
mostly repeat the failures up to the budget.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy import special

from tunelab.stats.intervals import TestResult, comparison_at_level
from tunelab.stats.pooled import RoundTable, study_tests
from tunelab.stats.results import (
    ADJUST_HOLM,
    MIN_PAIRS,
    TEST_WELCH_DIFF,
    Comparison,
    StatsError,
    Verdict,
)
from tunelab.stats.summaries import Group

__all__ = ["Decision", "SequentialPlan", "decide", "holm_adjust", "holm_family",
           "holm_levels", "spending_levels"]

_GRID = 401

FUTILITY = 0.10
"""A comparison stops early when the last look would reject it with less than this
probability on its current trend (conditional power)."""


@dataclass(frozen=True)
class SequentialPlan:
    """``repeats: auto``: at least ``min_rounds`` rounds of every point, then rounds of the
    undecided points until each comparison is decided or ``max_rounds`` (the budget)."""

    min_rounds: int = MIN_PAIRS
    max_rounds: int = 10

    def __post_init__(self) -> None:
        if not MIN_PAIRS <= self.min_rounds <= self.max_rounds:
            raise StatsError(f"repeats: auto needs {MIN_PAIRS} <= min ({self.min_rounds}) <= "
                             f"max ({self.max_rounds})")


def _spent(t: float, alpha: float) -> float:
    """O'Brien–Fleming-type spending: the share of ``alpha`` spent by information ``t``."""
    return float(2 * special.ndtr(special.ndtri(alpha / 2) / math.sqrt(t)))


def _exit_mass(bound: float, grid: np.ndarray, weights: np.ndarray, step: float) -> float:
    """Mass that moves from the grid (S at the last look) beyond ±``bound`` by the next."""
    out = special.ndtr((grid - bound) / step) + special.ndtr((-bound - grid) / step)
    return float(weights @ out)


@functools.lru_cache(maxsize=4096)
def _levels(fractions: tuple[float, ...], alpha: float) -> tuple[float, ...]:
    """The recursion of :func:`spending_levels` on S = W(t), the Brownian motion of which
    ``Z = S / sqrt(t)`` is the test statistic: at each look the boundary ±b that lets the
    look's share of ``alpha`` exit, then the sub-density of S inside it for the next."""
    from scipy.optimize import brentq

    levels: list[float] = []
    grid = np.zeros(1)
    weights = np.ones(1)  # the probability mass at each grid point (all of it at S = 0)
    spent, before = 0.0, 0.0
    for t in fractions:
        target = max(_spent(t, alpha) - spent, 0.0)
        step = math.sqrt(t - before)
        if target <= 0:
            bound = math.inf
        elif _exit_mass(60.0, grid, weights, step) >= target:
            bound = 60.0
        else:
            bound = float(brentq(lambda b, g=grid, w=weights, s=step, want=target:
                                 _exit_mass(b, g, w, s) - want, 1e-9, 60.0, xtol=1e-10))
        levels.append(float(2 * special.ndtr(-bound / math.sqrt(t))))
        inner = np.linspace(-1, 1, _GRID) * min(bound, 12.0 * math.sqrt(t))
        density = (np.exp(-0.5 * ((inner[:, None] - grid[None, :]) / step) ** 2)
                   / (step * math.sqrt(2 * math.pi))) @ weights
        weights = density * np.gradient(inner)
        grid, spent, before = inner, spent + target, t
    return tuple(levels)


def spending_levels(fractions: tuple[float, ...], alpha: float) -> tuple[float, ...]:
    """Nominal two-sided levels, one per look at the information ``fractions`` (strictly
    increasing, in (0, 1]), that together spend ``alpha`` by the O'Brien–Fleming-type
    function (module docstring); the last is ``alpha`` itself for a single look at 1."""
    if not fractions or any(not 0 < f <= 1 for f in fractions) or any(
            b <= a for a, b in zip(fractions, fractions[1:], strict=False)):
        raise StatsError(f"information fractions must increase within (0, 1], got {fractions}")
    if len(fractions) == 1 and fractions[0] == 1.0:
        return (alpha,)
    return _levels(tuple(round(f, 9) for f in fractions), alpha)


@dataclass
class Decision:
    """Where one comparison stands: its test at its last look (None: never testable),
    whether it was rejected, the nominal level its p was last held against, the information
    fractions of its looks, and whether it is ``decided`` (rejected, or equal within the
    noise threshold) or ``finished`` (decided, or at the budget)."""

    test: TestResult | None = None
    rejected: bool = False
    level: float = math.nan
    fractions: list[float] = field(default_factory=list)
    decided: bool = False
    finished: bool = False
    p_adjusted: float = math.nan
    """Holm's adjusted p of a single look (the running maximum of ``(m - i) p_(i)`` over
    the sorted p-values): under ``1 - confidence`` exactly when the comparison is rejected.
    NaN under ``repeats: auto``, whose looks hold each p against its own spent level."""
    budget: tuple[float, float] | None = None
    """For a comparison that stopped early without rejecting (equal within the threshold,
    or curtailed), the standard error and nominal level of the budget's last look: the
    look the study would have gone on to had the change been there, at which its minimum
    detectable change is reckoned (the current look's, at the level spent so far, is
    several times larger: 16 % where the study finds 5 % in 60 of 60 simulations)."""


def _equivalent(t: TestResult, confidence: float, noise_threshold: float) -> bool:
    """Two one-sided tests at ``1 - confidence``: the interval at ``1 − 2(1 − confidence)``
    lies inside ± the noise threshold (log scale)."""
    if noise_threshold <= 0 or not math.isfinite(t.se) or t.test == TEST_WELCH_DIFF:
        return False  # a difference of means has no relative scale to hold it against
    half = float(special.stdtrit(t.df, confidence)) * t.se
    margin = math.log1p(noise_threshold)
    return -margin < t.estimate - half and t.estimate + half < margin


def _futile(t: TestResult, fractions: list[float], share: float) -> bool:
    """Whether the last look (information 1) would reject on the current trend with
    probability under :data:`FUTILITY`: with z the test statistic at information fraction
    f, the B-value z·sqrt(f) grows by z/sqrt(f) per unit of information, with variance
    1 − f still to come."""
    f = fractions[-1]
    if f >= 1 or t.se <= 0 or not math.isfinite(t.se):
        return False
    final = spending_levels((*fractions, 1.0), share)[-1]
    bound = float(special.ndtri(1 - final / 2))
    z = abs(t.estimate) / t.se
    mean = z * math.sqrt(f) + z / math.sqrt(f) * (1 - f)
    power = float(special.ndtr((mean - bound) / math.sqrt(1 - f)))
    return power < FUTILITY


def decide(groups: Mapping[str, Group], baseline: str, direction: str, *,
           confidence: float = 0.95, noise_threshold: float = 0.02,
           plan: SequentialPlan | None = None, adjust: bool = True) -> dict[str, Decision]:
    """Every point of ``groups`` but ``baseline`` against it, with the family-wise error
    at ``1 - confidence`` (module docstring): one look at all the runs (``plan`` None), or
    the looks of ``plan`` replayed round by round from the runs. Without ``adjust`` each
    comparison is tested at the full level, as if it were the only one. Returns a
    :class:`Decision` per point key."""
    alpha = 1 - confidence
    keys = [k for k in groups if k != baseline]
    out = {k: Decision() for k in keys}
    m = len(keys) if adjust else 1
    table = RoundTable.of(groups)
    if plan is None:
        tests = study_tests(groups, baseline, direction, table=table)
        tested = {k: t for k, t in tests.items() if t is not None}
        _holm(tested, out, alpha, m, lambda k, a: a, adjust)
        running = 0.0
        for step, k in enumerate(sorted(tested, key=lambda k: tested[k].p)):
            running = max(running, min(1.0, (m - step if adjust else 1) * tested[k].p))
            out[k].p_adjusted = running if adjust else tested[k].p
        for k, t in tests.items():
            out[k].test = t
        return out
    rounds = [int(g.rounds.max()) + 1 for g in groups.values()
              if g.rounds is not None and g.rounds.size]
    last = min(max(rounds, default=0), plan.max_rounds)
    for look in range(plan.min_rounds, last + 1):
        tests = study_tests(groups, baseline, direction, look, table=table)
        current: dict[str, TestResult] = {}
        for k in keys:
            state = out[k]
            t = tests[k]
            if state.finished:
                continue
            if t is None:  # after min_rounds a side has fewer than two successful runs:
                state.finished = True  # more rounds would mostly repeat its failures
                continue
            info = max(t.n, 1)
            fraction = min(1.0, info / plan.max_rounds)
            if state.fractions and fraction <= state.fractions[-1]:
                continue  # no new round for this comparison since its last look
            state.fractions.append(fraction)
            state.test = t
            current[k] = t
        _holm(current, out, alpha, m,
              lambda k, a: spending_levels(tuple(out[k].fractions), a)[-1], adjust)
        share = alpha / max(1, m - sum(1 for d in out.values() if d.rejected))
        for k, t in current.items():
            state = out[k]
            spend = share if adjust else alpha
            state.decided = (state.rejected or _equivalent(t, confidence, noise_threshold)
                             or _futile(t, state.fractions, spend))
            state.finished = state.decided or t.n >= plan.max_rounds
            state.budget = None
            if state.decided and not state.rejected and state.fractions[-1] < 1:
                state.budget = (t.se * math.sqrt(state.fractions[-1]),
                                spending_levels((*state.fractions, 1.0), spend)[-1])
    return out


def _holm(tests: Mapping[str, TestResult], out: dict[str, Decision], alpha: float, m: int,
          level_for: Callable[[str, float], float], adjust: bool) -> None:
    """Holm's step-down over ``tests`` (order-free form: reject any whose p is under its
    level at ``alpha / (m - r)`` with r the rejections so far, until none is), recording
    each test's last level in ``out``."""
    rejected = sum(1 for d in out.values() if d.rejected)
    changed = True
    while changed:
        changed = False
        share = alpha / max(1, m - rejected) if adjust else alpha
        for k, t in tests.items():
            state = out[k]
            if state.rejected:
                continue
            state.level = level_for(k, share)
            if t.p < state.level:
                state.rejected, rejected, changed = True, rejected + 1, True


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm's adjusted p-values of one family (NaN ones are left out of it and stay NaN):
    a hypothesis is rejected at level ``alpha`` by Holm's step-down exactly when its
    adjusted p is under ``alpha``."""
    index = sorted((i for i, p in enumerate(p_values) if not math.isnan(p)),
                   key=lambda i: p_values[i])
    out = [math.nan] * len(p_values)
    m, running = len(index), 0.0
    for step, i in enumerate(index):
        running = max(running, min(1.0, (m - step) * p_values[i]))
        out[i] = running
    return out


def holm_family(comparisons: Sequence[Comparison]) -> list[Comparison]:
    """One family of comparisons (each decided by its own test, at its own ``confidence``)
    judged together by Holm: each gets its adjusted p, a verdict that stands only when that
    p is under ``1 - confidence``, and its interval at the level Holm held its raw p to (so
    that it excludes no change exactly when the verdict stands). A family of one is left as
    it is."""
    if len(comparisons) < 2:
        return list(comparisons)
    alpha = 1 - comparisons[0].confidence
    raw = [c.p_value for c in comparisons]
    out = []
    for c, p, level in zip(comparisons, holm_adjust(raw), holm_levels(raw, alpha),
                           strict=True):
        if c.verdict is Verdict.INSUFFICIENT:
            out.append(c)
            continue
        verdict = c.verdict if p < 1 - c.confidence else Verdict.INDISTINGUISHABLE
        out.append(comparison_at_level(
            replace(c, p_adjusted=p, adjustment=ADJUST_HOLM, verdict=verdict), level))
    return out


def holm_levels(p_values: Sequence[float], alpha: float) -> list[float]:
    """The nominal level Holm's step-down held each p of one family against (NaN ones are
    left out and get NaN): ``alpha / (m - i)`` at the step that rejected it, else
    ``alpha / (m - r)`` with r the rejections, where the procedure stopped. A p is under
    its level exactly when its :func:`holm_adjust` p is under ``alpha``, so an interval at
    ``1 - level`` excludes no change exactly when the comparison is rejected."""
    index = sorted((i for i, p in enumerate(p_values) if not math.isnan(p)),
                   key=lambda i: p_values[i])
    out = [math.nan] * len(p_values)
    m, rejected = len(index), 0
    for step, i in enumerate(index):
        level = alpha / (m - rejected)
        if rejected == step and p_values[i] < level:
            rejected += 1
        out[i] = level
    return out
