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
    summarize,
    verdict_label,
)

N_RESAMPLES = 2000  # enough for stable CIs here, keeps the tests fast


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
    c = compare(a, b, "minimize", n_resamples=N_RESAMPLES)
    assert c.verdict is Verdict.BETTER
    assert c.ci_low > 1.0 and c.ci_high > c.ci_low
    assert c.speedup == pytest.approx(a.mean() / b.mean())
    assert c.p_value < 0.01
    assert verdict_label(c.verdict, "wall_s", "minimize") == "faster"


def test_same_distribution_is_indistinguishable(rng: np.random.Generator) -> None:
    a, b = rng.normal(5.0, 0.5, 10), rng.normal(5.0, 0.5, 10)
    c = compare(a, b, "minimize", n_resamples=N_RESAMPLES)
    assert c.verdict is Verdict.INDISTINGUISHABLE
    assert c.ci_low <= 1.0 <= c.ci_high
    assert c.p_value > 0.05


def test_one_percent_real_difference_is_under_noise_threshold(rng: np.random.Generator) -> None:
    a = rng.normal(100.0, 0.01, 10)
    b = rng.normal(99.0, 0.01, 10)  # a real, resolvable 1 % gain
    c = compare(a, b, "minimize", n_resamples=N_RESAMPLES)
    assert c.ci_low > 1.0  # the CI alone would call it a win ...
    assert c.verdict is Verdict.INDISTINGUISHABLE  # ... the 2 % noise threshold does not
    tight = compare(a, b, "minimize", noise_threshold=0.005, n_resamples=N_RESAMPLES)
    assert tight.verdict is Verdict.BETTER


def test_maximize_and_minimize_flip_the_ratio(rng: np.random.Generator) -> None:
    a, b = rng.normal(100.0, 1.0, 6), rng.normal(150.0, 1.0, 6)
    as_time = compare(a, b, "minimize", n_resamples=N_RESAMPLES)
    as_rate = compare(a, b, "maximize", n_resamples=N_RESAMPLES)
    assert as_time.speedup == pytest.approx(1.0 / as_rate.speedup)
    assert as_rate.speedup > 1.4 and as_rate.verdict is Verdict.BETTER
    assert as_time.verdict is Verdict.WORSE
    assert as_time.ci_high < 1.0
    assert verdict_label(as_rate.verdict, "throughput", "maximize") == "faster"
    assert verdict_label(as_time.verdict, "wall_s", "minimize") == "slower"
    assert verdict_label(as_rate.verdict, "accuracy", "maximize") == "better"


@pytest.mark.parametrize(("a", "b"), [([1.0], [2.0, 2.1]), ([1.0, 1.1], [2.0]), ([], [1.0, 2.0])])
def test_fewer_than_two_values_is_insufficient_data(a: list[float], b: list[float]) -> None:
    c = compare(a, b, "minimize", n_resamples=N_RESAMPLES)
    assert c.verdict is Verdict.INSUFFICIENT
    assert math.isnan(c.ci_low) and math.isnan(c.p_value)
    assert (c.n_a, c.n_b) == (len(a), len(b))


def test_constant_samples_do_not_crash() -> None:
    same = compare([3.0] * 5, [3.0] * 5, "minimize", n_resamples=N_RESAMPLES)
    assert same.verdict is Verdict.INDISTINGUISHABLE
    assert same.speedup == 1.0 and same.ci_low == 1.0 == same.ci_high
    apart = compare([4.0] * 5, [2.0] * 5, "minimize", n_resamples=N_RESAMPLES)
    assert apart.verdict is Verdict.BETTER
    assert apart.speedup == pytest.approx(2.0) and apart.ci_low == pytest.approx(2.0)


def test_compare_is_deterministic_for_a_seed(rng: np.random.Generator) -> None:
    a, b = rng.normal(10, 1, 7), rng.normal(9, 1, 7)
    assert compare(a, b, "minimize", seed=3, n_resamples=500) == compare(
        a, b, "minimize", seed=3, n_resamples=500
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"direction": "fastest"}, "direction"),
        ({"direction": "minimize", "confidence": 1.5}, "confidence"),
        ({"direction": "minimize", "b_values": [-1.0, -2.0]}, "positive"),
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
    ranked = compare_to_baseline(runs, "wall_s", "minimize", base, n_resamples=N_RESAMPLES)
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
    with pytest.raises(StatsError, match="not among"):
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
    result = best(runs, "wall_s", "minimize", n_resamples=N_RESAMPLES)
    assert result.best.params == {"np": "c"} and result.runner_up is not None
    assert result.runner_up.params == {"np": "b"}
    assert result.comparison is not None and result.comparison.verdict is Verdict.BETTER
    assert result.comparison.speedup > 1.0
    assert result.p_beats_runner_up is not None and result.p_beats_runner_up > 0.99
    # maximising the same numbers crowns the other end
    assert best(runs, "wall_s", "maximize", n_resamples=N_RESAMPLES).best.params == {"np": "a"}


