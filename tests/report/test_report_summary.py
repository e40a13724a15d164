"""StudyResults: computed once from the runs, shown by compare/best/report."""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from tunelab.report import load_results, results_from_frame, write_report
from tunelab.report.output import View, emit, render
from tunelab.report.views import best_view, compare_view
from tunelab.stats import StatsError, Verdict
from tunelab.workload import Objective

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _text(view: View, width: int | None = None) -> str:
    """Plain text, or a terminal of ``width`` columns."""
    if width is None:
        return render(view, "text")
    out = io.StringIO()
    emit(view, "text", stream=out, terminal=True, width=width)
    return out.getvalue()


def test_results_compare_with_the_baseline(
    runs: pd.DataFrame, objective: Objective, baseline: str
) -> None:
    results = results_from_frame(runs, objective, baseline, name="env sweep")
    assert len(results.summaries) == 6 and len(results.comparisons) == 6
    assert results.comparisons[0].summary.params["env"] == "am"
    assert results.comparisons[0].comparison.verdict is Verdict.BETTER
    assert not [n for n in results.notes if n.startswith(("No ", "The study names no"))]
    assert results.best_result().best.params["env"] == "am"
    text = _text(compare_view(results))
    assert "CI at the level Holm held each p to" in text
    assert "faster" in text and "env=am np=2" in text


def test_results_without_baseline_rank_by_mean_and_say_so(
    runs: pd.DataFrame, objective: Objective
) -> None:
    results = results_from_frame(runs, objective, None)
    assert results.comparisons == ()
    text = _text(compare_view(results))
    assert "speedup" not in text and "names no baseline" in text
    rows = [line for line in text.splitlines() if re.match(r"^\s*\d+\s+env=", line)]
    assert "env=am np=2" in rows[0]


def test_report_files(
    runs: pd.DataFrame, objective: Objective, baseline: str, tmp_path: Path
) -> None:
    results = results_from_frame(
        runs, objective, baseline, name="sweep", spec={"name": "sweep"}
    )
    path = write_report(results, tmp_path / "deep" / "report.html")
    assert path == tmp_path / "deep" / "report.html"
    for png in ("report-speedup.png", "report-runs.png"):
        assert (tmp_path / "deep" / png).read_bytes()[:8] == PNG_MAGIC
    html = path.read_text(encoding="utf-8")
    assert html.count('src="data:image/png;base64,') == 2
    assert "tunelab: sweep" in html


