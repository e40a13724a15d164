"""The HTML report's headroom figures: a roofline when the runs declare FLOPs and bytes, else
each point's fraction of its bound as bars.

:func:`roofline_data` is the pure data step (tested without drawing): per point the
arithmetic intensity (FLOPs per byte of one run), the FLOP/s it reached, and the two roofs
of the machine (the GEMM bound, flat; the byte bound times the intensity, slanted: memory,
link or storage, whichever the bytes went through). :func:`headroom_plot` draws one PNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tunelab.report.figures import legend_below, pyplot, short_label, x_caption
from tunelab.report.formats import point_label

if TYPE_CHECKING:
    from tunelab.bounds.headroom import Headroom, HeadroomItem

__all__ = ["RooflinePoint", "headroom_plot", "roofline_data"]


@dataclass(frozen=True)
class RooflinePoint:
    """One point on the roofline: FLOPs per byte, FLOP/s reached, and its two roofs."""

    label: str
    intensity: float
    flops: float
    peak: float
    peak_label: str
    slope: float
    slope_label: str


def _judged(item: HeadroomItem) -> bool:
    return (item.bound is not None and math.isfinite(item.amount) and item.amount > 0
            and math.isfinite(item.rate))


def roofline_data(data: Headroom) -> list[RooflinePoint]:
    """The points that declare both FLOPs and bytes, with bounds for both (empty if none)."""
    out = []
    for p in data.points.values():
        gemm = next((i for i in p.items if i.kind == "gemm" and _judged(i)), None)
        moved = next((i for i in p.items if i.kind != "gemm" and _judged(i)), None)
        if gemm is None or moved is None or gemm.bound is None or moved.bound is None:
            continue
        out.append(RooflinePoint(point_label(dict(p.params)), gemm.amount / moved.amount,
                                 gemm.rate, gemm.bound.value, gemm.label, moved.bound.value,
                                 moved.label))
    return out


def headroom_plot(data: Headroom, path: Path) -> Path | None:
    """A roofline of the study's points (or their fractions of bound); None when no point
    was judged against a bound."""
    roof = roofline_data(data)
    if roof:
        return _roofline(roof, path)
    bars = [(point_label(dict(p.params)), p.binding) for p in data.points.values()
            if p.binding is not None]
    if not bars:
        return None
    plt = pyplot()
    bars.sort(key=lambda b: b[1].fraction if b[1] else 0.0)
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(bars) + 1.8), layout="constrained")
    ax.barh(range(len(bars)), [b[1].fraction for b in bars if b[1]], color="#4c72b0")
    ax.set_yticks(range(len(bars)), [short_label(b[0], keep_end=True) for b in bars])
    ax.axvline(1.0, color="#c62828", lw=1.2, label="the measured limit")
    ax.axvline(0.8, color="#9e9e9e", lw=1, ls="--", label="0.8: little room left")
    x_caption(ax, "fraction of bound (point's mean rate / the machine's limit)")
    legend_below(fig, ax, fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _roofline(points: list[RooflinePoint], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    xs = [p.intensity for p in points]
    lo, hi = min(xs) / 4, max(xs) * 4
    for peak, slope, name in dict.fromkeys((p.peak, p.slope, f"{p.peak_label} / {p.slope_label}")
                                           for p in points):
        knee = peak / slope
        grid = sorted({lo, hi, min(max(knee, lo), hi)})
        ax.plot(grid, [min(peak, slope * x) for x in grid], lw=1.6, label=f"roof: {name}")
    ax.scatter(xs, [p.flops for p in points], zorder=3, color="#c62828")
    middle = math.sqrt(lo * hi)
    flops = [p.flops for p in points]
    level = math.sqrt(min(flops) * max(flops))
    for p in points:  # labels toward the middle: at the right edge one ran off the figure
        right, low = p.intensity > middle, p.flops < level
        ax.annotate(short_label(p.label), (p.intensity, p.flops), fontsize=7,
                    xytext=(-4 if right else 4, 4 if low else -4), textcoords="offset points",
                    ha="right" if right else "left", va="bottom" if low else "top")
    ax.set_xscale("log")
    ax.set_yscale("log")
    x_caption(ax, "arithmetic intensity (FLOPs per byte)")
    ax.set_ylabel("FLOP/s reached")
    legend_below(fig, ax, fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
