"""How genome-wide prediction covers a chromosome: the windows it predicts and the parts of
them it keeps (:class:`Tiling`), and the independent sections a chromosome is cut into
(:class:`Section`, :func:`plan_sections`), for :mod:`tunelab.leopard.predict`.

**Tiling.** Each chromosome is covered by windows of ``window`` bp (the training length by
default; a U-Net is fully convolutional, so a longer prediction window only adds context) at
starts ``0, stride, 2*stride, ...`` plus one window flush with the chromosome's end. From
every window only the centre ``[edge, window - edge)`` is kept, where the network sees
context on both sides (the chromosome's own ends are kept too); where kept parts overlap the
predictions are averaged. The default ``stride = window - 2*edge`` predicts every base once
(only the flush window overlaps its neighbour); ``stride = window / 2`` is the older scheme
that averages two predictions per base at twice the cost. ``edge <= window / 4`` and
``stride <= window - 2*edge`` guarantee every base is covered.

**Sections.** Each chromosome is cut into sections of at most ``section_bp`` output bases. A
section takes every window whose kept part meets it (a window across a boundary is predicted
for both sections: one or two per section of megabases), so sections are independent — read,
predicted and written on their own — and the track is the one a single pass would give.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tunelab.leopard.errors import LeopardError
from tunelab.leopard.readers import Region

__all__ = ["Section", "Tiling", "plan_sections"]


@dataclass(frozen=True)
class Tiling:
    """Where windows start and which part of each is kept (see the module docstring)."""

    window: int
    edge: int
    stride: int

    @classmethod
    def make(cls, window: int, edge: int | None = None, stride: int | None = None) -> Tiling:
        """Defaults ``edge = window / 8``, ``stride = window - 2 * edge``; checked."""
        if window <= 0 or window % 2:
            raise LeopardError(f"window length {window} must be even and positive")
        edge = window // 8 if edge is None else edge
        if not 0 <= edge <= window // 4:
            raise LeopardError(f"edge {edge} must lie in [0, window/4 = {window // 4}]")
        stride = window - 2 * edge if stride is None else stride
        if not 0 < stride <= window - 2 * edge:
            raise LeopardError(f"stride {stride} must lie in [1, window - 2*edge = "
                               f"{window - 2 * edge}] so that every base is covered")
        return cls(window, edge, stride)

    def starts(self, length: int) -> np.ndarray:
        """Window starts over a sequence of ``length`` bp (at least ``window`` long)."""
        last = max(length - self.window, 0)
        starts = np.arange(0, last + 1, self.stride, dtype=np.int64)
        return starts if starts[-1] == last else np.append(starts, last)

    def kept(self, start: int, length: int) -> tuple[int, int]:
        """The part ``[lo, hi)`` of the window at ``start`` whose predictions are used."""
        lo = 0 if start == 0 else self.edge
        hi = self.window if start + self.window >= length else self.window - self.edge
        return lo, hi


@dataclass(frozen=True)
class Section:
    """Output bases ``[lo, hi)`` of ``chrom`` (``length`` bp) and the windows that reach them:
    starts, and the kept part ``[keep_lo, keep_hi)`` of each (window-relative)."""

    chrom: str
    length: int
    lo: int
    hi: int
    starts: np.ndarray
    keep_lo: np.ndarray
    keep_hi: np.ndarray

    def region(self, window: int) -> Region:
        """What to read: from the first window's start to the last one's end (within the
        chromosome; a chromosome shorter than the window is padded on the device)."""
        return Region(self.chrom, int(self.starts[0]),
                      min(int(self.starts[-1]) + window, self.length), self)


def plan_sections(tiling: Tiling, chrom: str, length: int, section_bp: int) -> list[Section]:
    """``chrom`` cut into sections of at most ``section_bp`` output bases."""
    w = tiling.window
    padded = max(length, w)
    starts = tiling.starts(padded)
    keep_lo = np.where(starts == 0, 0, tiling.edge)
    keep_hi = np.where(starts + w >= padded, w, w - tiling.edge)
    out = []
    for lo in range(0, length, section_bp):
        hi = min(lo + section_bp, length)
        sel = (starts + keep_hi > lo) & (starts + keep_lo < hi)
        out.append(Section(chrom, length, lo, hi, starts[sel], keep_lo[sel], keep_hi[sel]))
    return out
