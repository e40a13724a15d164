"""Behaviour of tunelab.stats on hand-built runs tables (seeded numpy data)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from tunelab.errors import TunelabError
from tunelab.stats import (
    StatsError,
    Verdict,
    best,
    compare,
    compare_to_baseline,
    paired_interval,
    summarize,
    verdict_label,
)


def _key(**params: object) -> str:
    return json.dumps(params, sort_keys=True)


def make_runs(
    samples: dict[str, list[float]],
    failures: dict[str, list[str]] | None = None,
    fom: str = "wall_s",
) -> pd.DataFrame:
    """A runs table in the store's layout: one row per run, point = {"np": <label>}."""
    rows: list[dict[str, object]] = []
    run_id = 0
    for point_id, (label, values) in enumerate(samples.items()):
        statuses = ["ok"] * len(values) + list((failures or {}).get(label, []))
        for repeat, status in enumerate(statuses):
            ok = status == "ok"
            value = values[repeat] if ok else math.nan
            rows.append(
                {
                    "run_id": run_id,
                    "point_id": point_id,
                    "point": _key(np=label),
                    "repeat": repeat,
                    "status": status,
                    "reason": None if ok else f"exit 1 ({status})",
                    "rc": 0 if ok else 1,
                    "wall_s": value,
                    "started_at": "2026-01-01T00:00:00",
                    "ended_at": "2026-01-01T00:00:01",
                    "host": "h",
                    "np": label,
                    f"fom.{fom}": value,
                }
            )
            run_id += 1
    return pd.DataFrame(rows)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261122)


# ---------------------------------------------------------------- compare


def test_clearly_faster_sample_is_better_with_ci_excluding_one(rng: np.random.Generator) -> None:
    a = rng.normal(10.0, 0.3, 8)  # baseline: 10 s
    b = rng.normal(8.0, 0.3, 8)  # 20 % less time
    c = compare(a, b, "minimize")
    assert c.verdict is Verdict.BETTER
    assert c.ci_low > 1.0 and c.ci_high > c.ci_low
    assert c.speedup == pytest.approx(a.mean() / b.mean())
    assert c.p_value < 0.01
    assert verdict_label(c.verdict, "wall_s", "minimize") == "faster"


def test_same_distribution_is_indistinguishable(rng: np.random.Generator) -> None:
    a, b = rng.normal(5.0, 0.5, 10), rng.normal(5.0, 0.5, 10)
    c = compare(a, b, "minimize")
    assert c.verdict is Verdict.INDISTINGUISHABLE
    assert c.ci_low <= 1.0 <= c.ci_high
    assert c.p_value > 0.05


def test_one_percent_real_difference_is_under_noise_threshold(rng: np.random.Generator) -> None:
    a = rng.normal(100.0, 0.01, 10)
    b = rng.normal(99.0, 0.01, 10)  # a real, resolvable 1 % gain
    c = compare(a, b, "minimize")
    assert c.ci_low > 1.0  # the CI alone would call it a win ...
    assert c.verdict is Verdict.INDISTINGUISHABLE  # ... the 2 % noise threshold does not
    tight = compare(a, b, "minimize", noise_threshold=0.005)
    assert tight.verdict is Verdict.BETTER


def test_maximize_and_minimize_flip_the_ratio(rng: np.random.Generator) -> None:
    a, b = rng.normal(100.0, 1.0, 6), rng.normal(150.0, 1.0, 6)
    as_time = compare(a, b, "minimize")
    as_rate = compare(a, b, "maximize")
    assert as_time.speedup == pytest.approx(1.0 / as_rate.speedup)
    assert as_rate.speedup > 1.4 and as_rate.verdict is Verdict.BETTER
    assert as_time.verdict is Verdict.WORSE
    assert as_time.ci_high < 1.0
    assert verdict_label(as_rate.verdict, "throughput", "maximize") == "faster"
    assert verdict_label(as_time.verdict, "wall_s", "minimize") == "slower"
    assert verdict_label(as_rate.verdict, "accuracy", "maximize") == "better"


@pytest.mark.parametrize(("a", "b"), [([1.0], [2.0, 2.1]), ([1.0, 1.1], [2.0]), ([], [1.0, 2.0])])
def test_fewer_than_two_values_is_insufficient_data(a: list[float], b: list[float]) -> None:
    c = compare(a, b, "minimize")
    assert c.verdict is Verdict.INSUFFICIENT
    assert math.isnan(c.ci_low) and math.isnan(c.p_value)
    assert (c.n_a, c.n_b) == (len(a), len(b))


