"""The ranked table's data step and its rich rendering."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable

import pandas as pd

from tunelab.report import best_lines, results_from_frame, table_rows
from tunelab.report.output import emit
from tunelab.report.views import compare_view
from tunelab.stats import best, compare_to_baseline, summarize
from tunelab.workload import Objective


def test_rows_follow_the_ranking_and_format_the_comparison(
    runs: pd.DataFrame, objective: Objective, baseline: str
) -> None:
    comparisons = compare_to_baseline(runs, "wall_s", "minimize", baseline)
    rows = table_rows(comparisons, objective)
    assert [r.label for r in rows][:1] == ["env=am np=2"]
    assert rows[-1].label == "env=broken np=2" and rows[-1].n == "0"
    am = rows[0]
    c = comparisons[0].comparison
    assert am.speedup == f"{c.speedup:.3f}× [{c.ci_low:.3f}, {c.ci_high:.3f}]"
    assert c.paired  # rounds in common: the interval is the paired test's, which decides
    assert am.p_value == ("<0.001" if c.p_adjusted < 0.001 else f"{c.p_adjusted:.3f}")
    assert am.detectable.endswith("%")
    assert am.verdict == "faster" and am.failed == "1 failed"
    base = next(r for r in rows if r.verdict_kind == "baseline")
    assert base.verdict == "baseline" and base.p_value == ""
    slow = next(r for r in rows if r.label == "env=slow np=2")
    assert slow.verdict == "slower" and slow.failed == "1 timeout"


def test_rows_from_summaries_rank_by_direction(runs: pd.DataFrame) -> None:
    summaries = summarize(runs, "wall_s")
    fastest = table_rows(summaries, Objective("wall_s", "minimize"))[0]
    slowest = table_rows(summaries, Objective("wall_s", "maximize"))[0]
    assert fastest.label == "env=am np=2" and slowest.label == "env=slow np=2"
    assert fastest.speedup == "" and fastest.verdict == ""


def test_terminal_table_renders_every_point_and_value(
    runs: pd.DataFrame, objective: Objective, baseline: str, injected: str
) -> None:
    results = results_from_frame(runs, objective, baseline)
    out = io.StringIO()
    emit(compare_view(results), "text", stream=out, terminal=True, width=200)
    text = out.getvalue()
    for row in table_rows(results.comparisons, objective):
        assert row.mean_std in text and row.verdict in text
        for part in re.split(r" \[", row.speedup):  # each in a column of its own
            assert part.strip("]") in text
        assert row.p_value in text and row.detectable in text
    assert injected in text  # rich markup in a value is printed, not interpreted
    assert "CI at the level Holm held each p to" in text and "2 failed" in text
    # the header names the test and the adjustment behind the p column
    assert "p (Holm)" in text and "paired t, pooled noise" in text
    assert "Holm over the" in text and "Noise: runs of one point vary" in text
    assert "the smallest change these runs detect" in text


def test_title_of_a_table_without_a_test_yet_says_so(
        runs_factory: Callable[..., pd.DataFrame], objective: Objective) -> None:
    """Early in a study every point has one run: the title said "[95% CI] and p of the –
    (log scale), p adjusted by none"."""
    runs = runs_factory({"baseline": (10.0, 1, []), "am": (7.0, 1, []), "x": (9.0, 1, [])})
    base = runs["point"].iloc[0]
    out = io.StringIO()
    emit(compare_view(results_from_frame(runs, objective, base)), "text", stream=out)
    title = out.getvalue().splitlines()[0]
    assert "of the –" not in title and "adjusted by none" not in title
    assert "[95% CI] and p: none yet (a test needs two ok runs" in title


def test_json_and_csv_carry_the_test_its_adjusted_p_and_what_it_could_detect(
    runs: pd.DataFrame, objective: Objective, baseline: str
) -> None:
    results = results_from_frame(runs, objective, baseline)
    out = io.StringIO()
    emit(compare_view(results), "json", stream=out)
    doc = json.loads(out.getvalue())
    assert doc["schema"] == "tunelab.compare" and doc["version"] == 2
    assert doc["noise"]["sd_log"] > 0 and doc["noise"]["repeats_needed"] >= 2
    assert 0 < doc["noise"]["detectable"] < 1
    by_label = {p["label"]: p for p in doc["points"]}
    am = by_label["env=am np=2"]
    c = next(pc.comparison for pc in results.comparisons
             if pc.summary.params["env"] == "am")
    assert am["test"] == c.test and am["adjustment"] == "Holm" and am["n_rounds"] >= 3
    assert am["p"] == c.p_adjusted >= am["p_raw"] == c.p_value
    assert am["detectable"] == c.detectable and am["disturbed"] == 0
    assert by_label["env=baseline np=2"]["p"] is None
    out = io.StringIO()
    emit(compare_view(results), "csv", stream=out)
    header, first = out.getvalue().splitlines()[:2]
    assert {"p", "p_raw", "test", "adjustment", "detectable", "disturbed"} <= set(
        header.split(","))


def test_best_panel_states_the_winner_and_confidence(runs: pd.DataFrame) -> None:
    result = best(runs, "wall_s", "minimize")
    lines = best_lines(result)
    assert lines[0].startswith("Best point: env=am np=2")
    assert "beats the runner-up (faster" in lines[-2]
    assert "paired t, log scale" in lines[-3] and "in 80 % of studies" in lines[-3]
    assert "Confidence that it beats the runner-up: 100.0%" in lines[-1]


def test_best_lines_do_not_oversell_a_tie(runs_factory: Callable[..., pd.DataFrame]) -> None:
    runs = runs_factory({"a": (10.0, 6, []), "b": (10.0, 6, [])}, seed=4)
    result = best(runs, "wall_s", "minimize")
    assert result.comparison is not None
    assert result.comparison.verdict.value == "indistinguishable"
    assert any("cannot be told apart" in line for line in best_lines(result))


def test_notes_name_several_tests_apart(runs_factory: Callable[..., pd.DataFrame],
                                        objective: Objective) -> None:
    """Tests were joined by commas, and one test's name holds one: "Welch t, paired t,
    pooled noise" read as three tests (or as two "paired t"s with three)."""
    runs = runs_factory({"base": (10.0, 6, []), "a": (7.0, 6, []),
                         "b": (9.0, 2, ["failed"] * 4)})  # b shares too few rounds: Welch t
    base = runs["point"].iloc[0]
    results = results_from_frame(runs, objective, base)
    assert {pc.comparison.test for pc in results.comparisons if not pc.is_baseline} == {
        "Welch t", "paired t, pooled noise"}
    (line,) = [n for n in results.notes if n.startswith("Verdicts:")]
    assert line.startswith("Verdicts: Welch t / paired t, pooled noise on the log scale;")


def test_a_detectable_change_past_1000_percent_is_shown_as_such() -> None:
    """Two runs a side, Welch's one degree of freedom and Holm's level: the merge field test
    printed '14648245875426918400.0%' as the change its runs could detect."""
    from tunelab.report.formats import detectable_text
    from tunelab.report.results import _about

    assert detectable_text(1.4648245875426918e17) == ">1000%"
    assert detectable_text(0.125) == "12.5%" and detectable_text(10.0) == "1000.0%"
    assert detectable_text(float("inf")) == "∞" and detectable_text(float("nan")) == ""
    assert _about(">1000%") == "more than 1000%" and _about("12.5%") == "about 12.5%"
