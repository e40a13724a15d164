"""Plots of a pw.x study from the engine's runs table (data steps and PNG files)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tunelab.workloads.qe.parser import parse_pw_output
from tunelab.workloads.qe.plots import (
    ndiag_table,
    plot_qe_study,
    scaling_table,
    timer_bars,
    timer_table,
)

DATA = Path(__file__).parent / "data"

FIXTURES = {
    (1, 1, 1): "si_np1.out",
    (2, 2, 1): "si_np2_npool2.out",
    (4, 1, 4): "si_np4_ndiag4.out",
    (2, 1, 1): "si_np2_ntg2.out",
}


def _runs() -> pd.DataFrame:
    """A runs table shaped like the engine's: 3 repeats per point, scaled real FOMs."""
    rows = []
    run_id = 0
    for point_id, ((np_, npool, ndiag), name) in enumerate(sorted(FIXTURES.items())):
        foms = parse_pw_output((DATA / name).read_text())
        point = json.dumps({"ndiag": ndiag, "np": np_, "npool": npool}, sort_keys=True)
        for repeat, scale in enumerate((0.9, 1.0, 1.1)):
            run_id += 1
            row = {"run_id": run_id, "point_id": point_id, "point": point, "repeat": repeat,
                   "status": "ok", "reason": None, "rc": 0, "wall_s": 1.0 + scale,
                   "np": np_, "npool": npool, "ndiag": ndiag, "fom.wall_s": 1.0 + scale}
            row.update({f"fom.{k}": v * scale for k, v in foms.items()})
            rows.append(row)
    failed = dict(rows[0], run_id=999, repeat=3, status="failed", rc=1)
    failed["fom.pwscf_wall_s"] = 1000.0
    rows.append(failed)
    return pd.DataFrame(rows)


def _key(**kw: int) -> str:
    return json.dumps(kw, sort_keys=True)


def test_scaling_table_one_series_per_npool() -> None:
    runs = _runs()
    table = scaling_table(runs)
    assert list(zip(table["npool"], table["np"], strict=True)) == [(1, 1), (1, 2), (1, 4), (2, 2)]
    assert (table["n"] == 3).all()  # the failed run is left out
    ok = runs[(runs["status"] == "ok") & (runs["np"] == 1)]["fom.pwscf_wall_s"]
    first = table.iloc[0]
    assert first["mean"] == pytest.approx(ok.mean())
    assert first["std"] == pytest.approx(ok.std())


def test_ndiag_table_and_metric_fallback() -> None:
    runs = _runs()
    table = ndiag_table(runs)
    assert set(zip(table["np"], table["ndiag"], strict=True)) == {(1, 1), (2, 1), (4, 4)}
    fallback = scaling_table(runs.drop(columns=["fom.pwscf_wall_s"]))
    assert fallback.iloc[0]["mean"] == pytest.approx(2.0)  # the engine's fom.wall_s
    with pytest.raises(ValueError, match="fom.nothing"):
        scaling_table(runs, metric="fom.nothing")


def test_timer_table_adds_up_to_the_pwscf_wall_time() -> None:
    runs = _runs()
    keys = [_key(np=1, npool=1, ndiag=1), _key(np=4, npool=1, ndiag=4)]
    table = timer_table(runs, keys, ["baseline", "best"])
    assert list(table.index) == ["baseline", "best"]
    assert {"init_run", "c_bands", "other"} <= set(table.columns)
    base = runs[(runs["np"] == 1) & (runs["status"] == "ok")]
    assert table.loc["baseline"].sum() == pytest.approx(base["fom.pwscf_wall_s"].mean())
    assert (table.to_numpy() >= 0).all()


def test_a_baseline_that_is_the_best_is_one_timer_bar() -> None:
    """The demo's baseline (np=1) was its best: the chart drew the same bar twice, as
    'baseline' and 'best'."""
    base, other = _key(np=1, npool=1, ndiag=1), _key(np=4, npool=1, ndiag=4)
    assert timer_bars(best=base, baseline=base) == [(base, "baseline = best")]
    assert timer_bars(best=other, baseline=base) == [(base, "baseline"), (other, "best")]
    assert timer_bars(best=other, baseline=None) == [(other, "best")]


def test_plot_files_are_pngs(tmp_path: Path) -> None:
    runs = _runs()
    paths = plot_qe_study(runs, tmp_path / "plots", best=_key(np=4, npool=1, ndiag=4),
                          baseline=_key(np=1, npool=1, ndiag=1))
    assert [p.name for p in paths] == ["qe_wall_vs_np.png", "qe_wall_vs_ndiag.png",
                                      "qe_timers.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 5000


def test_plots_without_ndiag_or_baseline(tmp_path: Path) -> None:
    runs = _runs()
    runs = runs[runs["ndiag"] == 1].drop(columns=["ndiag"])
    runs.loc[:, "fom.pwscf_wall_s"] = np.where(runs["status"] == "ok",
                                                runs["fom.pwscf_wall_s"], np.nan)
    paths = plot_qe_study(runs, tmp_path)
    assert [p.name for p in paths] == ["qe_wall_vs_np.png"]


def _legend_covers_data(fig) -> list[tuple[float, float]]:  # noqa: ANN001
    """Data points (markers, error-bar ends, line vertices) drawn under the legend."""
    fig.canvas.draw()
    boxes = [legend.get_window_extent() for legend in fig.legends]
    for ax in fig.axes:
        if ax.get_legend() is not None:
            boxes.append(ax.get_legend().get_window_extent())
    covered = []
    for ax in fig.axes:
        for line in ax.get_lines():
            xy = ax.transData.transform(np.column_stack(line.get_data()).astype(float))
            covered += [tuple(p) for p in xy for box in boxes if box.contains(*p)]
    return covered


@pytest.mark.parametrize("draw", ["ndiag", "np"])
def test_the_legend_covers_no_data_and_stays_in_the_figure(draw: str) -> None:
    """Many series with the largest values in the upper right, where a legend inside the axes
    would go: the legend is drawn beside the axes, inside the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tunelab.workloads.qe.plots import ndiag_figure, np_figure

    rows = []
    for i, (np_, npool) in enumerate([(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (8, 8)]):
        for ndiag in (1, 4):
            rows.append({"np": np_, "npool": npool, "ndiag": ndiag, "n": 3,
                         "mean": 0.3 + 0.2 * i + ndiag * 0.3, "std": 0.05})
    table = pd.DataFrame(rows)
    fig = ndiag_figure(table, "pwscf_wall_s") if draw == "ndiag" else \
        np_figure(table[table["ndiag"] == 1], "pwscf_wall_s")
    try:
        assert fig.legends or any(ax.get_legend() for ax in fig.axes)
        assert _legend_covers_data(fig) == []
        width, height = fig.canvas.get_width_height()
        for legend in fig.legends:
            box = legend.get_window_extent()
            assert box.x0 >= 0 and box.x1 <= width and box.y0 >= 0 and box.y1 <= height
    finally:
        plt.close(fig)