def test_constant_samples_do_not_crash() -> None:
    same = compare([3.0] * 5, [3.0] * 5, "minimize")
    assert same.verdict is Verdict.INDISTINGUISHABLE
    assert same.speedup == 1.0 and same.ci_low == 1.0 == same.ci_high
    apart = compare([4.0] * 5, [2.0] * 5, "minimize")
    assert apart.verdict is Verdict.BETTER
    assert apart.speedup == pytest.approx(2.0) and apart.ci_low == pytest.approx(2.0)


def test_the_noise_threshold_is_symmetric_on_the_log_scale() -> None:
    """2 % faster and 2 % slower (1/1.02) are changes of the same size: both pass."""
    a = [10.0, 10.001, 9.999, 10.0, 10.0]
    faster = compare(a, [x / 1.02 for x in a], "minimize")
    slower = compare(a, [x * 1.02 for x in a], "minimize")
    assert faster.verdict is Verdict.BETTER and slower.verdict is Verdict.WORSE
    just_under = compare(a, [x * 1.019 for x in a], "minimize")
    assert just_under.p_value < 1e-6 and just_under.verdict is Verdict.INDISTINGUISHABLE


def test_rounds_that_do_not_match_the_values_are_a_stats_error() -> None:
    with pytest.raises(StatsError, match="3 values but 2 rounds"):
        compare([1.0, 1.1, 1.2], [1.0, 1.1, 1.2], "minimize", rounds=([0, 1], [0, 1, 2]))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"direction": "fastest"}, "direction"),
        ({"direction": "minimize", "confidence": 1.5}, "confidence"),
    ],
)
def test_bad_arguments_raise_tunelab_errors(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"a_values": [1.0, 2.0], "b_values": [1.0, 2.0]}
    args.update(kwargs)
    with pytest.raises(TunelabError, match=message):
        compare(**args)  # type: ignore[arg-type]


# ---------------------------------------------------------------- summarize


def test_summarize_counts_only_ok_runs_and_failures_by_status() -> None:
    runs = make_runs(
        {"1": [1.0, 2.0, 3.0, 6.0], "2": []},
        failures={"1": ["failed", "timeout"], "2": ["failed", "failed"]},
    )
    runs.loc[3, "fom.wall_s"] = math.nan  # an ok run without a value
    s1, s2 = summarize(runs, "wall_s")
    assert (s1.point, s1.params) == (_key(np="1"), {"np": "1"})
    assert s1.n == 3 and s1.mean == pytest.approx(2.0) and s1.median == 2.0
    assert s1.std == pytest.approx(1.0) and (s1.min, s1.max) == (1.0, 3.0)
    assert s1.failed == {"failed": 1, "missing": 1, "timeout": 1} and s1.n_failed == 3
    assert s2.n == 0 and math.isnan(s2.mean) and s2.failed == {"failed": 2}


def test_summarize_unknown_fom_names_the_available_ones() -> None:
    with pytest.raises(StatsError, match="'gflops'.*available: wall_s"):
        summarize(make_runs({"1": [1.0]}), "gflops")


# ---------------------------------------------------------------- baseline / best


def test_compare_to_baseline_ranks_best_first(rng: np.random.Generator) -> None:
    runs = make_runs(
        {
            "base": list(rng.normal(10, 0.2, 5)),
            "fast": list(rng.normal(6, 0.2, 5)),
            "slow": list(rng.normal(14, 0.2, 5)),
            "dead": [],
        },
        failures={"dead": ["timeout"] * 3},
    )
    base = json.dumps({"np": "base"})  # unsorted spacing is fine: matched by content
    ranked = compare_to_baseline(runs, "wall_s", "minimize", base)
    assert [pc.summary.params["np"] for pc in ranked] == ["fast", "base", "slow", "dead"]
    assert [pc.rank for pc in ranked] == [1, 2, 3, 4]
    verdicts = [pc.comparison.verdict for pc in ranked]
    assert verdicts == [
        Verdict.BETTER,
        Verdict.INDISTINGUISHABLE,
        Verdict.WORSE,
        Verdict.INSUFFICIENT,
    ]
    assert [pc.is_baseline for pc in ranked] == [False, True, False, False]
    assert ranked[3].summary.failed == {"timeout": 3}


def test_compare_to_baseline_errors() -> None:
    runs = make_runs({"a": [1.0, 1.1], "b": []}, failures={"b": ["failed"]})
    with pytest.raises(StatsError, match="has no runs in this study"):
        compare_to_baseline(runs, "wall_s", "minimize", _key(np="zzz"))
    with pytest.raises(StatsError, match=r"no successful run.*1 failed"):
        compare_to_baseline(runs, "wall_s", "minimize", _key(np="b"))


