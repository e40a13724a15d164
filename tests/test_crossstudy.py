"""Two studies compared point by point (``tunelab compare DIR_A DIR_B``): the noise watch's
flags count as they do within one study."""

from __future__ import annotations

import json

import pandas as pd

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
