"""Plots: the data steps, and real PNG files from the renderers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.report.conftest import counted_reads, key, make_runs
from tests.report.drawn import assert_legible, drawn_figures
from tunelab.report import (
    fom_by_point,
    fom_by_point_chart,
    speedup_axis,
    speedup_bar_chart,
    speedup_bars,
)
from tunelab.stats import StatsError, Verdict, compare_to_baseline
from tunelab.workload import Objective

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 5_000  # a drawn chart, not an empty canvas
    width = int.from_bytes(data[16:20], "big")
    height = int.from_bytes(data[20:24], "big")
    assert width >= 600 and height >= 150


def test_speedup_bars_skip_baseline_and_points_without_values(
    runs: pd.DataFrame, baseline: str
) -> None:
    comparisons = compare_to_baseline(runs, "wall_s", "minimize", baseline)
    bars = speedup_bars(comparisons)
    labels = [b.label for b in bars]
    assert "env=baseline np=2" not in labels and "env=broken np=2" not in labels
    assert len(bars) == 4 and bars[0].verdict is Verdict.BETTER
    assert all(b.ci_low <= b.speedup <= b.ci_high for b in bars)


def test_fom_by_point_groups_ok_values_and_counts_the_rest(runs: pd.DataFrame) -> None:
    groups = {g.label: g for g in fom_by_point(runs, "wall_s")}
    assert groups["env=am np=2"].values.size == 6 and groups["env=am np=2"].n_not_ok == 1
    assert groups["env=broken np=2"].values.size == 0
    assert list(groups)[-1] == "env=broken np=2"  # no values: last
    with pytest.raises(StatsError, match="gflops"):
        fom_by_point(runs, "gflops")


def test_fom_by_point_reads_the_runs_table_a_bounded_number_of_times() -> None:
    """It selected each point's rows from the whole table (2 reads per point): the report
    of a 4,000-point, 20,000-run study spent 30 s there."""
    runs = counted_reads(make_runs({f"e{i}": (10.0 + i, 2, ["failed"]) for i in range(60)}))
    groups = fom_by_point(runs, "wall_s")
    assert len(groups) == 60 and all(g.values.size == 2 and g.n_not_ok == 1 for g in groups)
    assert [g.label for g in groups[:2]] == ["env=e0 np=2", "env=e1 np=2"]
    assert runs.reads <= 5  # was 2 x 60 + 1


def test_charts_write_png_files(runs: pd.DataFrame, tmp_path: Path, baseline: str) -> None:
    comparisons = compare_to_baseline(runs, "wall_s", "minimize", baseline)
    bar = speedup_bar_chart(
        comparisons, tmp_path / "speedup.png", "env sweep", objective=Objective("wall_s")
    )
    box = fom_by_point_chart(runs, "wall_s", tmp_path / "runs.png", baseline=baseline)
    assert bar == tmp_path / "speedup.png" and box == tmp_path / "runs.png"
    _assert_png(bar)
    _assert_png(box)


def test_speedup_chart_with_nothing_to_compare(tmp_path: Path) -> None:
    _assert_png(speedup_bar_chart([], tmp_path / "empty.png"))


def test_charts_cap_the_number_of_points_drawn(
    runs: pd.DataFrame, baseline: str, tmp_path: Path
) -> None:
    comparisons = compare_to_baseline(runs, "wall_s", "minimize", baseline)
    full = speedup_bar_chart(comparisons, tmp_path / "full.png")
    capped = speedup_bar_chart(comparisons, tmp_path / "capped.png", max_bars=2)
    tall = fom_by_point_chart(runs, "wall_s", tmp_path / "tall.png")
    short = fom_by_point_chart(runs, "wall_s", tmp_path / "short.png", max_points=2)

    def height(path: Path) -> int:
        return int.from_bytes(path.read_bytes()[20:24], "big")

    assert height(capped) < height(full) and height(short) < height(tall)


def test_speedup_chart_says_its_bars_are_at_the_level_holm_held_each_p_to(
    runs: pd.DataFrame, baseline: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bars are the table's adjusted intervals; the axis called them '95% CI'."""
    from matplotlib.axes import Axes

    labels: list[str] = []
    set_xlabel = Axes.set_xlabel

    def record(ax: Axes, text: str, *args: object, **kwargs: object) -> object:
        labels.append(text)
        return set_xlabel(ax, text, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Axes, "set_xlabel", record)
    comparisons = compare_to_baseline(runs, "wall_s", "minimize", baseline)
    assert "Holm" in {c.comparison.adjustment for c in comparisons}
    speedup_bar_chart(comparisons, tmp_path / "speedup.png")
    assert "95% CI" not in labels[-1]
    assert "CI at the level Holm held each p to" in labels[-1]