def test_best_well_separated(rng: np.random.Generator) -> None:
    runs = make_runs(
        {
            "a": list(rng.normal(20, 0.5, 6)),
            "b": list(rng.normal(12, 0.5, 6)),
            "c": list(rng.normal(10, 0.5, 6)),
        }
    )
    result = best(runs, "wall_s", "minimize")
    assert result.best.params == {"np": "c"} and result.runner_up is not None
    assert result.runner_up.params == {"np": "b"}
    assert result.comparison is not None and result.comparison.verdict is Verdict.BETTER
    assert result.comparison.speedup > 1.0
    assert result.p_beats_runner_up is not None and result.p_beats_runner_up > 0.99
    # maximising the same numbers crowns the other end
    assert best(runs, "wall_s", "maximize").best.params == {"np": "a"}


def test_best_identical_points_is_a_coin_toss(rng: np.random.Generator) -> None:
    values = list(rng.normal(10, 1.0, 8))
    runs = make_runs({"a": values, "b": values[::-1]})
    result = best(runs, "wall_s", "minimize")
    assert result.p_beats_runner_up == pytest.approx(0.5, abs=0.05)
    assert result.comparison is not None
    assert result.comparison.verdict is Verdict.INDISTINGUISHABLE


def test_best_single_point_and_failures() -> None:
    one = best(make_runs({"a": [1.0, 1.2]}), "wall_s", "minimize")
    assert one.best.params == {"np": "a"}
    assert one.runner_up is None and one.comparison is None and one.p_beats_runner_up is None
    all_failed = make_runs({"a": [], "b": []}, failures={"a": ["failed"], "b": ["timeout"] * 2})
    with pytest.raises(StatsError, match=r"no successful run.*3 runs.*1 failed, 2 timeout"):
        best(all_failed, "wall_s", "minimize")
    with pytest.raises(StatsError, match="no runs"):
        best(pd.DataFrame(), "wall_s", "minimize")


def test_three_runs_each_give_a_verdict_for_a_clear_gap_but_not_for_noise() -> None:
    # A 2x gap is a verdict with 3 runs each (a rank test's p could not go below 0.1 here;
    # the p shown is the Welch t's, the test that decides).
    c = compare([10.0, 10.1, 9.9], [5.0, 5.1, 4.9], "minimize")
    assert c.verdict is Verdict.BETTER and c.test == "Welch t"
    assert c.ci_low > 1.9 and c.p_value < 0.001 and c.p_adjusted == c.p_value
    # 3 % apart with 5 % noise: the interval is wide enough to contain 1.
    noisy = compare([10.0, 10.5, 9.5], [9.7, 10.2, 9.2], "minimize")
    assert noisy.verdict is Verdict.INDISTINGUISHABLE and noisy.ci_low < 1 < noisy.ci_high


def test_the_interval_and_the_p_are_the_welch_tests_without_rounds() -> None:
    from scipy import stats as st

    a, b = np.array([10.0, 10.4, 9.8]), np.array([9.0, 9.5, 8.8])
    c = compare(a, b, "minimize")
    va = a.var(ddof=1) / (3 * a.mean() ** 2)
    vb = b.var(ddof=1) / (3 * b.mean() ** 2)
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    half = st.t.ppf(0.975, df) * np.sqrt(va + vb)
    ratio = a.mean() / b.mean()
    assert c.ci_low == pytest.approx(ratio * np.exp(-half))
    assert c.ci_high == pytest.approx(ratio * np.exp(half))
    assert c.p_value == pytest.approx(2 * st.t.sf(np.log(ratio) / np.sqrt(va + vb), df))
    # the verdict follows the p shown: under 5 % and beyond the threshold
    assert (c.verdict is Verdict.BETTER) == (c.p_value < 0.05)


def test_best_names_the_point_with_the_better_mean_when_it_is_not_the_best() -> None:
    """compare lists points by their mean; best crowns the most likely best on the log
    scale. Where they differ (a spread-out point whose mean a single fast run lifts), best
    says so, with that point's probability (stop 43: merge-transports, 1.098e8 listed first
    by compare, the 1.091e8 baseline crowned by best, unexplained)."""
    runs = make_runs({"spread": [50.0, 150.0, 160.0], "steady": [115.0, 116.0, 117.0]},
                     fom="throughput")
    result = best(runs, "throughput", "maximize")
    assert result.best.params == {"np": "steady"}
    assert result.top_by_mean is not None and result.top_by_mean.params == {"np": "spread"}
    assert result.p_best is not None and result.p_top_by_mean is not None
    assert result.p_top_by_mean < result.p_best
    from tunelab.report.table import best_lines

    line = next(x for x in best_lines(result) if "has the better mean" in x)
    assert line.startswith("np=spread has the better mean (120, n=3; compare lists it first)")
    steady = best(make_runs({"a": [100.0, 101.0], "b": [120.0, 121.0]}, fom="throughput"),
                  "throughput", "maximize")
    assert steady.top_by_mean is None and steady.p_top_by_mean is None


