"""Static plots (matplotlib, Agg backend, imported only when a plot is drawn).

Each chart has a pure data step (:func:`speedup_bars`, :func:`fom_by_point`) tested without
drawing, and a renderer that writes one PNG and returns its path.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from tunelab.report.figures import (
    LABEL_LINE,
    PHONE_TEXT_PT,
    figure_titles,
    pyplot,
    save_png,
    short_label,
)
from tunelab.report.formats import point_label
from tunelab.stats import PointComparison, StatsError, Verdict, fom_column, verdict_label

if TYPE_CHECKING:
    import pandas as pd

    from tunelab.workload import Objective

__all__ = [
    "MAX_BARS",
    "PointRuns",
    "SpeedupAxis",
    "SpeedupBar",
    "fom_by_point",
    "fom_by_point_chart",
    "speedup_bar_chart",
    "speedup_axis",
    "speedup_bars",
]

VERDICT_COLOURS = {
    Verdict.BETTER: "#2e7d32",
    Verdict.WORSE: "#c62828",
    Verdict.INDISTINGUISHABLE: "#9e9e9e",
    Verdict.INSUFFICIENT: "#e0e0e0",
}
WIDTH_IN = 6.0
MAX_BARS = 40
"""Bars the speedup chart draws at most (the first in rank order)."""
CUT_WIDTH = 3.0
"""An interval more than this many times as wide (on the log scale) as the median of the
others' does not set the speedup axis: it is drawn cut at the axis's edge."""


class SpeedupBar(NamedTuple):
    """One bar of the speedup chart: the point, its speedup and CI, and its verdict."""

    label: str
    speedup: float
    ci_low: float
    ci_high: float
    verdict: Verdict


class SpeedupAxis(NamedTuple):
    """The speedup chart's x axis: its limits, whether it is a log axis, and the indexes of
    the bars whose interval reaches beyond it (drawn cut, their bounds written beside)."""

    low: float
    high: float
    log: bool
    cut: tuple[int, ...]


class PointRuns(NamedTuple):
    """Every successful value of one point, with its count of runs that were not ok."""

    label: str
    values: np.ndarray
    n_not_ok: int


def _legible(ax: Any) -> None:
    """Tick labels at the size a phone can still read (see :data:`PHONE_TEXT_PT`)."""
    ax.tick_params(axis="both", which="both", labelsize=PHONE_TEXT_PT)


def speedup_bars(comparisons: Sequence[PointComparison]) -> list[SpeedupBar]:
    """Bars for every compared point except the baseline and points without a speedup,
    in the comparisons' rank order (best first)."""
    bars = []
    for pc in comparisons:
        c = pc.comparison
        if pc.is_baseline or math.isnan(c.speedup):
            continue
        bars.append(
            SpeedupBar(point_label(pc.summary.params), c.speedup, c.ci_low, c.ci_high, c.verdict)
        )
    return bars


def _log_width(bar: SpeedupBar) -> float:
    """The width of ``bar``'s interval on the log scale: inf when a bound is not positive,
    NaN without an interval."""
    if math.isnan(bar.ci_low) or math.isnan(bar.ci_high):
        return math.nan
    if bar.ci_low <= 0:
        return math.inf
    return math.log(bar.ci_high / bar.ci_low)


def speedup_axis(bars: Sequence[SpeedupBar], noise: float) -> SpeedupAxis:
    """The x axis of the speedup chart: it holds every speedup and every interval but those
    more than :data:`CUT_WIDTH` times as wide as the median of the others (an interval of a
    point with 2 runs, [0.0001, 742], squeezed every other bar to nothing); a log axis,
    symmetric in 1, when the ratios span more than 4x, else a linear one with the noise band.
    """
    widths = [_log_width(b) for b in bars]
    kept: list[float] = [b.speedup for b in bars]
    for i, (bar, width) in enumerate(zip(bars, widths, strict=True)):
        others = [w for j, w in enumerate(widths) if j != i and not math.isnan(w)]
        if math.isnan(width):
            continue
        if others and width > CUT_WIDTH * max(float(np.median(others)), 2 * math.log1p(noise)):
            continue
        kept += [bar.ci_low, bar.ci_high]
    lo, hi = min(kept, default=1.0), max(kept, default=1.0)
    if lo > 0 and hi / lo > 4:  # ratios spanning orders of magnitude
        reach = max(hi, 1 / lo) ** 1.1
        low, high, log = 1 / reach, reach, True
    else:
        span = max(hi - 1.0, 1.0 - lo)
        low, high, log = max(1 - 1.15 * span - noise, 0.0), 1 + 1.15 * span + noise, False
    cut = tuple(i for i, b in enumerate(bars) if b.ci_low < low or b.ci_high > high)
    return SpeedupAxis(low, high, log, cut)


