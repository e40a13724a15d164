"""Byte rates per point (tunelab.report.rates): the merge benchmark's throughput and
bandwidth in GB/s / MB/s in compare, best and the HTML report, not as 3.355e+07 B/s."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from tunelab.report.formats import byte_rate_prefix
from tunelab.report.output import TextTable, View, render
from tunelab.report.rates import byte_rates, rates_table, with_rates
from tunelab.report.results import results_from_frame
from tunelab.report.table import best_lines
from tunelab.workload import Objective

MERGE_UNITS = {"throughput": "B/s", "throughput_std": "B/s", "bandwidth": "B/s",
               "bandwidth_min": "B/s", "bytes_sent": "B"}


def _runs(values: dict[int, list[tuple[float, float]]]) -> pd.DataFrame:
    """chunk_size -> [(throughput, bandwidth) per ok run]."""
    rows = []
    for chunk, runs in values.items():
        for repeat, (tp, bw) in enumerate(runs):
            rows.append({"run_id": len(rows) + 1, "point": json.dumps({"chunk_size": chunk}),
                         "repeat": repeat, "status": "ok", "fom.throughput": tp,
                         "fom.throughput_std": 1.0, "fom.bandwidth": bw,
                         "fom.bandwidth_min": bw / 2, "fom.bytes_sent": 1e6})
    return pd.DataFrame(rows)


def _results(units: dict[str, str] | None = MERGE_UNITS):  # noqa: ANN202
    runs = _runs({1000: [(8.0e6, 6.0e6), (9.0e6, 7.0e6), (1.0e7, 8.0e6)],
                  4000: [(3.0e9, 2.0e9), (3.2e9, 2.4e9), (3.4e9, 2.2e9)]})
    return results_from_frame(runs, Objective("throughput", "maximize", "B/s"),
                              json.dumps({"chunk_size": 1000}), fom_units=units)


def test_the_byte_rates_are_per_point_medians_best_first_without_spreads() -> None:
    data = byte_rates(_results())
    assert data is not None
    assert data.foms == ("throughput", "bandwidth")  # no _std/_min column; bytes_sent is B
    assert [r.label for r in data.rows] == ["chunk_size=4000", "chunk_size=1000"]
    assert data.rows[0].n == 3
    assert data.rows[0].medians == {"throughput": 3.2e9, "bandwidth": 2.2e9}


def test_the_table_reads_in_one_decimal_unit() -> None:
    text = render(View((rates_table(byte_rates(_results())),), {}), "text")
    assert "Byte rates per point, in GB/s" in text
    assert "throughput GB/s" in text and "bandwidth GB/s" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("chunk_size=4000"))
    assert line.split()[1:] == ["3", "3.2", "2.2"]
    assert "0.009" in text  # 9.0e6 B/s in the same unit as the rest
    assert "in GB/s (GB = 10^9 bytes); × 8 for Gbit/s" in text


@pytest.mark.parametrize(("values", "expected"), [
    ([2.5e9, 1.0], (1e9, "GB/s")), ([3.4e7], (1e6, "MB/s")), ([999.0, math.nan], (1.0, "B/s")),
    ([1.5e3], (1e3, "kB/s")), ([], (1.0, "B/s"))])
def test_byte_rate_prefix(values: list[float], expected: tuple[float, str]) -> None:
    assert byte_rate_prefix(values) == expected


def test_a_study_without_byte_rates_is_left_unchanged() -> None:
    view = View((TextTable("t", (), ()),), {"schema": "x"})
    assert with_rates(view, _results(units={"throughput": "samples/s"})) is view
    assert with_rates(view, _results(units={})) is view


def test_compare_json_carries_the_rates_in_bytes_per_second() -> None:
    view = with_rates(View((), {"schema": "tunelab.compare"}), _results())
    doc = json.loads(render(view, "json"))
    assert doc["rates"]["unit"] == "B/s"
    assert doc["rates"]["points"][1]["median"]["bandwidth"] == 7.0e6


def test_best_says_a_byte_rate_in_gb_per_second() -> None:
    results = _results()
    line = best_lines(results.best_result(), unit="B/s")[0]
    assert "mean throughput 3.2 ± 0.2 GB/s (n=3, maximize)" in line
    runner_up = next(x for x in best_lines(results.best_result(), unit="B/s")
                     if x.startswith("Runner-up"))
    assert "mean 0.009 GB/s" in runner_up


def _tunelab(*args: object) -> tuple[int, str]:
    """The real command line, in this process: exit code and output."""
    from typer.testing import CliRunner

    from tunelab.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def merge_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real merge study: 2 TCP workers, two chunk sizes, one run each (seconds)."""
    from tunelab.execute.runner import run_study
    from tunelab.execute.study import prepare_study
    from tunelab.spec import load_study

    root = tmp_path_factory.mktemp("merge")
    (root / "s.yaml").write_text(
        "name: merge-rates\n"
        "workload:\n  name: merge\n"
        "  options: {transport: tcp, workers: 2, iterations: 1, warmup: 0}\n"
        "parameters:\n  chunk_size: [500, 2000]\n"
        "repeats: 1\nbaseline: {chunk_size: 500}\ntimeout: 60\n")
    outcome = run_study(prepare_study(load_study(root / "s.yaml")), root / "d")
    assert outcome.counts == {"ok": 2}
    return root / "d"


def test_a_merge_study_shows_its_bandwidth_per_point(merge_study: Path) -> None:
    code, compare = _tunelab("compare", merge_study)
    assert code == 0, compare
    table = compare.split("Byte rates per point, in ")[1]
    unit = table.split()[0]
    assert unit in ("GB/s", "MB/s", "kB/s")
    assert f"throughput {unit}" in table and f"bandwidth {unit}" in table
    rows = [ln for ln in table.splitlines() if ln.startswith("chunk_size=")]
    assert sorted(r.split()[0] for r in rows) == ["chunk_size=2000", "chunk_size=500"]
    for row in rows:
        assert all(float(x) > 0 for x in row.split()[1:])  # n, then every rate
    code, best = _tunelab("best", merge_study)
    assert re.search(r"Best point: chunk_size=\d+ — mean throughput [\d.]+ [kMG]B/s \(n=1",
                     best), best
    code, _ = _tunelab("report", merge_study)
    assert code == 0
    html = (merge_study / "report.html").read_text()
    assert "Byte rates per point, in" in html and f"bandwidth {unit}" in html
