"""Storage plots: accelerator utilisation vs workers with the 90 % line, and read MB/s vs
workers with the rate the accelerators need (the mean per accelerator x workers, its 95 %
interval shaded).

:func:`storage_plot_data` is the pure data step (:func:`tunelab.storage.storage_analysis`,
tested without drawing); :func:`storage_plots` draws the PNGs with matplotlib's Agg backend.
A workload asks for them with ``report_figures = ("storage", …)`` (``ddp`` does); runs
without input-pipeline figures draw nothing. :func:`storage_lines` puts the analysis in
sentences for ``compare`` and the HTML report.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunelab.report.figures import (
    by_layout,
    figure_titles,
    layout_label,
    legend_below,
    pyplot,
    worker_axis,
)
from tunelab.stats import StatsError
from tunelab.storage import StorageAnalysis, StoragePoint, storage_analysis

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["needed_text", "storage_lines", "storage_notes", "storage_plot_data", "storage_plots"]

MB = 1e6


def storage_plot_data(runs: pd.DataFrame) -> StorageAnalysis | None:
    """The analysis the plots show, or None for runs without input-pipeline figures."""
    try:
        return storage_analysis(runs)
    except StatsError:
        return None


def needed_text(data: StorageAnalysis) -> list[str]:
    """One line per series: MB/s per accelerator needed for the AU target, interval."""
    out = []
    for r in data.needed:
        interval = ("" if math.isnan(r.low) else f" [{r.low / MB:,.1f}, {r.high / MB:,.1f}]")
        who = f"{r.series}: " if r.series else ""
        ceil = ("" if math.isnan(r.ceiling_low)
                else f" [{r.ceiling_low / MB:,.1f}, {r.ceiling_high / MB:,.1f}]")
        capped = ("; the all-reduce alone keeps AU below the target"
                  if r.ceiling < r.needed else "")
        out.append(f"{who}{r.needed / MB:,.1f} MB/s{interval} per accelerator for AU >= "
                   f"{data.target:.0%} (compute / step; at most {r.ceiling / MB:,.1f} MB/s"
                   f"{ceil} consumed with the all-reduce measured{capped}; {r.n} runs)")
    return out


def storage_lines(data: StorageAnalysis) -> list[str]:
    """The analysis in sentences: the needed MB/s per accelerator with its interval, the
    largest worker count each series sustains, and where the bottleneck moves."""
    lines = [f"AU >= {data.target:.0%}: {line}" for line in needed_text(data)]
    for s in data.sustained:
        who = f"{s.series}, " if s.series else ""
        if not s.workers:
            lines.append(f"{who}{s.nodes} node(s): AU < {data.target:.0%} at every worker "
                         f"count measured (up to {s.measured_max})")
            continue
        lines.append(f"{who}{s.nodes} node(s): AU >= {data.target:.0%} up to {s.workers} "
                     f"worker(s) of the {s.measured_max} measured"
                     + (" (the interval's low end too)" if s.confident else ""))
    for b in data.bottlenecks:
        who = f"{b.series}, " if b.series else ""
        walk = ", ".join(f"{n}: {lab}" for n, lab in b.labels)
        shift = f"; moves {b.shift} at {b.shift_at} workers" if b.shift_at else ""
        lines.append(f"{who}{b.nodes} node(s) bottleneck by workers: {walk}{shift}")
    return lines


def storage_notes(runs: pd.DataFrame) -> list[str]:
    """:func:`storage_lines` of ``runs``; none for runs without input-pipeline figures (the
    HTML report shows them under its verdict)."""
    data = storage_plot_data(runs)
    return [] if data is None else storage_lines(data)


def _axes(fig: Any, ax: Any, title: str) -> None:
    """The worker axis, ``title`` and the legend below (see :func:`legend_below`)."""
    worker_axis(ax)
    figure_titles(fig, ax, title, "workers (emulated accelerators)")
    ax.grid(alpha=0.3, which="both")
    legend_below(fig, ax)


def _err(points: list[StoragePoint], mean: str, low: str, high: str,
         scale: float) -> list[list[float]]:
    def gap(p: StoragePoint, a: str, b: str) -> float:
        v = (getattr(p, a) - getattr(p, b)) / scale
        return 0.0 if math.isnan(v) else abs(v)

    return [[gap(p, mean, low) for p in points], [gap(p, high, mean) for p in points]]


def storage_plots(runs: pd.DataFrame, out_dir: str | Path, *, prefix: str = "storage",
                  ) -> list[Path]:
    """Write ``<prefix>-au.png`` and ``<prefix>-read.png``; their paths (none without
    input-pipeline figures; no read plot when no run read anything — synthetic or
    in-memory data — where it was an empty chart and matplotlib warned of an empty
    legend on stderr)."""
    data = storage_plot_data(runs)
    if data is None or not data.points:
        return []
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [_au_plot(data, out / f"{prefix}-au.png")]
    if data.needed or any(p.read_Bps > 0 for p in data.points):
        paths.append(_read_plot(data, out / f"{prefix}-read.png"))
    return paths


def _au_plot(data: StorageAnalysis, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    try:
        for (series, k), pts in by_layout(data.points).items():
            ax.errorbar([p.workers for p in pts], [100 * p.au for p in pts],
                        yerr=_err(pts, "au", "au_low", "au_high", 0.01), fmt="o-", capsize=3,
                        label=layout_label(series, k))
        ax.axhline(100 * data.target, color="black", linestyle="--",
                   label=f"AU {data.target:.0%} (MLPerf Storage)")
        _axes(fig, ax, "AU vs workers: compute / step time (MLPerf Storage's AU)")
        ax.set_ylim(0, 102)
        ax.set_ylabel("accelerator utilisation, % of the step (95% CI)")
        fig.savefig(path, format="png", dpi=110)
    finally:
        plt.close(fig)
    return path


def _read_plot(data: StorageAnalysis, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5), layout="constrained")
    try:
        colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        groups = by_layout(data.points)
        for i, ((series, k), pts) in enumerate(groups.items()):
            c = colours[i % len(colours)]
            pts = [p for p in pts if p.read_Bps > 0]  # memory sources read nothing
            if not pts:
                continue
            ax.errorbar([p.workers for p in pts], [p.read_Bps / MB for p in pts],
                        yerr=_err(pts, "read_Bps", "read_low", "read_high", MB), fmt="o-",
                        color=c, capsize=3, label=f"{layout_label(series, k)}: read")
        top = max(p.workers for p in data.points)
        xs = [1, top] if top > 1 else [1, 2]
        for i, r in enumerate(data.needed):
            c = colours[(len(groups) + i) % len(colours)]
            who = f"{r.series}: " if r.series else ""
            ax.plot(xs, [r.needed * x / MB for x in xs], ":", color=c,
                    label=f"{who}needed for AU {data.target:.0%}: {r.needed / MB:,.1f} MB/s "
                          "per accelerator")
            if not math.isnan(r.low):
                ax.fill_between(xs, [r.low * x / MB for x in xs], [r.high * x / MB for x in xs],
                                color=c, alpha=0.15)
        _axes(fig, ax, "Read MB/s vs workers, and what the accelerators need")
        ax.set_yscale("log")
        ax.set_ylabel("read from storage, MB/s (10^6 bytes per second; 95% CI)")
        fig.savefig(path, format="png", dpi=110)
    finally:
        plt.close(fig)
    return path
