"""Two studies compared point by point (``tunelab compare DIR_A DIR_B``,
:mod:`tunelab.crossstudy`): the noise watch's flags count as they do within one study, and
the points are matched in one pass."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

import tunelab.crossstudy as crossstudy
from tunelab.cli.common import compare_studies
from tunelab.report.output import render
from tunelab.report.results import results_from_frame
from tunelab.report.views import cross_compare_view
from tunelab.stats import Verdict
from tunelab.workload import Objective

OBJ = Objective("wall_s", "minimize")
POINT = json.dumps({"x": 1})


def runs(values: list[float], disturbed: list[int]) -> pd.DataFrame:
    return pd.DataFrame({"point": POINT, "status": "ok", "repeat": range(len(values)),
                         "fom.wall_s": values, "noise.disturbed": disturbed,
                         "noise.others_share": [0.8 if d else 0.0 for d in disturbed],
                         "noise.evidence": ["others took 80% of cores 0-1" if d else ""
                                            for d in disturbed]})


def test_two_studies_leave_disturbed_runs_out_and_say_how_busy_each_was() -> None:
    """Field test: two equal studies, every run flagged disturbed, B under heavier load:
    ``compare A B`` said slower x0.56, p 0.003, without a word on the load, and
    ``--exclude-disturbed`` changed nothing (its runs still counted)."""
    a = runs([1.0, 1.01, 0.99, 1.0, 1.02, 1.0], [0] * 6)
    b = runs([1.0, 1.01, 0.99, 2.0, 2.1, 1.95], [0, 0, 0, 1, 1, 1])
    kept = compare_studies(results_from_frame(a, OBJ, POINT, name="a"),
                           results_from_frame(b, OBJ, POINT, name="b"))
    assert kept.points[0].comparison.verdict is Verdict.WORSE
    assert any("'b' (B)" in n and "3 of 6 runs were disturbed" in n for n in kept.notes)
    assert "3 of 6 runs were disturbed" in render(cross_compare_view(kept), "text")
    left = compare_studies(results_from_frame(a, OBJ, POINT, name="a", exclude_disturbed=True),
                           results_from_frame(b, OBJ, POINT, name="b", exclude_disturbed=True))
    point = left.points[0]
    assert point.b.n == 3 and point.b.left_out == 3
    assert point.comparison.verdict is Verdict.INDISTINGUISHABLE


def _runs(points: int, scale: float, seed: int, *, key_order: int = 1) -> pd.DataFrame:
    """``points`` points x 3 runs (one failed); point i has mean (i + 1) * ``scale``."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(points):
        params = {"a": i, "b": "x"}
        key = json.dumps(dict(sorted(params.items(), reverse=key_order < 0)))
        for repeat in range(3):
            ok = repeat < 2
            value = (i + 1) * scale * (1 + 0.01 * rng.standard_normal()) if ok else math.nan
            rows.append({"run_id": len(rows) + 1, "point": key, "repeat": repeat,
                         "status": "ok" if ok else "failed", "fom.t": value})
    return pd.DataFrame(rows)


def test_points_are_matched_by_value_and_judged_on_their_own_runs() -> None:
    a = _runs(3, 10.0, 0)
    b = _runs(3, 5.0, 1, key_order=-1)  # the same points, keys written in another order
    result = crossstudy.compare_studies(a, b, Objective("t", "minimize"))
    assert len(result.points) == 3
    for p in result.points:
        assert p.comparison.speedup == pytest.approx(2.0, rel=0.05)
        assert p.comparison.verdict is Verdict.BETTER
        assert (p.a.n, p.b.n) == (2, 2)


def test_each_run_key_is_decoded_a_bounded_number_of_times(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Matching the values of each common point scanned (and JSON-decoded) every run of
    both studies once per point: 4,000 points x 20,000 runs did not finish in minutes."""
    calls = 0
    canonical = crossstudy._canonical

    def counted(key: str) -> str:
        nonlocal calls
        calls += 1
        return canonical(key)

    monkeypatch.setattr(crossstudy, "_canonical", counted)
    a, b = _runs(60, 10.0, 0), _runs(60, 10.0, 1)
    result = crossstudy.compare_studies(a, b, Objective("t", "minimize"))
    assert len(result.points) == 60
    assert calls <= 2 * (len(a) + len(b))  # was 60 points x 180 runs x 2 = 21,600


def _excludes_one(c: object) -> bool:
    return not (c.ci_low <= 1.0 <= c.ci_high)  # type: ignore[attr-defined]


def test_each_interval_agrees_with_the_holm_verdict_beside_it() -> None:
    """Field test (``compare DIR_A DIR_B``, ~300 points): '1.229× [1.142, 1.323] …
    indistinguishable (Holm p 0.364)' — the interval was unadjusted, the p Holm's. Each
    interval is now at the level Holm held its p to: it excludes 1 exactly when p < 5 %."""
    rng = np.random.default_rng(3)
    keys = [json.dumps({"x": i}) for i in range(40)]
    shift = np.where(np.arange(40) < 8, 1.25, 1.0)
    a = pd.DataFrame([{"point": k, "status": "ok", "repeat": r, "fom.wall_s": 10 * (1 + e)}
                      for k in keys for r, e in enumerate(rng.normal(0, 0.08, 5))])
    b = pd.DataFrame([{"point": k, "status": "ok", "repeat": r,
                       "fom.wall_s": 10 * (1 + e) / shift[i]}
                      for i, k in enumerate(keys) for r, e in enumerate(rng.normal(0, 0.08, 5))])
    sc = crossstudy.compare_studies(a, b, OBJ)
    cs = [cp.comparison for cp in sc.points]
    assert any(c.p_value < 0.05 <= c.p_adjusted for c in cs)  # Holm held some raw p back
    for c in cs:
        assert _excludes_one(c) == (c.p_adjusted < 0.05), c
        assert c.ci_level >= 0.95
    title = render(cross_compare_view(sc), "text").splitlines()[0]
    assert "CI at the level Holm held each p to" in title
