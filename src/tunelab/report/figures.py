"""Plotting helpers every figure of the report shares: matplotlib's Agg backend, imported on
first use, and the worker-count axes and per-layout series of the scaling and storage plots."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

__all__ = ["DPI", "LABEL_LINE", "PHONE_TEXT_PT", "TEXT_LINE", "by_layout", "figure_titles",
           "layout_label", "legend_below", "min_tick_px", "plain_numbers", "pyplot", "save_png",
           "short_label", "worker_axis", "x_caption"]

DPI = 100
"""Pixels per inch of the report's PNGs."""
PHONE_TEXT_PT = 11.0
"""Tick labels of a figure meant to be read on a phone too: a 6-inch figure (600 px) shown
370 px wide keeps 11-point text 9.4 px tall."""
TEXT_LINE = 60
"""Characters of one line of a figure's title or x-axis caption: at 12 points about 530 px,
inside a 6-inch (600 px) figure."""
LABEL_LINE = 26
"""Characters of one line of a point's label on a plot axis (two lines at most): the
figures are 6 inches wide so that their text stays legible on a phone."""
LEGEND_ROW = 100
"""Characters of a row of a legend below a figure (its columns' labels together)."""
MIN_TICK_PX_KEY = "tunelab:min-tick-px"
"""The PNG text chunk that records the smallest tick label's font size in image pixels (the
report's layout test scales it by the width a browser shows the image at)."""


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed), imported on first use."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _wrapped(text: str) -> str:
    """``text`` wrapped to :data:`TEXT_LINE` characters a line, its own line breaks kept."""
    import textwrap

    return "\n".join(line for part in text.splitlines()
                     for line in textwrap.wrap(part, TEXT_LINE) or [""])


def short_label(text: str, width: int = LABEL_LINE, lines: int = 2, *,
                keep_end: bool = False) -> str:
    """``text`` (a point's or a series' label) broken between its words into at most
    ``lines`` lines of ``width`` characters, cut with … beyond; with ``keep_end``, cut in the
    middle instead, so that the end (a legend entry's layout, the parameter that differs
    last) still tells entries apart."""
    import textwrap

    room = width * lines * 2 // 5  # characters kept at each end; word breaks waste some
    if keep_end and len(text) > 2 * room + 1:
        text = f"{text[:room]}…{text[-room:]}"
    return "\n".join(textwrap.wrap(text, width, max_lines=lines, placeholder="…") or [text])


def figure_titles(fig: Any, ax: Any, title: str, xlabel: str) -> None:
    """``title`` above the plot, centred on the figure, and ``xlabel`` below ``ax``, flush
    with its right edge; both wrapped to :data:`TEXT_LINE` characters a line (existing line
    breaks kept), so that both stay inside a 6-inch figure.

    Centred on the axes (``ax.set_title``, ``ax.set_xlabel``), a title or label wider than
    the axes ran off the figure's right edge once long tick labels pushed the axes right:
    the constrained layout counts only their height, never their width."""
    fig.suptitle(_wrapped(title))
    x_caption(ax, xlabel)


def x_caption(ax: Any, text: str) -> None:
    """``text`` below ``ax``, flush with its right edge, wrapped (see :func:`figure_titles`)."""
    ax.set_xlabel(_wrapped(text), loc="right")


def legend_below(fig: Any, ax: Any, fontsize: str | float = "small") -> None:
    """``ax``'s legend below its axes, each entry at most two lines of :data:`TEXT_LINE`
    characters (cut in the middle), in as many columns as :data:`LEGEND_ROW` characters
    hold (three at most); the figure grows by the legend's height, so the axes keep theirs.
    Inside the axes, the legend of long series names squeezed them until the title ran off
    the figure (the constrained layout shrinks an axes to hold its legend)."""
    import math

    from matplotlib.font_manager import FontProperties

    handles, names = ax.get_legend_handles_labels()
    labels = [short_label(name, TEXT_LINE, keep_end=True) for name in names]
    longest = max((len(line) for label in labels for line in label.splitlines()), default=1)
    ncols = max(1, min(3, LEGEND_ROW // (longest + 8)))
    lines = math.ceil(sum(label.count("\n") + 1 for label in labels) / ncols)
    size = FontProperties(size=fontsize).get_size_in_points()
    entries = math.ceil(len(labels) / ncols)
    fig.set_figheight(fig.get_figheight() + (1.2 * lines + 0.5 * entries + 1.0) * size / 72)
    fig.legend(handles, labels, loc="outside lower center", fontsize=fontsize, frameon=False,
               ncols=ncols)


def plain_numbers() -> Any:
    """A tick formatter that prints plain numbers (``8``, not ``2^3`` or ``8.0``)."""
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _pos: f"{v:g}")


def worker_axis(ax: Any) -> None:
    """Log-2 worker axis labelled 1, 2, 4, …"""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(plain_numbers())


def layout_label(series: str, nodes: int) -> str:
    """The legend text of one layout: ``2 nodes``, or ``files: 2 nodes`` in a series."""
    text = f"{nodes} node{'s' if nodes > 1 else ''}"
    return f"{series}: {text}" if series else text


class Layout(Protocol):
    """A measured point of a scaling or storage plot: its series, nodes and workers."""

    @property
    def series(self) -> str: ...
    @property
    def nodes(self) -> int: ...
    @property
    def workers(self) -> int: ...


P = TypeVar("P", bound=Layout)


def by_layout(points: Sequence[P]) -> dict[tuple[str, int], list[P]]:
    """Points by (series, nodes), each line sorted by workers: one plotted line each."""
    groups: dict[tuple[str, int], list[P]] = {}
    for p in points:
        groups.setdefault((p.series, p.nodes), []).append(p)
    return {k: sorted(v, key=lambda p: p.workers) for k, v in sorted(groups.items())}


def min_tick_px(fig: Any) -> float:
    """The font size, in image pixels, of the smallest visible tick label of ``fig``."""
    sizes = [label.get_fontsize() for ax in fig.axes
             for axis in (ax.xaxis, ax.yaxis)
             for label in axis.get_ticklabels(which="both")
             if label.get_visible() and label.get_text()]
    return min(sizes, default=0.0) * fig.dpi / 72


def save_png(fig: Any, path: Any) -> None:
    """Write ``fig`` as a PNG at :data:`DPI`, with the smallest tick label's size in pixels
    in its metadata (:data:`MIN_TICK_PX_KEY`)."""
    fig.set_dpi(DPI)
    fig.canvas.draw()  # tick labels exist once drawn
    fig.savefig(path, format="png", dpi=DPI,
                metadata={MIN_TICK_PX_KEY: f"{min_tick_px(fig):.2f}"})