def test_best_ignores_a_single_lucky_run(rng: np.random.Generator) -> None:
    runs = make_runs(
        {"lucky": [1.0], "a": list(rng.normal(10, 0.2, 5)), "b": list(rng.normal(12, 0.2, 5))},
        failures={"lucky": ["failed"] * 4},
    )
    result = best(runs, "wall_s", "minimize")
    assert result.best.params == {"np": "a"}
    assert result.runner_up is not None and result.runner_up.params == {"np": "b"}
    assert best(runs, "wall_s", "minimize", min_n=1).best.params == {"np": "lucky"}


# ---------------------------------------------------------------- error rates by simulation
#
# Every rate below is measured on seeded, vectorised simulations. The verdict of
# ``compare`` needs its test (Welch's t of the log ratio, or the paired t over rounds) to
# reject, so the trials where that test rejects are the only ones that can give a false
# verdict: ``compare`` itself is called on exactly those, which counts its false verdicts
# over all trials at a fraction of the cost.


def _noise(kind: str, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Run times around 10 s: normal 5 %, lognormal (sigma 0.2), or 2 % normal with
    occasional (10 %) 2x outliers."""
    if kind == "normal":
        return 10.0 * (1.0 + rng.normal(0.0, 0.05, shape))
    if kind == "lognormal":
        return 10.0 * np.exp(rng.normal(0.0, 0.2, shape))
    outlier = rng.random(shape) < 0.1
    return 10.0 * (1.0 + rng.normal(0.0, 0.02, shape)) * np.where(outlier, 2.0, 1.0)


def _welch_rejects(a: np.ndarray, b: np.ndarray, confidence: float = 0.95) -> np.ndarray:
    """Per row: does the Welch t interval of log(mean a / mean b) exclude 0?"""
    from scipy import stats as st

    n_a, n_b = a.shape[1], b.shape[1]
    ma, mb = a.mean(axis=1), b.mean(axis=1)
    va = a.var(axis=1, ddof=1) / (n_a * ma**2)
    vb = b.var(axis=1, ddof=1) / (n_b * mb**2)
    df = (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1))
    t = np.abs(np.log(ma / mb)) / np.sqrt(va + vb)
    return t > st.t.ppf(0.5 + confidence / 2, df)


def _false_verdicts(a: np.ndarray, b: np.ndarray, rounds: bool = False) -> float:
    """Share of trials (rows) where ``compare`` calls identical samples different."""
    if rounds:
        candidates = np.flatnonzero(_paired_rejects(a, b))
        ra, rb = np.arange(a.shape[1]), np.arange(b.shape[1])
    else:
        candidates = np.flatnonzero(_welch_rejects(a, b))
    false = 0
    for i in candidates:
        c = compare(a[i], b[i], "minimize", rounds=(ra, rb) if rounds else None)
        false += c.verdict in (Verdict.BETTER, Verdict.WORSE)
    return false / a.shape[0]


def _paired_rejects(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row: does the paired t interval over the common rounds exclude 0?"""
    from scipy import stats as st

    n = min(a.shape[1], b.shape[1])
    d = np.log(a[:, :n]) - np.log(b[:, :n])
    t = np.abs(d.mean(axis=1)) / (d.std(axis=1, ddof=1) / np.sqrt(n))
    return t > st.t.ppf(0.975, n - 1)


@pytest.mark.parametrize("kind", ["normal", "lognormal", "heavy-tailed"])
@pytest.mark.parametrize("n", [3, 5, 10])
def test_a_a_false_verdicts_stay_at_most_five_percent(kind: str, n: int) -> None:
    rng = np.random.default_rng(1000 + n)
    trials = 3000
    a, b = _noise(kind, rng, (trials, n)), _noise(kind, rng, (trials, n))
    assert _false_verdicts(a, b) <= 0.05


@pytest.mark.parametrize("n", [3, 5, 10])
def test_paired_analysis_keeps_false_verdicts_under_drift_where_unpaired_does_not(n: int) -> None:
    """The machine slows 3 % per round; the baseline was run in twice as many rounds as the
    point (e.g. it kept racing). Identical points: every verdict is false."""
    rng = np.random.default_rng(2000 + n)
    trials = 2000
    drift = 1.0 + 0.03 * np.arange(2 * n)
    a = _noise("normal", rng, (trials, 2 * n)) * drift
    b = _noise("normal", rng, (trials, n)) * drift[:n]
    paired = _false_verdicts(a, b, rounds=True)
    unpaired = _false_verdicts(a[:300], b[:300]) * trials / 300
    # The paired t test is exact here (its rate *is* 5 %): allow two standard errors of
    # the simulation's own estimate, 0.0097 at 2000 trials.
    assert paired <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / trials)
    assert unpaired > 0.15