def fom_by_point(
    runs: pd.DataFrame, fom: str, order: Sequence[str] | None = None
) -> list[PointRuns]:
    """Successful values of ``fom`` per point (``order``: point keys; default: by median)."""
    column = fom_column(fom)
    if column not in runs.columns:
        raise StatsError(f"no figure of merit {column.removeprefix('fom.')!r} in the runs")
    if "point" not in runs.columns or "status" not in runs.columns:
        raise StatsError("runs table lacks column(s) point, status")
    groups: list[tuple[str, PointRuns]] = []
    ok_values = runs[column].to_numpy(dtype=float).copy()
    ok_values[(runs["status"] != "ok").to_numpy()] = np.nan
    for point, index in runs.groupby("point", sort=False).indices.items():
        rows_n = len(index)
        values = ok_values[index]
        values = values[~np.isnan(values)]
        params = json.loads(point)
        label = point_label(params) if isinstance(params, dict) else str(point)
        groups.append((str(point), PointRuns(label, values, rows_n - int(values.size))))
    if order is not None:
        rank = {key: i for i, key in enumerate(order)}
        groups.sort(key=lambda g: rank.get(g[0], len(rank)))
    else:
        groups.sort(key=lambda g: (g[1].values.size == 0, _median(g[1].values)))
    return [g[1] for g in groups]


def _baseline_label(key: str | None) -> str | None:
    if key is None:
        return None
    try:
        params = json.loads(key)
    except (TypeError, ValueError):
        return None
    return point_label(params) if isinstance(params, dict) else None


def _median(values: np.ndarray) -> float:
    return float(np.median(values)) if values.size else 0.0


def _ratio_ticks(ax: Any, low: float, high: float) -> None:
    """Ticks at powers of two (…, 0.25×, 0.5×, 1×, 2×, 4×, …) on a log ratio axis: at most
    five, so that they stay apart at a phone's text size (every 2nd, 4th… power when more)."""
    from matplotlib.ticker import FixedLocator, NullFormatter

    exponents = [e for e in range(math.floor(math.log2(low)), math.ceil(math.log2(high)) + 1)
                 if low <= 2.0**e <= high]
    step = 1
    while sum(e % step == 0 for e in exponents) > 5:
        step *= 2
    ax.xaxis.set_major_locator(FixedLocator([2.0**e for e in exponents if e % step == 0]))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _ratio_labels(ax: Any) -> None:
    """Tick labels as plain ratios: 0.5×, 1×, 2× (no 10^x, no offset)."""
    from matplotlib.ticker import FuncFormatter

    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:.3g}×"))


def _cut_interval(ax: Any, bar: SpeedupBar, y: float, axis: SpeedupAxis) -> None:
    """Arrows where ``bar``'s interval leaves the axis, and its bounds written above it, at
    the edge where it is cut (the right one when cut at both)."""
    right = bar.ci_high > axis.high
    for edge, marker in ((axis.low, "<"), (axis.high, ">")):
        if (edge == axis.high and right) or (edge == axis.low and bar.ci_low < axis.low):
            ax.plot([edge], [y], marker=marker, color="black", markersize=7, clip_on=False,
                    zorder=4)
    ax.annotate(
        f"interval {bar.ci_low:.3g}–{bar.ci_high:.3g}×", (axis.high if right else axis.low, y),
        xytext=(-6 if right else 6, 5), textcoords="offset points",
        ha="right" if right else "left", va="bottom", fontsize=PHONE_TEXT_PT - 1, zorder=5,
        bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
    )  # fmt: skip