def test_best_identical_points_is_a_coin_toss(rng: np.random.Generator) -> None:
    values = list(rng.normal(10, 1.0, 8))
    runs = make_runs({"a": values, "b": values[::-1]})
    result = best(runs, "wall_s", "minimize", n_resamples=N_RESAMPLES)
    assert result.p_beats_runner_up == pytest.approx(0.5, abs=0.05)
    assert result.comparison is not None
    assert result.comparison.verdict is Verdict.INDISTINGUISHABLE


def test_best_single_point_and_failures() -> None:
    one = best(make_runs({"a": [1.0, 1.2]}), "wall_s", "minimize", n_resamples=N_RESAMPLES)
    assert one.best.params == {"np": "a"}
    assert one.runner_up is None and one.comparison is None and one.p_beats_runner_up is None
    all_failed = make_runs({"a": [], "b": []}, failures={"a": ["failed"], "b": ["timeout"] * 2})
    with pytest.raises(StatsError, match=r"no successful run.*3 runs.*1 failed, 2 timeout"):
        best(all_failed, "wall_s", "minimize")
    with pytest.raises(StatsError, match="no runs"):
        best(pd.DataFrame(), "wall_s", "minimize")


def test_three_runs_each_give_a_verdict_for_a_clear_gap_but_not_for_noise() -> None:
    # A 2x gap is a verdict with 3 runs each, although the rank test's p cannot go below 0.1.
    c = compare([10.0, 10.1, 9.9], [5.0, 5.1, 4.9], "minimize", n_resamples=N_RESAMPLES)
    assert c.verdict is Verdict.BETTER
    assert c.ci_low > 1.9 and c.p_value == pytest.approx(0.1)
    # 3 % apart with 5 % noise: the interval is wide enough to contain 1.
    noisy = compare([10.0, 10.5, 9.5], [9.7, 10.2, 9.2], "minimize", n_resamples=N_RESAMPLES)
    assert noisy.verdict is Verdict.INDISTINGUISHABLE and noisy.ci_low < 1 < noisy.ci_high


def test_interval_is_at_least_as_wide_as_the_welch_interval_at_small_n() -> None:
    from scipy import stats as st

    a, b = np.array([10.0, 10.4, 9.8]), np.array([9.0, 9.5, 8.8])
    c = compare(a, b, "minimize", n_resamples=N_RESAMPLES)
    va = a.var(ddof=1) / (3 * a.mean() ** 2)
    vb = b.var(ddof=1) / (3 * b.mean() ** 2)
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    half = st.t.ppf(0.975, df) * np.sqrt(va + vb)
    ratio = a.mean() / b.mean()
    assert c.ci_low <= ratio * np.exp(-half) + 1e-12
    assert c.ci_high >= ratio * np.exp(half) - 1e-12


@pytest.mark.parametrize("n", [3, 5])
def test_false_verdicts_on_identical_distributions_stay_rare(n: int) -> None:
    """The bootstrap CI alone under-covers at n=3..5 (13-19 % false verdicts here)."""
    rng = np.random.default_rng(7)
    trials = 150
    false = sum(
        compare(
            rng.normal(10, 0.3, n), rng.normal(10, 0.3, n), "minimize", n_resamples=1000
        ).verdict
        in (Verdict.BETTER, Verdict.WORSE)
        for _ in range(trials)
    )
    assert false / trials <= 0.08


def test_best_ignores_a_single_lucky_run(rng: np.random.Generator) -> None:
    runs = make_runs(
        {"lucky": [1.0], "a": list(rng.normal(10, 0.2, 5)), "b": list(rng.normal(12, 0.2, 5))},
        failures={"lucky": ["failed"] * 4},
    )
    result = best(runs, "wall_s", "minimize", n_resamples=N_RESAMPLES)
    assert result.best.params == {"np": "a"}
    assert result.runner_up is not None and result.runner_up.params == {"np": "b"}
    assert best(runs, "wall_s", "minimize", min_n=1).best.params == {"np": "lucky"}