def test_chart_titles_and_axis_labels_stay_inside_the_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Field test (merge-transports): the title and x label, centred on an axes that long
    point labels had pushed right, ran off the right edge of report-speedup.png."""
    long = "chunk_size=1000000 mpi_pml=ob1 transport=dask"
    runs = make_runs({"baseline": (10.0, 6, []), long: (12.0, 6, []),
                      f"{long} x": (8.0, 6, [])})  # fmt: skip
    comparisons = compare_to_baseline(runs, "wall_s", "maximize", key(env="baseline", np=2))
    figures = drawn_figures(monkeypatch)
    speedup_bar_chart(comparisons, tmp_path / "s.png", "merge-transports: speedup over the "
                      "baseline", objective=Objective("throughput_mb_s", "maximize"))
    fom_by_point_chart(runs, "wall_s", tmp_path / "r.png",
                       title="wall_s of every run, per point, of merge-transports")
    assert len(figures) == 2
    for figure in figures:
        assert "merge-transports" in figure.text()
        assert_legible(figure)


def _two_wild_runs() -> tuple[pd.DataFrame, str]:
    """Four points of 6 runs and one ('wild') of 2 runs 30x apart: its interval is
    [0.0001, 742]-wide, like merge-transports' dask point in the field test."""
    runs = make_runs({"baseline": (10.0, 6, []), "a": (7.0, 6, []), "b": (13.0, 6, []),
                      "c": (9.0, 6, []), "wild": (10.0, 2, [])})  # fmt: skip
    runs.loc[runs["env"] == "wild", ["wall_s", "fom.wall_s"]] = [[1.0, 1.0], [30.0, 30.0]]
    return runs, key(env="baseline", np=2)


def test_speedup_axis_cuts_an_interval_far_wider_than_the_others() -> None:
    runs, baseline = _two_wild_runs()
    bars = speedup_bars(compare_to_baseline(runs, "wall_s", "minimize", baseline))
    wild = [b.label for b in bars].index("env=wild np=2")
    assert bars[wild].ci_high / bars[wild].ci_low > 1e4
    axis = speedup_axis(bars, 0.02)
    assert axis.cut == (wild,)
    assert axis.low > bars[wild].ci_low and axis.high < bars[wild].ci_high
    for i, b in enumerate(bars):
        assert axis.low <= b.speedup <= axis.high
        if i != wild:
            assert axis.low <= b.ci_low and b.ci_high <= axis.high
    assert axis.low > 1 / 5 and axis.high < 5  # the others' bars fill it (was 1/16,000..16,000)
    assert speedup_axis(bars[:1], 0.02).cut == ()  # nothing to compare with: all shown
    assert speedup_axis([bars[wild]], 0.02).cut == ()


def test_speedup_chart_draws_an_over_long_interval_cut_with_its_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Field test (merge-transports): one point of 2 runs, interval [0.000148, 742], set a
    log axis from 1/16,000 to 16,000 that squeezed every other bar to nothing."""
    import tunelab.report.plots as plots

    figures: list[Any] = []
    save = plots.save_png
    monkeypatch.setattr(plots, "save_png", lambda fig, path: (save(fig, path),
                                                             figures.append(fig)))
    runs, baseline = _two_wild_runs()
    comparisons = compare_to_baseline(runs, "wall_s", "minimize", baseline)
    bars = speedup_bars(comparisons)
    wild = next(b for b in bars if b.label == "env=wild np=2")
    speedup_bar_chart(comparisons, tmp_path / "s.png")
    ax = figures[0].axes[0]
    low, high = ax.get_xlim()
    assert 1 / 5 < low < 1 < high < 5  # was 1/16,000 to 16,000
    assert all(low <= b.ci_low and b.ci_high <= high for b in bars if b is not wild)
    written = [t.get_text() for t in ax.texts]
    assert written == [f"interval {wild.ci_low:.3g}–{wild.ci_high:.3g}×"]
    assert "are cut at the edge (arrow), their bounds written beside them" in " ".join(
        ax.get_xlabel().split())