def speedup_bar_chart(
    comparisons: Sequence[PointComparison],
    path: str | Path,
    title: str | None = None,
    *,
    objective: Objective | None = None,
    max_bars: int = MAX_BARS,
) -> Path:
    """Horizontal bars of each point's speedup over the baseline with CI error bars,
    a line at 1 and the noise band around it, coloured by verdict. Only the first
    ``max_bars`` points in rank order are drawn (the title says so). Writes a PNG."""
    import textwrap

    from tunelab.report.views import ci_caption

    plt = pyplot()
    all_bars = speedup_bars(comparisons)
    bars = all_bars[:max_bars]
    if len(all_bars) > len(bars):
        title = f"{title or 'Speedup over the baseline'} (best {len(bars)} of {len(all_bars)})"
    path = Path(path)
    noise = comparisons[0].comparison.noise_threshold if comparisons else 0.02
    confidence = comparisons[0].comparison.confidence if comparisons else 0.95
    axis = speedup_axis(bars, noise)
    height = 1.8 + 0.5 * max(len(bars), 1)
    fig, ax = plt.subplots(figsize=(WIDTH_IN, height), layout="constrained")
    try:
        ax.axvspan(1 / (1 + noise), 1 + noise, color="#fff3cd", zorder=0,
                   label=f"±{noise:.0%} noise")
        ax.axvline(1.0, color="black", linewidth=1, zorder=1)
        if bars:
            y = np.arange(len(bars))[::-1]
            speed = np.array([b.speedup for b in bars])
            low = np.array([b.ci_low for b in bars])
            high = np.array([b.ci_high for b in bars])
            has_ci = ~np.isnan(low)
            colours = [VERDICT_COLOURS[b.verdict] for b in bars]
            ax.barh(y, speed - 1.0, left=1.0, color=colours, edgecolor="#424242", zorder=2)
            cut = np.isin(np.arange(len(bars)), axis.cut)
            for whole, caps in ((has_ci & ~cut, 3), (has_ci & cut, 0)):  # cut: no caps
                drawn_low = np.clip(low, axis.low, axis.high)[whole]
                drawn_high = np.clip(high, axis.low, axis.high)[whole]
                ax.errorbar(
                    speed[whole], y[whole], xerr=[speed[whole] - drawn_low,
                                                  drawn_high - speed[whole]],
                    fmt="none", ecolor="black", capsize=caps, zorder=3,
                )  # fmt: skip
            for i in axis.cut:
                _cut_interval(ax, bars[i], float(y[i]), axis)
            ax.set_yticks(y, [short_label(b.label) for b in bars])
            if axis.log:
                ax.set_xscale("log")
                _ratio_ticks(ax, axis.low, axis.high)
            ax.set_xlim(axis.low, axis.high)
            _ratio_labels(ax)
            seen: set[Verdict] = set()
            for b in bars:
                if b.verdict in seen:
                    continue
                seen.add(b.verdict)
                text = (
                    verdict_label(b.verdict, objective.fom, objective.direction)
                    if objective
                    else b.verdict.value
                )
                ax.barh([np.nan], [np.nan], color=VERDICT_COLOURS[b.verdict], label=text)
        else:
            ax.set_yticks([])
            ax.text(1.0, 0.5, "no point to compare", ha="center", transform=ax.transData)
        fom = f" of {objective.fom.removeprefix('fom.')}" if objective else ""
        caption = textwrap.wrap(ci_caption(comparisons, confidence) + (
            f"; intervals over {CUT_WIDTH:g}x as wide as the others' are cut at the edge "
            "(arrow), their bounds written beside them" if axis.cut else ""), 2 * LABEL_LINE)
        figure_titles(fig, ax, title or "Speedup over the baseline",
                      "\n".join([f"speedup over baseline{fom} (> 1 is better)", *caption]))
        handles, names = ax.get_legend_handles_labels()  # below: the bars keep the width
        fig.legend(handles, names, loc="outside lower center", ncols=3,
                   fontsize=PHONE_TEXT_PT - 1, frameon=False)
        ax.grid(axis="x", alpha=0.3)
        _legible(ax)
        save_png(fig, path)
    finally:
        plt.close(fig)
    return path


def fom_by_point_chart(
    runs: pd.DataFrame,
    fom: str,
    path: str | Path,
    *,
    order: Sequence[str] | None = None,
    title: str | None = None,
    baseline: str | None = None,
    max_points: int = 40,
) -> Path:
    """Box plot of every successful run per point with the runs themselves as dots
    (jittered, seeded) and the count of runs that were not ok. Only the first
    ``max_points`` points of ``order`` (default: by median) are drawn. Writes a PNG."""
    plt = pyplot()
    all_groups = fom_by_point(runs, fom, order)
    groups = all_groups[:max_points]
    if len(all_groups) > len(groups):
        name = fom_column(fom).removeprefix("fom.")
        shown = f"(first {len(groups)} of {len(all_groups)})"
        title = f"{title or f'{name} of every run, per point'} {shown}"
    base_label = _baseline_label(baseline)
    path = Path(path)
    name = fom_column(fom).removeprefix("fom.")
    height = 1.2 + 0.5 * max(len(groups), 1)
    fig, ax = plt.subplots(figsize=(WIDTH_IN, height), layout="constrained")
    try:
        y = np.arange(len(groups))[::-1]
        with_values = [i for i, g in enumerate(groups) if g.values.size]
        if with_values:
            ax.boxplot(
                [groups[i].values for i in with_values],
                positions=y[with_values],
                orientation="horizontal",
                widths=0.6,
                showfliers=False,
                medianprops={"color": "#1565c0"},
            )
        jitter = np.random.default_rng(0)
        for i, g in enumerate(groups):
            if g.values.size:
                ys = y[i] + jitter.uniform(-0.18, 0.18, g.values.size)
                ax.plot(g.values, ys, "o", color="#424242", alpha=0.6, markersize=3.5)
        labels = [
            short_label(g.label) + "".join(
                f"\n({note})" for note in (
                    "baseline" if g.label == base_label else "",
                    f"{g.n_not_ok} not ok" if g.n_not_ok else "") if note)
            for g in groups
        ]
        ax.set_yticks(y, labels)
        figure_titles(fig, ax, title or f"{name} of every run, per point", name)
        ax.grid(axis="x", alpha=0.3)
        _legible(ax)
        save_png(fig, path)
    finally:
        plt.close(fig)
    return path