def test_paired_interval_uses_common_rounds_and_decides_when_complete() -> None:
    a = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]  # a machine slowing down round by round
    b = [9.5, 10.45, 11.4, 12.35]  # 5 % faster in each of its rounds
    c = compare(a, b, "minimize", rounds=(range(6), range(4)))
    assert c.paired and c.test == "paired t" and c.n_pairs == 4
    assert c.verdict is Verdict.BETTER
    assert c.speedup == pytest.approx(1 / 0.95) and c.ci_low > 1.0
    unpaired = compare(a, b, "minimize")
    assert unpaired.ci_low < 1.0 < unpaired.ci_high  # unpaired, the drift hides the change
    # three rounds in common still pair; two do not
    three = compare(a, b, "minimize", rounds=(range(6), [0, 1, 2, 9]))
    assert three.test == "paired t" and three.n_pairs == 3
    two = compare(a, b, "minimize", rounds=(range(6), [0, 1, 8, 9]))
    assert two.test == "Welch t" and not two.paired
    interval = paired_interval(a, range(6), b, [0, 1, 2, 9], "minimize")
    assert interval is not None and interval.n_pairs == 3 and not interval.complete


def test_compare_to_baseline_adjusts_verdicts_for_multiple_comparisons() -> None:
    rng = np.random.default_rng(4)
    samples = {"base": list(10 * (1 + rng.normal(0, 0.05, 5)))}
    for i in range(12):
        samples[f"same{i}"] = list(10 * (1 + rng.normal(0, 0.05, 5)))
    samples["fast"] = list(7 * (1 + rng.normal(0, 0.05, 5)))
    runs = make_runs(samples)
    single = compare_to_baseline(runs, "wall_s", "minimize", _key(np="base"), adjust=False)
    family = compare_to_baseline(runs, "wall_s", "minimize", _key(np="base"))
    by_label = {pc.summary.params["np"]: pc.comparison for pc in family}
    assert by_label["fast"].verdict is Verdict.BETTER
    for pc_single, pc in zip(single, family, strict=True):
        if pc.is_baseline:  # compared with itself, outside the family
            assert pc.comparison.p_adjusted == pc.comparison.p_value
            continue
        assert pc.comparison.adjustment == "Holm" and pc_single.comparison.adjustment == "none"
        assert pc.comparison.p_adjusted >= pc_single.comparison.p_adjusted
        if pc.comparison.verdict is not pc_single.comparison.verdict:  # only ever weakened
            assert pc.comparison.verdict is Verdict.INDISTINGUISHABLE
            assert pc.comparison.verdict_unadjusted is pc_single.comparison.verdict


def test_power_hint_matches_a_simulated_study() -> None:
    from scipy import stats as st

    from tunelab.stats import repeats_needed

    n = repeats_needed(0.05, 0.05)
    assert n is not None and 14 <= n <= 20
    assert repeats_needed(0.05, 0.05, paired=True) < n
    assert repeats_needed(5.0, 0.05) is None  # beyond any practical number
    rng = np.random.default_rng(5)
    a = 10 * np.exp(rng.normal(0, 0.05, (4000, n)))
    b = 10 / 1.05 * np.exp(rng.normal(0, 0.05, (4000, n)))
    power = np.mean(_welch_rejects(a, b))
    assert 0.75 <= power <= 0.9
    fewer = np.mean(_welch_rejects(a[:, : n // 2], b[:, : n // 2]))
    assert fewer < 0.6
    del st


def test_noise_level_pools_points_and_gives_the_hint() -> None:
    from tunelab.stats import noise_level

    rng = np.random.default_rng(6)
    runs = make_runs({"a": list(10 * np.exp(rng.normal(0, 0.05, 20))),
                      "b": list(20 * np.exp(rng.normal(0, 0.05, 20)))})
    level = noise_level(runs, "wall_s")
    # two points x 20 rounds: 40 runs less 2 point and 19 more round effects
    assert level is not None and level.df == 19
    assert level.sd_log == pytest.approx(0.05, rel=0.25)
    assert level.repeats_needed is not None and 8 <= level.repeats_needed <= 30
