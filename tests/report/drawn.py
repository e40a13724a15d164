"""What a report's figure draws, measured as saved: the test that its text stays inside the
figure and apart (any chart: the speedup and runs charts, scaling, storage, headroom)."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

Box = tuple[float, float, float, float]


class Drawn(NamedTuple):
    """One figure as a report saved it: its size, the extent of all it draws (titles, axis
    labels, legends, annotations included) and of each visible text, in pixels."""

    width: float
    height: float
    extent: Box
    texts: list[tuple[str, Box]]

    def text(self) -> str:
        """Its texts, one a line."""
        return "\n".join(t for t, _ in self.texts)


def drawn_figures(monkeypatch: pytest.MonkeyPatch) -> list[Drawn]:
    """Every figure saved from now on while the test runs, as drawn (the texts drawn, not
    every text a figure holds: ticks outside the view keep theirs undrawn)."""
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    figures: list[Drawn] = []
    save, draw = Figure.savefig, Text.draw
    texts: list[Text] = []

    def drawing(text: Text, renderer: Any) -> None:
        draw(text, renderer)
        if text.get_visible() and text.get_text().strip():
            texts.append(text)

    def keep(fig: Figure, *args: Any, **kwargs: Any) -> None:
        save(fig, *args, **kwargs)
        texts.clear()
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        x0, y0, x1, y1 = fig.get_tightbbox(renderer).extents * fig.dpi
        drawn = [(t.get_text(), _box(t.get_window_extent(renderer).extents)) for t in texts]
        figures.append(Drawn(fig.bbox.width, fig.bbox.height, (x0, y0, x1, y1), drawn))

    monkeypatch.setattr(Figure, "savefig", keep)
    monkeypatch.setattr(Text, "draw", drawing)
    return figures


def _box(extents: Any) -> Box:
    x0, y0, x1, y1 = (float(v) for v in extents)
    return x0, y0, x1, y1


def assert_legible(figure: Drawn) -> None:
    """All ``figure`` draws lies inside it, and no two of its texts overlap."""
    x0, y0, x1, y1 = figure.extent
    inside = x0 >= 0 and y0 >= 0 and x1 <= figure.width + 0.5 and y1 <= figure.height + 0.5
    assert inside, (figure.extent, figure.width, figure.height, figure.text())
    for i, (a, (ax0, ay0, ax1, ay1)) in enumerate(figure.texts):
        for b, (bx0, by0, bx1, by1) in figure.texts[i + 1:]:
            apart = ax1 <= bx0 + 1 or bx1 <= ax0 + 1 or ay1 <= by0 + 1 or by1 <= ay0 + 1
            assert apart, f"{a!r} overlaps {b!r}"
