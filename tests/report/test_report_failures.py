"""Results of studies whose runs failed or were excluded by a physics check."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from tests.report.conftest import counted_reads, key, make_runs
from tunelab.report.output import View, render
from tunelab.report.results import exclusions_from_frame, results_from_frame
from tunelab.report.views import best_view, compare_view
from tunelab.report.writer import write_report
from tunelab.stats import summarize
from tunelab.workload import Objective


def _text(view: View) -> str:
    return render(view, "text")


def test_results_of_a_study_whose_every_run_failed(
    tmp_path: Path, runs_factory: Callable[..., pd.DataFrame]
) -> None:
    runs = runs_factory({"a": (1.0, 0, ["failed"]), "b": (1.0, 0, ["failed", "failed"])})
    runs = runs.drop(columns=["fom.wall_s"])  # no run produced any figure of merit
    objective = Objective("pwscf_wall_s", "minimize")
    results = results_from_frame(runs, objective, key(env="a", np=2))
    assert [(s.n, s.n_failed) for s in results.summaries] == [(0, 1), (0, 2)]
    assert len(results.failures) == 3 and results.has_failures
    assert results.failures[0].reason.startswith("failed: rank 1 said")
    assert any("No run produced pwscf_wall_s" in n for n in results.notes)
    html = write_report(results, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "Runs that were not ok (3)" in html and "rank 1 said" in html
    assert "failed" in _text(compare_view(results))


def _with_invalid(runs: pd.DataFrame, env: str, value: float, reason: str) -> pd.DataFrame:
    mask = runs["env"] == env
    runs = runs.copy()
    runs.loc[mask, "status"] = "invalid"
    runs.loc[mask, "reason"] = reason
    runs.loc[mask, "fom.wall_s"] = value
    return runs


def test_a_point_excluded_by_the_physics_check_is_named_with_its_reason(
    runs_factory: Callable[..., pd.DataFrame], tmp_path: Path
) -> None:
    runs = runs_factory({"np1": (12.0, 3, []), "np2": (6.2, 3, []), "np4": (9.0, 3, [])})
    reason = "total_energy_ry differs by 2.4e-05 > 1e-05 from the study's reference (…)"
    runs = _with_invalid(runs, "np2", 6.2, reason)
    objective = Objective("wall_s", "minimize")
    results = results_from_frame(runs, objective, key(env="np1", np=2))
    (excluded,) = results.exclusions
    assert excluded.leading and excluded.n_invalid == 3 and math.isclose(excluded.value, 6.2)
    assert excluded.line == f"env=np2 np=2: fastest (wall_s 6.2 s), but excluded: {reason}"
    best = results.best_result()
    assert best.best.params["env"] == "np4"  # the best *valid* point
    panel = _text(best_view(results, best))
    assert "env=np2 np=2: fastest (wall_s 6.2 s), but excluded: total_energy_ry" in panel
    assert "fastest (wall_s 6.2 s)" in _text(compare_view(results))
    html = write_report(results, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "env=np2 np=2: fastest (wall_s 6.2 s), but excluded" in html


def test_an_excluded_point_that_was_not_the_best_is_still_named(
    runs_factory: Callable[..., pd.DataFrame]
) -> None:
    runs = runs_factory({"np1": (12.0, 3, []), "np2": (20.0, 3, [])})
    runs = _with_invalid(runs, "np2", 20.0, "value differs by 1 > 0.5")
    results = results_from_frame(runs, Objective("wall_s", "minimize"))
    (excluded,) = results.exclusions
    assert not excluded.leading
    assert excluded.line == "env=np2 np=2: excluded: value differs by 1 > 0.5"


def test_exclusions_read_the_runs_table_a_bounded_number_of_times() -> None:
    """Each point with invalid runs selected its rows from the whole table and compared its
    mean with every other point's: 1,530 such points of 8,000 runs spent 3.6 s there."""
    runs = make_runs({f"e{i}": (10.0 + i, 2, []) for i in range(60)})
    runs.loc[runs["repeat"] == 1, "status"] = "invalid"
    runs.loc[runs["env"] == "e59", "status"] = "invalid"  # no valid run, and the slowest
    runs.loc[runs["env"] == "e59", "fom.wall_s"] = 1.0  # … but it would be the fastest
    objective = Objective("wall_s", "minimize")
    summaries = tuple(summarize(runs, "wall_s"))
    counted = counted_reads(runs)
    excluded = exclusions_from_frame(counted, objective, summaries)
    assert len(excluded) == 60 and [e.leading for e in excluded].count(True) == 1
    assert excluded[-1].leading and excluded[-1].line.startswith("env=e59 np=2: fastest")
    assert all(e.n_invalid == 1 for e in excluded[:-1]) and excluded[-1].n_invalid == 2
    assert counted.reads <= 6  # was 3 per point with invalid runs