def test_every_run_failed(
    objective: Objective,
    baseline: str,
    tmp_path: Path,
    runs_factory: Callable[..., pd.DataFrame],
) -> None:
    runs = runs_factory({"baseline": (1.0, 0, ["failed"]), "b": (1.0, 0, ["timeout"])})
    results = results_from_frame(runs, objective, baseline)
    assert results.comparisons == () and "no successful run" in results.notes[0]
    with pytest.raises(StatsError, match="no successful run"):
        results.best_result()
    html = write_report(results, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "No verdict" in html and "Runs that were not ok (2)" in html
    assert "no successful run" in html


def test_best_view_names_the_winner(
    runs: pd.DataFrame, objective: Objective, baseline: str
) -> None:
    results = results_from_frame(runs, objective, baseline)
    view = best_view(results, results.best_result())
    assert "env=am np=2" in _text(view)
    assert view.document["best"]["point"] == {"env": "am", "np": 2}


def test_load_results_from_a_real_store(
    runs: pd.DataFrame, objective: Objective, baseline: str, tmp_path: Path
) -> None:
    store_mod = pytest.importorskip("tunelab.store", reason="the engine's store is on main")
    import json

    with store_mod.open_store(tmp_path, create=True) as store:
        store.set_meta(
            {
                "study_name": "stored",
                "objective": json.dumps(["wall_s", "minimize"]),
                "baseline": baseline,
                "noise_threshold": "0.02",
                "spec": json.dumps({"name": "stored"}),
            }
        )
        for row in runs.to_dict("records"):
            value = row["fom.wall_s"]
            store.record_run(
                store_mod.RunRecord(
                    point_key=row["point"],
                    params={"env": row["env"], "np": row["np"]},
                    repeat=row["repeat"],
                    status=row["status"],
                    reason=row["reason"],
                    rc=row["rc"],
                    wall_s=1.0 if pd.isna(value) else value,
                    started_at=row["started_at"],
                    ended_at=row["ended_at"],
                    host=row["host"],
                    command=["true"],
                    env={},
                    run_dir=str(tmp_path),
                    foms={} if pd.isna(value) else {"wall_s": value},
                )
            )
    results = load_results(tmp_path)
    assert results.name == "stored" and results.baseline == baseline
    assert results.objective == objective
    assert [pc.summary.params["env"] for pc in results.comparisons][0] == "am"
    assert results.comparisons[-1].summary.failed == {"failed": 2}


def test_narrow_terminal_leaves_out_median_and_min_first(
    runs: pd.DataFrame, objective: Objective, baseline: str
) -> None:
    results = results_from_frame(runs, objective, baseline)
    wide = _text(compare_view(results), width=220)
    narrow = _text(compare_view(results), width=90)
    header = next(line for line in narrow.splitlines() if "speedup" in line and "point" in line)
    assert "median" in wide and "median" not in header and " min " not in header
    assert "left out at this width: min, median" in narrow and "faster" in narrow


@pytest.mark.parametrize("width", [100, 72, 60, 45])
def test_terminal_table_fits_and_never_cuts_a_value(
    runs: pd.DataFrame, objective: Objective, baseline: str, width: int
) -> None:
    results = results_from_frame(runs, objective, baseline)
    text = _text(compare_view(results), width=width)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width
    for row in compare_view(results).blocks[0].rows:  # type: ignore[union-attr]
        for key in ("speedup", "verdict"):
            cell = row.get(key, "")
            value = cell if isinstance(cell, str) else cell[0]
            assert value in text, (width, key, value)


def test_a_fom_that_crosses_zero_shows_a_difference_in_every_format(tmp_path: Path) -> None:
    """Field test (study ``gain``): best printed '11.902× [0.000, 3.42e+12] … detects
    333330625584158784.0 %' and compare refused the study (baseline mean < 0). Every format
    now shows the difference of means, no ratio, and says why."""
    import json

    gain = {"a": [0.02, -0.32, 0.05, 0.03, 0.05], "c": [0.04, -0.20, 0.10, 0.04, 0.06],
            "d": [0.08, 0.04, 0.16, 0.08, 0.15]}
    runs = pd.DataFrame([{"point": json.dumps({"label": k}), "status": "ok", "repeat": r,
                          "fom.gain": x} for k, xs in gain.items() for r, x in enumerate(xs)])
    objective = Objective(fom="gain", direction="maximize")
    results = results_from_frame(runs, objective, json.dumps({"label": "a"}))
    assert len(results.comparisons) == 3
    compare = compare_view(results)
    best = best_view(results, results.best_result())
    texts = [render(v, fmt) for v in (compare, best) for fmt in ("text", "markdown", "csv")]
    texts.append(write_report(results, tmp_path / "r.html").read_text(encoding="utf-8"))
    for text in texts:
        assert "×" not in text.replace("1 (baseline)", "") and "e+12" not in text
    assert "Δ +0.136" in texts[0] and "No ratio for 2 comparison(s)" in texts[0]
    assert "difference of means +0.094" in texts[3] and "ratios are not defined" in texts[3]
    doc = compare.document["points"][0]
    assert doc["speedup"] is None and doc["detectable"] is None
    assert doc["difference"] == pytest.approx(0.136) and doc["test"].endswith("of means")
    assert best.document["comparison"]["difference"] == pytest.approx(0.094)


def test_a_difference_that_beats_the_runner_up_claims_no_noise_threshold() -> None:
    """The noise threshold is a relative change: a best point judged on the difference of
    means was said to beat the runner-up 'beyond the noise threshold'."""
    import json

    err = {0: [-1.0, -1.1, -0.9], 1: [-0.5, -0.6, -0.4]}
    runs = pd.DataFrame([{"point": json.dumps({"x": k}), "status": "ok", "repeat": r,
                          "fom.err": x} for k, xs in err.items() for r, x in enumerate(xs)])
    results = results_from_frame(runs, Objective(fom="err", direction="maximize"),
                                 json.dumps({"x": 0}))
    text = render(best_view(results, results.best_result()), "text")
    assert "The best point beats the runner-up (better)." in text


@pytest.mark.parametrize(("shift", "said", "verdict"), [
    (1.25, "Against the baseline (x=0): faster than it, 1.25", "better"),
    (1.0, "Against the baseline (x=0): not distinguishable from it, ", "indistinguishable"),
])
def test_best_says_whether_the_best_point_beats_the_baseline(
        tmp_path: Path, shift: float, said: str, verdict: str) -> None:
    """Field test: ``best`` named the winner and its runner-up but never said whether the
    winner beats the baseline. It now does in one line, text, JSON and the report, with
    the very comparison ``compare`` shows for that point (its test, interval, Holm p)."""
    import json

    noise = [1.0, 1.01, 0.99, 1.0, 1.02]
    rows = [{"point": json.dumps({"x": x}), "status": "ok", "repeat": r,
             "fom.wall_s": 10 * noise[(r + x) % 5] * (1 / shift if x == 2 else 1)
             * (1 - 0.002 * x)}
            for x in range(4) for r in range(5)]
    results = results_from_frame(pd.DataFrame(rows), Objective("wall_s", "minimize"),
                                 json.dumps({"x": 0}))
    view = best_view(results, results.best_result())
    text = render(view, "text")
    assert said in text
    line = next(s for s in text.splitlines() if s.startswith("Against the baseline"))
    assert "p (Holm)" not in line and "adjusted: Holm, as in compare" in line
    doc = view.document
    assert doc["baseline"]["point"] == {"x": 0}
    assert doc["versus_baseline"]["verdict"] == verdict
    assert doc["versus_baseline_line"] == line
    compared = next(p for p in compare_view(results).document["points"]
                    if p["point"] == doc["best"]["point"])
    assert compared["p"] == doc["versus_baseline"]["p"]
    from html import escape
    page = write_report(results, tmp_path / "r.html").read_text(encoding="utf-8")
    assert escape(line) in page  # leading the verdict section, and said once:
    assert page.count("Against the baseline") == 1
