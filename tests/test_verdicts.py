"""The study's verdicts: noise pooled over points, Holm over comparisons, looks round by round
(``repeats: auto``), and the minimum detectable change — simulated through the real
functions (seeded; error rates asserted within two standard errors of the simulation)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from tunelab.stats import (
    SequentialPlan,
    StatsError,
    Verdict,
    compare_to_baseline,
    detectable_change,
    holm_adjust,
    spending_levels,
    still_undecided,
)

CALLS = (Verdict.BETTER, Verdict.WORSE)
BASE = json.dumps({"p": 0})


def table(values: np.ndarray, mask: np.ndarray | None = None) -> pd.DataFrame:
    """A runs table: ``values[point, round]`` (only where ``mask``), point 0 the baseline."""
    mask = np.ones(values.shape, dtype=bool) if mask is None else mask
    pi, ri = np.nonzero(mask)
    return pd.DataFrame({"point": [json.dumps({"p": int(i)}) for i in pi], "status": "ok",
                         "repeat": ri, "fom.wall_s": values[pi, ri]})


def verdicts(runs: pd.DataFrame, **kwargs: object) -> dict[int, object]:
    out = compare_to_baseline(runs, "wall_s", "minimize", BASE, **kwargs)  # type: ignore[arg-type]
    return {pc.summary.params["p"]: pc.comparison for pc in out if not pc.is_baseline}


def tolerance(rate: float, trials: int) -> float:
    return rate + 2 * math.sqrt(rate * (1 - rate) / trials)


def test_a_study_of_equal_points_calls_none_different_in_95_percent_of_studies() -> None:
    """21 equal points, n = 3 (the pooled test is valid from 3 rounds): a false verdict in
    at most 5 % of studies; unadjusted, in most of them."""
    rng = np.random.default_rng(11)
    studies, any_false, any_raw = 300, 0, 0
    for _ in range(studies):
        v = 10 * (1 + rng.normal(0, 0.05, (21, 3)))
        out = verdicts(table(v))
        any_false += any(c.verdict in CALLS for c in out.values())  # type: ignore[attr-defined]
        any_raw += any(c.verdict_unadjusted in CALLS for c in out.values())  # type: ignore[attr-defined]
    assert any_false / studies <= tolerance(0.05, studies)
    assert any_raw / studies > 0.3


def test_pooled_noise_finds_a_ten_percent_change_at_two_percent_noise_with_five_rounds() -> None:
    rng = np.random.default_rng(12)
    studies, found, pooled = 100, 0, 0
    for _ in range(studies):
        v = 10 * (1 + rng.normal(0, 0.02, (21, 5)))
        v[7] /= 1.10
        c = verdicts(table(v))[7]
        found += c.verdict is Verdict.BETTER  # type: ignore[attr-defined]
        pooled += c.test == "paired t, pooled noise" and c.df == 80  # type: ignore[attr-defined]
    assert found / studies >= 0.9
    assert pooled / studies >= 0.85  # the rest: own noise larger than the study's (F test)


def test_a_noisy_point_is_judged_on_its_own_noise() -> None:
    """20 quiet points (1 %) and one 20x noisier point equal to the baseline: the noisy one
    falls back to its own paired t, and is rarely called different."""
    rng = np.random.default_rng(13)
    studies, false, own = 200, 0, 0
    for _ in range(studies):
        v = 10 * np.exp(rng.normal(0, 0.01, (21, 5)))
        v[3] = 10 * np.exp(rng.normal(0, 0.2, 5))
        c = verdicts(table(v))[3]
        own += c.test == "paired t"  # type: ignore[attr-defined]
        false += c.verdict in CALLS  # type: ignore[attr-defined]
    assert own / studies > 0.9
    assert false / studies <= tolerance(0.05, studies)


def test_every_verdict_follows_the_p_shown() -> None:
    rng = np.random.default_rng(14)
    v = 10 * (1 + rng.normal(0, 0.03, (12, 4)))
    v[2] /= 1.08
    v[5] *= 1.05
    for c in verdicts(table(v)).values():
        called = c.verdict in CALLS  # type: ignore[attr-defined]
        beyond = abs(math.log(c.speedup)) >= math.log(1.02)  # type: ignore[attr-defined]
        assert called == (c.p_adjusted < 0.05 and beyond)  # type: ignore[attr-defined]
        assert c.adjustment == "Holm"  # type: ignore[attr-defined]


def test_holm_adjusted_p_values() -> None:
    assert holm_adjust([0.01, 0.04, 0.03, math.nan]) == pytest.approx(
        [0.03, 0.06, 0.06, math.nan], nan_ok=True)


def test_spending_levels_spend_alpha_over_the_looks() -> None:
    assert spending_levels((1.0,), 0.05) == (0.05,)
    levels = spending_levels((0.3, 0.5, 0.7, 1.0), 0.05)
    assert all(a < b for a, b in zip(levels, levels[1:], strict=False))
    assert levels[-1] < 0.05
    # Brownian motion observed at the four looks crosses the boundaries in 5 % of paths
    rng = np.random.default_rng(15)
    t = np.array([0.3, 0.5, 0.7, 1.0])
    w = np.cumsum(rng.normal(size=(200_000, 4)) * np.sqrt(np.diff(t, prepend=0.0)), axis=1)
    from scipy import stats

    p = 2 * stats.norm.sf(np.abs(w / np.sqrt(t)))
    rate = float(np.mean((p < np.array(levels)).any(axis=1)))
    assert 0.045 <= rate <= 0.0505
    with pytest.raises(StatsError, match="increase"):
        spending_levels((0.5, 0.4), 0.05)


def _auto(values: np.ndarray, plan: SequentialPlan) -> tuple[pd.DataFrame, int]:
    """What the runner does with ``repeats: auto``: every point for ``min_rounds``, then
    one round at a time of the baseline and the points still undecided."""
    mask = np.zeros(values.shape, dtype=bool)
    mask[:, : plan.min_rounds] = True
    for r in range(plan.min_rounds, plan.max_rounds):
        undecided = still_undecided(table(values, mask), "wall_s", "minimize", BASE, plan)
        if not undecided:
            break
        mask[0, r] = True
        mask[[json.loads(k)["p"] for k in undecided], r] = True
    return table(values, mask), int(mask.sum())


def test_repeats_auto_looks_again_without_more_false_verdicts() -> None:
    plan = SequentialPlan(3, 10)
    rng = np.random.default_rng(16)
    studies, any_false = 150, 0
    for _ in range(studies):
        runs, _ = _auto(10 * (1 + rng.normal(0, 0.03, (11, 10))), plan)
        out = verdicts(runs, plan=plan)
        any_false += any(c.verdict in CALLS for c in out.values())  # type: ignore[attr-defined]
        assert all(c.adjustment.startswith("Holm, O'Brien") for c in out.values())  # type: ignore[attr-defined]
    assert any_false / studies <= tolerance(0.05, studies)


def test_repeats_auto_stops_a_clear_change_early_and_settles_equal_points() -> None:
    plan = SequentialPlan(3, 10)
    v = 10 * np.exp(np.random.default_rng(17).normal(0, 0.005, (6, 10)))
    v[4] /= 1.3
    runs, used = _auto(v, plan)
    out = verdicts(runs, plan=plan)
    assert out[4].verdict is Verdict.BETTER and out[4].decided  # type: ignore[attr-defined]
    assert all(c.decided for c in out.values())  # type: ignore[attr-defined]
    assert used < 6 * 10  # not every point ran to the budget
    by_point = runs.groupby("point").size()
    assert by_point[json.dumps({"p": 4})] < 10


def test_repeats_auto_stops_hopeless_comparisons_early() -> None:
    """20 % noise, equal points, a budget of 8 rounds: on their trend most comparisons could
    not reach a verdict by the budget, so they stop (decided: indistinguishable) early."""
    plan = SequentialPlan(3, 8)
    v = 10 * np.exp(np.random.default_rng(18).normal(0, 0.2, (8, 8)))
    runs, used = _auto(v, plan)
    assert used < 8 * 8 and runs.groupby("point").size().max() <= 8
    out = verdicts(runs, plan=plan)
    stopped = [c for c in out.values() if c.decided]  # type: ignore[attr-defined]
    assert len(stopped) >= 5
    assert all(c.verdict is Verdict.INDISTINGUISHABLE for c in stopped)  # type: ignore[attr-defined]


def test_repeats_auto_leaves_a_comparison_undecided_at_the_budget() -> None:
    """Per-round log ratios with a trend that keeps a verdict within reach but never
    reaches it: the comparison runs to the budget and stays undecided."""
    plan = SequentialPlan(3, 5)
    d = np.array([0.10, 0.02, 0.06, 0.10, -0.05])
    v = np.vstack([np.full(5, 10.0), 10.0 * np.exp(-d)])
    for looks in (3, 4):
        runs = table(v[:, :looks])
        assert still_undecided(runs, "wall_s", "minimize", BASE, plan) == [json.dumps({"p": 1})]
    runs = table(v)
    assert still_undecided(runs, "wall_s", "minimize", BASE, plan) == []  # the budget
    c = verdicts(runs, plan=plan)[1]
    assert c.decided is False and c.verdict is Verdict.INDISTINGUISHABLE  # type: ignore[attr-defined]


def test_the_minimum_detectable_change_is_seen_in_80_percent_of_studies() -> None:
    """Paired t on 5 rounds at 3 % per-round noise, 20 comparisons (level 0.05 / 20)."""
    from scipy import stats

    sd, n, level = 0.03, 5, 0.05 / 20
    change = detectable_change(sd / math.sqrt(n), n - 1, level)
    rng = np.random.default_rng(19)
    d = rng.normal(math.log1p(change), sd, (20_000, n))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))
    power = float(np.mean(2 * stats.t.sf(np.abs(t), n - 1) < level))
    assert 0.77 <= power <= 0.83
    assert detectable_change(0.0, 4, 0.05, threshold=0.02) == 0.02
    assert math.isnan(detectable_change(math.nan, 4, 0.05))


def test_each_comparison_carries_what_it_could_detect() -> None:
    rng = np.random.default_rng(20)
    quiet = verdicts(table(10 * (1 + rng.normal(0, 0.01, (6, 5)))))
    noisy = verdicts(table(10 * (1 + rng.normal(0, 0.08, (6, 5)))))
    assert all(0.02 <= c.detectable < 0.1 for c in quiet.values())  # type: ignore[attr-defined]
    assert all(c.detectable > 0.1 for c in noisy.values())  # type: ignore[attr-defined]


def test_a_point_with_non_positive_runs_is_judged_on_all_its_runs() -> None:
    """Field test: a maximised FOM whose point ran 1.3, -0.5, 1.31, -0.5, 1.29 (mean 0.58
    against the baseline's 1.0) was called better ×1.30, p 3e-7: its runs <= 0 were
    dropped from the per-round logs. It falls back to Welch's test on all its values."""
    v = np.array([[1.0, 1.01, 0.99, 1.0, 1.02],
                  [1.3, -0.5, 1.31, -0.5, 1.29],
                  [1.0, 0.99, 1.01, 1.0, 1.0]])
    runs = table(v).rename(columns={"fom.wall_s": "fom.x"})
    out = {pc.summary.params["p"]: pc.comparison
           for pc in compare_to_baseline(runs, "x", "maximize", BASE) if not pc.is_baseline}
    assert out[1].test == "Welch t, difference of means"
    assert out[1].difference == pytest.approx(0.58 - 1.004)
    assert math.isnan(out[1].speedup)
    assert out[1].verdict is not Verdict.BETTER
    assert out[2].test == "paired t, pooled noise"


def _gain(v: np.ndarray) -> dict[int, object]:
    runs = table(v).rename(columns={"fom.wall_s": "fom.gain"})
    return {pc.summary.params["p"]: pc.comparison
            for pc in compare_to_baseline(runs, "gain", "maximize", BASE) if not pc.is_baseline}


def test_a_fom_that_crosses_zero_has_no_ratio_only_a_difference() -> None:
    """Field test (study ``gain``): runs on both sides of zero gave best vs runner-up
    ×11.902 [0.000, 3.42e+12], 'detects 333330625584158784.0 %' (Welch's log ratio of two
    means near zero). Now no ratio, interval or detectable change: the difference of means,
    its interval in the FOM's unit and Welch's test on it."""
    v = np.array([[0.02, -0.32, 0.05, 0.03, 0.05],      # baseline, mean -0.034
                  [0.08, 0.04, 0.16, 0.08, 0.15],       # mean 0.102
                  [0.04, -0.20, 0.10, 0.04, 0.06]])     # mean 0.008
    out = _gain(v)
    for c in out.values():
        assert c.test == "Welch t, difference of means"  # type: ignore[attr-defined]
        assert math.isnan(c.speedup) and math.isnan(c.ci_low)  # type: ignore[attr-defined]
        assert math.isnan(c.detectable)  # type: ignore[attr-defined]
        assert c.diff_low < c.difference < c.diff_high  # type: ignore[attr-defined]
    assert out[1].difference == pytest.approx(0.102 - (-0.034))  # type: ignore[attr-defined]
    from tunelab.stats import best
    b = best(table(v).rename(columns={"fom.wall_s": "fom.gain"}), "gain", "maximize")
    assert b.comparison is not None and b.comparison.on_difference
    assert math.isnan(b.comparison.speedup) and math.isnan(b.comparison.detectable)
    assert b.comparison.difference == pytest.approx(0.102 - 0.008)


@pytest.mark.parametrize("v", [
    np.array([[-1.0, -1.1, -0.9], [-0.5, -0.6, -0.4], [-1.0, -1.05, -0.95]]),  # all < 0
    np.array([[1.0, 1.1, 0.9], [-0.5, -0.6, -0.4], [1.0, 1.05, 0.95]]),  # a point's mean < 0
    np.array([[-1.0, -1.1, -0.9], [1.0, 1.1, 0.9], [-1.0, -1.05, -0.95]]),  # the baseline's
    np.zeros((3, 3)),  # all zero
])
def test_a_mean_at_or_below_zero_is_compared_by_difference_not_refused(v: np.ndarray) -> None:
    """A point or a baseline with a mean <= 0 (and an all-zero FOM) was refused ('a ratio
    of means needs a positive figure of merit'): no comparison at all."""
    out = _gain(v)
    assert out[1].test == "Welch t, difference of means"  # type: ignore[attr-defined]
    assert math.isnan(out[1].speedup)  # type: ignore[attr-defined]
    if v[0].max() <= 0:  # a baseline at or below zero: no ratio for any point
        assert out[2].test == "Welch t, difference of means"  # type: ignore[attr-defined]
    if not v.any():
        assert all(c.verdict is Verdict.INDISTINGUISHABLE for c in out.values())  # type: ignore[attr-defined]
    elif v[1].mean() > v[0].mean() + 1:
        assert out[1].verdict is Verdict.BETTER  # type: ignore[attr-defined]


def test_repeats_auto_reports_what_its_budget_detects_for_comparisons_that_stopped() -> None:
    """Field test: 6 equal points at 2 % noise, ``repeats: auto`` 3-10: the comparisons
    that stopped early (curtailed) printed a detectable change of 16 % (median), the
    current look's at the level spent so far, while the same study found a true 5 % change
    in 60 of 60 simulations. Now a comparison that stops without rejecting gives the
    budget's last look's: a change the size printed is found in about 80 % of studies."""
    plan = SequentialPlan(3, 10)
    rng = np.random.default_rng(21)
    printed, found, studies = [], 0, 20
    for _ in range(studies):
        v = 10 * np.exp(rng.normal(0, 0.02, (6, 10)))
        out = verdicts(_auto(v, plan)[0], plan=plan)
        printed += [c.detectable for k, c in out.items() if k > 1 and c.decided]  # type: ignore[attr-defined]
    mdc = float(np.median(printed))
    assert 0.02 <= mdc <= 0.06
    for _ in range(studies):  # a true change of the size printed, through the same looks
        v = 10 * np.exp(rng.normal(0, 0.02, (6, 10)))
        v[1] /= 1 + mdc
        found += verdicts(_auto(v, plan)[0], plan=plan)[1].verdict is Verdict.BETTER  # type: ignore[attr-defined]
    assert found / studies >= 0.65


def test_repeats_auto_stops_a_comparison_without_two_successful_runs_a_side() -> None:
    """Field test: a point whose runs all failed was run again every round up to the
    budget beside the baseline (25 runs of a 3-point study, auto 3-10, instead of 9); with
    the baseline failing, every point was. After ``min`` rounds such a comparison is
    finished (insufficient data)."""
    plan = SequentialPlan(3, 10)
    v = 10 * np.exp(np.random.default_rng(22).normal(0, 0.01, (3, 3)))
    runs = table(v)
    runs.loc[runs["point"] == json.dumps({"p": 2}), "status"] = "failed"
    assert json.dumps({"p": 2}) not in still_undecided(runs, "wall_s", "minimize", BASE, plan)
    assert verdicts(runs, plan=plan)[2].verdict is Verdict.INSUFFICIENT  # type: ignore[attr-defined]
    runs = table(v)
    runs.loc[runs["point"] == BASE, "status"] = "failed"
    assert still_undecided(runs, "wall_s", "minimize", BASE, plan) == []


def test_the_p_shown_is_holms_adjusted_p() -> None:
    """Field test: raw p 0.0013, 0.0128, 0.22 of three comparisons showed 0.0038, 0.0385,
    0.22 (p × 3 for both rejected in Holm's first pass); Holm's adjusted p of the second is
    max(3 × 0.0013, 2 × 0.0128) = 0.0257."""
    rng = np.random.default_rng(23)
    v = 10 * np.exp(rng.normal(0, 0.01, (4, 5)))
    v[1] /= 1.06
    v[2] /= 1.04
    out = verdicts(table(v))
    raw = [out[k].p_value for k in (1, 2, 3)]  # type: ignore[attr-defined]
    assert [out[k].p_adjusted for k in (1, 2, 3)] == pytest.approx(holm_adjust(raw))  # type: ignore[attr-defined]
    assert sum(out[k].verdict in CALLS for k in (1, 2, 3)) >= 2  # type: ignore[attr-defined]


def test_each_interval_agrees_with_the_adjusted_p_beside_it() -> None:
    """Within one study the interval was at 95 % while the p shown was Holm's: a point
    could show [1.04, 1.20] beside 'indistinguishable (p 0.2)'. Each interval is now at the
    level Holm held its p to, so it excludes 1 exactly when the adjusted p is under 5 %."""
    rng = np.random.default_rng(5)
    held = 0
    for _ in range(30):
        v = 10 * (1 + rng.normal(0, 0.05, (21, 3)))
        v[1:6] /= 1.08
        for c in verdicts(table(v)).values():
            held += c.p_value < 0.05 <= c.p_adjusted  # type: ignore[attr-defined]
            excludes = not (c.ci_low <= 1.0 <= c.ci_high)  # type: ignore[attr-defined]
            assert excludes == (c.p_adjusted < 0.05)  # type: ignore[attr-defined]
    assert held > 0


def test_an_interval_at_an_early_looks_tiny_level_does_not_overflow() -> None:
    """repeats: auto holds an early look to a tiny level (4e-8 at 3 of 10 rounds): its
    interval at that level, on a noisy comparison's own 2 degrees of freedom, is wider than
    a float; it raised OverflowError in compare_to_baseline."""
    from tunelab.stats.intervals import TestResult, comparison_from_test

    t = TestResult("paired t", 0.1, 0.5, 2.0, 0.8, 0.9, 3, 3)
    c = comparison_from_test(t, np.ones(3), np.ones(3), "minimize", noise_threshold=0.02,
                             confidence=0.95, level=1e-12)
    assert c.ci_high == math.inf and c.ci_low >= 0
