"""The ranked table's data step and its rich rendering."""

from __future__ import annotations

import re
from collections.abc import Callable

import pandas as pd
from rich.console import Console

from tunelab.report import best_lines, best_panel, summary_table, table_rows
from tunelab.stats import best, compare_to_baseline, summarize
from tunelab.workloads.base import Objective


def _render(renderable: object) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_rows_follow_the_ranking_and_format_the_comparison(
    runs: pd.DataFrame, objective: Objective, baseline: str
) -> None:
    comparisons = compare_to_baseline(runs, "wall_s", "minimize", baseline, n_resamples=1000)
    rows = table_rows(comparisons, objective)
    assert [r.label for r in rows][:1] == ["env=am np=2"]
    assert rows[-1].label == "env=broken np=2" and rows[-1].n == "0"
    am = rows[0]
    c = comparisons[0].comparison
    assert am.speedup.startswith(f"{c.speedup:.3f}× [{c.ci_low:.3f}, {c.ci_high:.3f}]")
    if c.method == "paired":  # the interval paired by round follows, and decides
        assert c.paired is not None
        assert am.speedup.endswith(f"; paired {c.paired.speedup:.3f}× "
                                   f"[{c.paired.ci_low:.3f}, {c.paired.ci_high:.3f}]")
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


def test_summary_table_renders_every_point_and_value(
    runs: pd.DataFrame, objective: Objective, baseline: str, injected: str
) -> None:
    comparisons = compare_to_baseline(runs, "wall_s", "minimize", baseline, n_resamples=1000)
    text = _render(summary_table(comparisons, objective))
    for row in table_rows(comparisons, objective):
        assert row.mean_std in text and row.verdict in text
        for part in re.split(r"; | (?=[\[(])", row.speedup):  # intervals on lines of their own
            assert part in text
    assert injected in text  # rich markup in a value is printed, not interpreted
    assert "speedup [CI]" in text and "2 failed" in text


def test_best_panel_states_the_winner_and_confidence(runs: pd.DataFrame) -> None:
    result = best(runs, "wall_s", "minimize", n_resamples=1000)
    lines = best_lines(result)
    assert lines[0].startswith("Best point: env=am np=2")
    assert "beats the runner-up (faster" in lines[-2]
    assert "100.0% of bootstrap resamples" in lines[-1]
    text = _render(best_panel(result))
    assert "env=am np=2" in text and "faster" in text


def test_best_lines_do_not_oversell_a_tie(runs_factory: Callable[..., pd.DataFrame]) -> None:
    runs = runs_factory({"a": (10.0, 6, []), "b": (10.0, 6, [])}, seed=4)
    result = best(runs, "wall_s", "minimize", n_resamples=1000)
    assert result.comparison is not None
    assert result.comparison.verdict.value == "indistinguishable"
    assert any("cannot be told apart" in line for line in best_lines(result))
