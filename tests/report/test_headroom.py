"""Every point beside the machine's limit in the views: compare's ``of bound`` column (text,
JSON, CSV), best's headroom sentence, the HTML report's section and figure, and the line
that says how to measure bounds where none are stored."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pandas as pd
import pytest

from tunelab.bounds.profile import Bound, Profile, save_profile
from tunelab.report.headroom import headroom_report, with_best_headroom, with_headroom
from tunelab.report.output import render
from tunelab.report.results import results_from_frame
from tunelab.report.roofline import roofline_data
from tunelab.report.views import best_view, compare_view
from tunelab.sysinfo import fingerprint
from tunelab.workload import Objective

SNAP = {"host": "node7", "cpu_model": "AMD EPYC", "logical_cores": 2, "physical_cores": 2,
        "memory_gib": 24.0, "tools": {}}
MiB = 1 << 20


def merge_runs() -> pd.DataFrame:
    rows = []
    for pml, bws in (("ob1", [0.5e9, 0.7e9]), ("ucx", [1.6e9, 1.8e9])):
        for repeat, bw in enumerate(bws):
            rows.append({"run_id": len(rows) + 1, "point": json.dumps({"mpi_pml": pml}),
                         "repeat": repeat, "status": "ok", "mpi_pml": pml,
                         "fom.bandwidth": bw, "fom.workers": 2.0, "fom.bytes_sent": 1.6e7,
                         "fom.wall_s": 1.0})
    return pd.DataFrame(rows)


def results(runs: pd.DataFrame, spec: dict, sysinfo: dict | None = SNAP, baseline=None):
    return results_from_frame(runs, Objective("bandwidth", "maximize"), baseline,
                              name="m", spec=spec, sysinfo=sysinfo)


MERGE = {"workload": {"name": "merge", "options": {"chunk_size": 1_000_000}}}


@pytest.fixture
def stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TUNELAB_BOUNDS_DIR", str(tmp_path))
    link = {"ranks": 2, "nodes": 1, "message_bytes": 4 * MiB}
    save_profile(Profile(fingerprint(SNAP), {"host": "node7"}, "2026-11-26 10:00:00 UTC", (
        Bound("link", {"stack": "mpi-ucx", "pattern": "alltoall", **link}, 2.0e9),
        Bound("link", {"stack": "mpi-ucx", "pattern": "oneway", **link}, 4.0e9),
        Bound("link", {"stack": "mpi-ob1", "pattern": "alltoall", **link}, 1.0e9),
    ), loadavg=(1.0, 1.5)), tmp_path)
    return tmp_path


def test_compare_shows_each_points_fraction_of_its_bound(stored: Path):
    r = results(merge_runs(), MERGE, baseline=json.dumps({"mpi_pml": "ob1"}))
    view = with_headroom(compare_view(r), r)
    text = render(view, "text")
    rows = {line.split()[1]: line.split()[-1] for line in text.splitlines()
            if line.startswith(("1 ", "2 "))}
    assert rows == {"mpi_pml=ucx": "0.85", "mpi_pml=ob1": "0.60"}
    assert "of bound: exchange bandwidth per worker / link mpi-ucx all-to-all, 2 ranks, " \
           "4.00 MiB = 2.00 GB/s (one way: 4.00 GB/s)" in text
    assert "nearest measured: message_bytes 4.00 MiB (measured) for 3.81 MiB" in text
    doc = json.loads(render(view, "json"))
    ucx = next(p for p in doc["headroom"]["points"] if p["point"] == {"mpi_pml": "ucx"})
    (item,) = ucx["items"]
    assert item["fraction"] == pytest.approx(0.85) and item["oneway_fraction"] == \
        pytest.approx(0.425)
    assert item["bound"]["variant"]["stack"] == "mpi-ucx" and item["n"] == 2
    assert doc["headroom"]["profile"]["fingerprint"] == fingerprint(SNAP)
    records = list(csv.DictReader(io.StringIO(render(view, "csv"))))
    assert {r["label"]: round(float(r["fraction_of_bound"]), 2) for r in records} == \
        {"mpi_pml=ucx": 0.85, "mpi_pml=ob1": 0.6}
    assert "| of bound |" in render(view, "markdown")


def test_best_says_how_much_room_the_best_point_leaves(stored: Path):
    r = results(merge_runs(), MERGE)
    best = r.best_result()
    view = with_best_headroom(best_view(r, best), r, best)
    text = render(view, "text")
    assert ("Headroom: the best point (mpi_pml=ucx) is at 0.85 of the link's all-to-all (both "
            "ways) limit (link mpi-ucx all-to-all, 2 ranks, 4.00 MiB: 2.00 GB/s; 0.43 of the "
            "one-way 4.00 GB/s): little room left.") in text
    doc = json.loads(render(view, "json"))
    assert doc["headroom"]["sentence"].startswith("Headroom: the best point")
    assert json.loads(render(view, "json"))["best"]["point"] == {"mpi_pml": "ucx"}


def test_without_a_stored_profile_the_views_say_how_to_measure_one(tmp_path: Path,
                                                                   monkeypatch):
    monkeypatch.setenv("TUNELAB_BOUNDS_DIR", str(tmp_path))
    r = results(merge_runs(), MERGE)
    compare = with_headroom(compare_view(r), r)
    text = render(compare, "text")
    assert "no bounds measured for node7" in text and "run `tunelab bounds` there" in text
    assert "of bound" not in text.splitlines()[1]  # no column without bounds
    assert json.loads(render(compare, "json"))["headroom"]["profile"] is None
    best = with_best_headroom(best_view(r, r.best_result()), r, r.best_result())
    assert "run `tunelab bounds`" in render(best, "text")
    nosnap = results(merge_runs(), MERGE, sysinfo={})
    assert "the study stored no snapshot" in render(with_headroom(compare_view(nosnap), nosnap),
                                                    "text")


def test_a_workload_that_declares_no_work_leaves_the_views_as_they_were(stored: Path):
    r = results(merge_runs(), {"workload": {"name": "qe", "options": {}}})
    view = compare_view(r)
    assert with_headroom(view, r) is view
    assert with_best_headroom(best_view(r, r.best_result()), r, r.best_result()).blocks == \
        best_view(r, r.best_result()).blocks
    unknown = results(merge_runs(), {"workload": {"name": "no-such-workload"}})
    assert with_headroom(compare_view(unknown), unknown) == compare_view(unknown)


ROOF = {"workload": {"name": "command", "options": {"argv": ["k"], "work": {
    "flops": "2 * n**3", "bytes_moved": "12 * n**2", "seconds": "kernel_s"}}}}


def roof_runs() -> pd.DataFrame:
    rows = []
    for n, seconds in ((64, 1e-5), (1024, 0.1)):
        rows.append({"run_id": len(rows) + 1, "point": json.dumps({"n": n}), "repeat": 0,
                     "status": "ok", "n": n, "fom.kernel_s": seconds, "fom.wall_s": 1.0,
                     "fom.bandwidth": 1.0})
    return pd.DataFrame(rows)


def test_the_report_draws_a_roofline_when_runs_declare_flops_and_bytes(tmp_path: Path,
                                                                       monkeypatch):
    monkeypatch.setenv("TUNELAB_BOUNDS_DIR", str(tmp_path))
    save_profile(Profile(fingerprint(SNAP), {}, "now", (
        Bound("gemm", {"precision": "fp32", "device": "cpu", "threads": 2}, 40e9),
        Bound("memory", {"device": "cpu", "threads": 2}, 10e9))), tmp_path)
    r = results(roof_runs(), ROOF)
    from tunelab.report.headroom import headroom_of

    data, _ = headroom_of(r)
    assert data is not None
    points = {p.label: p for p in roofline_data(data)}
    assert points["n=1024"].intensity == pytest.approx(1024 / 6)
    assert points["n=1024"].flops == pytest.approx(2 * 1024**3 / 0.1)
    assert points["n=64"].peak == 40e9 and points["n=64"].slope == 10e9
    lines, figure = headroom_report(r, r.best_result(), tmp_path / "report.html")
    assert figure is not None and figure[0].name == "report-headroom.png"
    assert figure[0].stat().st_size > 1000 and figure[1].startswith("Roofline")
    assert any(line.startswith("Headroom: the best point") for line in lines)


def test_the_html_report_has_the_headroom_section(stored: Path, tmp_path: Path):
    from tunelab.report.writer import write_report

    r = results(merge_runs(), MERGE)
    html = write_report(r, tmp_path / "out" / "report.html").read_text()
    assert "Headroom: the best point (mpi_pml=ucx) is at 0.85" in html
    assert (tmp_path / "out" / "report-headroom.png").is_file()
    assert "fraction of the machine" in html


def test_points_above_their_bound_are_named_and_explained_in_compare(tmp_path: Path,
                                                                     monkeypatch):
    """A numpy copy of 2,000 doubles runs from the cache at 2.8x the memory triad bound:
    compare showed 2.82 with no word, best blamed only the bound's measurement. Compare's
    notes (and the HTML's) now name every point above its bound and say the data may fit
    in a cache."""
    monkeypatch.setenv("TUNELAB_BOUNDS_DIR", str(tmp_path))
    save_profile(Profile(fingerprint(SNAP), {}, "now", (
        Bound("memory", {"device": "cpu", "threads": 2}, 10e9),)), tmp_path)
    spec = {"workload": {"name": "command", "options": {"argv": ["k"], "work": {
        "bytes_moved": "16 * n", "seconds": "kernel_s"}}}}
    rows = [{"run_id": i + 1, "point": json.dumps({"n": n}), "repeat": 0, "status": "ok",
             "n": n, "fom.kernel_s": 16 * n / rate, "fom.wall_s": 1.0, "fom.bandwidth": rate}
            for i, (n, rate) in enumerate(((2_000, 28e9), (20_000_000, 9e9)))]
    r = results(pd.DataFrame(rows), spec)
    text = render(with_headroom(compare_view(r), r), "text")
    assert "above the memory bound: n=2000 2.80: above the measured limit: the data may fit " \
           "in a cache" in text
    assert "n=20000000 0.90" not in text
    best = with_best_headroom(best_view(r, r.best_result()), r, r.best_result())
    assert "the data may fit in a cache" in render(best, "text")


def test_a_link_exchange_far_from_the_measured_sizes_is_not_judged(stored: Path):
    runs = merge_runs()
    spec = {"workload": {"name": "merge", "options": {"chunk_size": 10_000}}}
    text = render(with_headroom(compare_view(results(runs, spec)), results(runs, spec)), "text")
    assert "exchange bandwidth per worker: no measured bound fits link (message_bytes 39 KiB," \
           in text


def test_a_bound_measured_while_the_machine_was_busy_is_named_so(tmp_path: Path,
                                                                 monkeypatch):
    monkeypatch.setenv("TUNELAB_BOUNDS_DIR", str(tmp_path))
    link = {"ranks": 2, "nodes": 1, "message_bytes": 4 * MiB}
    save_profile(Profile(fingerprint(SNAP), {}, "now", (
        Bound("link", {"stack": "mpi-ob1", "pattern": "alltoall", **link}, 1.0e9,
              disturbed="others took 64% of cores 0-1"),)), tmp_path)
    r = results(merge_runs(), MERGE)
    text = render(with_headroom(compare_view(r), r), "text")
    assert "= 1.00 GB/s (measured while others took 64% of cores 0-1: it may be low)" in text


LEOPARD = {"workload": {"name": "leopard", "options": {"threads": 2}}}


def leopard_runs() -> pd.DataFrame:
    """Two points of two runs each, with the fraction of bound every run measured itself
    (``bound_fraction``) and the GEMM rate it timed (``gemm_flops_per_s``)."""
    rows = []
    for batch, fractions in ((16, [0.40, 0.50]), (8, [0.30, 0.32])):
        for repeat, fraction in enumerate(fractions):
            rows.append({"run_id": len(rows) + 1, "point": json.dumps({"batch_size": batch}),
                         "repeat": repeat, "status": "ok", "batch_size": batch,
                         "fom.bandwidth": batch + repeat, "fom.windows_per_s": 100.0,
                         "fom.flops_per_window": 1e9, "fom.bound_fraction": fraction,
                         "fom.gemm_flops_per_s": 100e9 / fraction})
    return pd.DataFrame(rows)


def test_best_compare_and_report_show_the_fraction_of_bound_measured_in_the_run(
        tmp_path: Path, monkeypatch):
    """A Leopard study's runs record their in-run fraction of bound; best and the report
    said only "no bounds measured" (the fractions were visible in export alone). They now
    show it per point, mean and spread over the runs, labelled as measured in the run."""
    monkeypatch.setenv("TUNELAB_BOUNDS_DIR", str(tmp_path))
    r = results(leopard_runs(), LEOPARD)
    best = r.best_result()
    text = render(with_best_headroom(best_view(r, best), r, best), "text")
    assert ("In-run fraction of bound: the best point (batch_size=16) ran at 0.45 of its bound "
            "(0.40-0.50 over 2 runs; the limit its runs timed: 225.0 GFLOP/s on average); "
            "measured in the run") in text
    assert "no bounds measured" not in text and "no `tunelab bounds` profile for node7" in text
    doc = json.loads(render(with_best_headroom(best_view(r, best), r, best), "json"))
    (b16,) = [p for p in doc["inrun_bound"]["points"] if p["point"] == {"batch_size": 16}]
    assert (b16["fraction"], b16["fraction_min"], b16["fraction_max"], b16["n"]) == \
        (pytest.approx(0.45), 0.40, 0.50, 2)
    compare = render(with_headroom(compare_view(r), r), "text")
    assert "in-run of bound" in compare and "0.45 (0.40-0.50)" in compare \
        and "0.31 (0.30-0.32)" in compare
    records = list(csv.DictReader(io.StringIO(render(with_headroom(compare_view(r), r), "csv"))))
    assert {x["label"]: round(float(x["inrun_bound_fraction"]), 2) for x in records} == \
        {"batch_size=16": 0.45, "batch_size=8": 0.31}
    lines, _ = headroom_report(r, best, tmp_path / "report.html")
    assert any(line.startswith("In-run fraction of bound: the best point") for line in lines)
    assert any("batch_size=16: 0.45 (0.40-0.50 over 2 runs); batch_size=8: 0.31 "
               "(0.30-0.32 over 2 runs)" in line for line in lines)


def test_with_a_profile_too_best_says_which_fraction_is_which(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TUNELAB_BOUNDS_DIR", str(tmp_path))
    save_profile(Profile(fingerprint(SNAP), {}, "now", (
        Bound("gemm", {"precision": "fp32", "device": "cpu", "threads": 2}, 200e9),)),
        tmp_path)
    r = results(leopard_runs(), LEOPARD)
    best = r.best_result()
    text = render(with_best_headroom(best_view(r, best), r, best), "text")
    assert "In-run fraction of bound: the best point (batch_size=16) ran at 0.45" in text
    assert "Headroom: the best point (batch_size=16) is at 0.50 of the fp32 arithmetic " \
           "limit" in text
    assert "`tunelab bounds` measured on node7" in text \
        and "the in-run fraction is the runs' own figure, not this profile's" in text
    compare = render(with_headroom(compare_view(r), r), "text")
    assert "in-run of bound" in compare and "of bound" in compare.splitlines()[1]


def test_any_workload_recording_bound_fraction_gets_the_in_run_fraction(tmp_path: Path,
                                                                         monkeypatch):
    """Generic: a workload that declares no work for a profile still shows its runs' own
    fraction of bound."""
    monkeypatch.setenv("TUNELAB_BOUNDS_DIR", str(tmp_path))
    r = results(leopard_runs(), {"workload": {"name": "qe", "options": {}}})
    best = r.best_result()
    text = render(with_best_headroom(best_view(r, best), r, best), "text")
    assert "ran at 0.45 of its bound (0.40-0.50 over 2 runs" in text
    assert "Fraction of bound" not in text  # no profile sentence for work it does not declare
    assert "0.45 (0.40-0.50)" in render(with_headroom(compare_view(r), r), "text")


def test_headroom_figures_keep_long_point_labels_inside_and_apart(tmp_path: Path, monkeypatch):
    """Long parameter values: the fraction-of-bound bars' labels ran off the left edge, their
    caption off the right one and the legend covered a label; the roofline's point labels
    ran off the right edge."""
    from tests.report.drawn import assert_legible, drawn_figures

    long = "openblas-0.3.26-pthreads-with-dynamic-arch-haswell-zen"
    roof = roof_runs()
    roof = pd.concat([roof, roof.iloc[[-1]].assign(run_id=3, n=4096, **{"fom.kernel_s": 5.0})])
    roof["blas"] = long
    roof["point"] = [json.dumps({"n": int(n), "blas": long}) for n in roof["n"]]
    merge = merge_runs()
    nic = "enp65s0f0np0,enp65s0f1np1,ib0,ib1-a-very-long-interface-name"
    merge["btl_tcp_if_include"] = nic
    merge["point"] = [json.dumps({"mpi_pml": p, "btl_tcp_if_include": nic})
                      for p in merge["mpi_pml"]]
    monkeypatch.setenv("TUNELAB_BOUNDS_DIR", str(tmp_path))
    save_profile(Profile(fingerprint(SNAP), {}, "now", (
        Bound("gemm", {"precision": "fp32", "device": "cpu", "threads": 2}, 40e9),
        Bound("memory", {"device": "cpu", "threads": 2}, 10e9),
        Bound("link", {"stack": "mpi-ucx", "pattern": "alltoall", "ranks": 2, "nodes": 1,
                       "message_bytes": 4 * MiB}, 2.0e9),
        Bound("link", {"stack": "mpi-ob1", "pattern": "alltoall", "ranks": 2, "nodes": 1,
                       "message_bytes": 4 * MiB}, 1.0e9))), tmp_path)
    figures = drawn_figures(monkeypatch)
    for runs, spec, name in ((roof, ROOF, "roof"), (merge, MERGE, "bars")):
        r = results(runs, spec)
        _, figure = headroom_report(r, r.best_result(), tmp_path / f"{name}.html")
        assert figure is not None
    assert len(figures) == 2
    assert "n=4096" in figures[0].text() and "mpi_pml=ucx" in figures[1].text()
    for drawn in figures:
        assert_legible(drawn)


def test_a_run_above_its_in_run_bound_is_left_out_and_said_everywhere(tmp_path: Path,
                                                                     monkeypatch):
    """A ddp run on a shared machine recorded 2.40 of its bound (others took the cores while
    its GEMM ran, not while its steps did). Averaged in, the best point "ran at 1.08 of its
    bound" and a point whose every run was above 1 "ran at 1.93". Such a run is left out of
    the point's figures and said, with its value, in best's sentence, compare's cell (text,
    CSV, JSON) and the report's lines; a point of none shows no fraction."""
    monkeypatch.setenv("TUNELAB_BOUNDS_DIR", str(tmp_path))
    rows = []
    for batch, fractions in ((16, [0.45, 0.40, 2.40]), (8, [1.45, 2.40])):
        for repeat, fraction in enumerate(fractions):
            rows.append({"run_id": len(rows) + 1, "point": json.dumps({"batch_size": batch}),
                         "repeat": repeat, "status": "ok", "batch_size": batch,
                         "fom.bandwidth": batch + repeat, "fom.bound_fraction": fraction,
                         "fom.gemm_flops_per_s": 100e9 / fraction})
    r = results(pd.DataFrame(rows), {"workload": {"name": "ddp", "options": {}}})
    best = r.best_result()
    text = render(with_best_headroom(best_view(r, best), r, best), "text")
    assert ("the best point (batch_size=16) ran at 0.43 of its bound (0.40-0.45 over 2 runs; "
            "1 run above 1 left out (2.40): it outran the limit it timed (others' load slowed "
            "that timing more than the work, or the model's kernels beat the GEMM): no bound; "
            "the limit its runs timed: 236.1 GFLOP/s on average)") in text
    doc = json.loads(render(with_best_headroom(best_view(r, best), r, best), "json"))
    points = {p["label"]: p for p in doc["inrun_bound"]["points"]}
    assert (points["batch_size=16"]["fraction"], points["batch_size=16"]["n"],
            points["batch_size=16"]["above_1_left_out"]) == (pytest.approx(0.425), 2, [2.40])
    assert (points["batch_size=8"]["fraction"], points["batch_size=8"]["n"],
            points["batch_size=8"]["above_1_left_out"]) == (None, 0, [1.45, 2.40])
    compare = render(with_headroom(compare_view(r), r), "text")
    assert "0.43 (0.40-0.45); 1 above 1 left out" in compare
    assert "none; 2 above 1 left out" in compare
    records = list(csv.DictReader(io.StringIO(render(with_headroom(compare_view(r), r), "csv"))))
    assert {x["label"]: x["inrun_bound_fraction"][:5] for x in records} == \
        {"batch_size=16": "0.425", "batch_size=8": ""}
    lines, _ = headroom_report(r, best, tmp_path / "report.html")
    assert any("batch_size=16: 0.43 (0.40-0.45 over 2 runs; 1 run above 1 left out (2.40): "
               "it outran the limit it timed (others' load slowed that timing more than the "
               "work, or the model's kernels beat the GEMM): no bound); batch_size=8: none (2 "
               "runs above 1 left out (1.45, 2.40): they outran the limit they timed (others' "
               "load slowed that timing more than the work, or the model's kernels beat the "
               "GEMM): no bound)" in line
               for line in lines)
    # a best point whose every run was above 1 has no fraction, and says why
    from tunelab.report.inrun import inrun_best_lines, inrun_bounds

    own = inrun_bounds(r.runs)
    b8 = next(k for k in own if json.loads(k) == {"batch_size": 8})

    class _Best:  # what inrun_best_lines reads of a BestResult
        class best:  # noqa: N801
            point = b8

    assert inrun_best_lines(own, _Best()) == [  # type: ignore[arg-type]
        "In-run fraction of bound: none for the best point (batch_size=8): 2 runs above 1 "
        "left out (1.45, 2.40): they outran the limit they timed (others' load slowed that "
        "timing more than the work, or the model's kernels beat the GEMM): no bound; "
        "measured in the run: each run's rate / the limit it timed itself "
        "while it ran (figure of merit bound_fraction)."]
