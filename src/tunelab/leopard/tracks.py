"""The output track of genome-wide prediction: a bigWig or a bedGraph, written as finished
stretches arrive, in a background thread or in the caller's.

A bigWig is written by :class:`~tunelab.leopard.bigwig.BigWigWriter` (ISA-L deflate; its
blocks rounded and compressed by ``threads`` writer threads, the same bytes for any count),
or by pyBigWig when zoom levels are wanted; anything else is a bedGraph. Values are
probabilities rounded to ``digits`` (4).
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

import numpy as np

from tunelab.leopard.bigwig import BigWigWriter
from tunelab.leopard.errors import LeopardError

__all__ = ["TrackWriter"]

#: finished stretches queued for the background thread
_WRITE_AHEAD = 4


class TrackWriter:
    """Appends finished stretches to ``path``: in a background thread when ``background``
    (else at once, in the caller's), a bigWig's blocks compressed by ``threads`` threads."""

    def __init__(self, path: Path, sizes: list[tuple[str, int]], digits: int = 4,
                 zoom_levels: int = 0, background: bool = True, threads: int = 0) -> None:
        self.path, self.digits = path, digits
        self.handle: Any
        self.kind = "bedgraph"
        bigwig = path.suffix.lower() in (".bw", ".bigwig")
        if bigwig and zoom_levels:
            import pyBigWig

            self.handle = pyBigWig.open(str(path), "w")
            if self.handle is None:
                raise LeopardError(f"{path}: cannot create the bigWig file")
            self.handle.addHeader(sizes, maxZooms=zoom_levels)
            self.kind = "pybigwig"
        elif bigwig:
            self.handle = BigWigWriter(path, sizes, digits=digits, threads=threads)
            self.kind = "bigwig"
        else:
            self.handle = path.open("w")
        self._q: queue.Queue[tuple[str, int, np.ndarray] | None] = queue.Queue(_WRITE_AHEAD)
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._work, name="leopard-writer",
                                            daemon=True)
            self._thread.start()

    def put(self, chrom: str, start: int, values: np.ndarray) -> None:
        """Queue (or write) ``values`` for bases ``start, start + 1, ...`` of ``chrom``."""
        if self._error is not None:
            raise LeopardError(f"{self.path}: writing failed ({self._error})")
        if self._thread is None:
            try:
                self._write(chrom, start, values)
            except Exception as exc:
                self._error = exc
                raise LeopardError(f"{self.path}: writing failed ({exc})") from None
            return
        self._q.put((chrom, start, values))

    def _work(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            if self._error is None:
                try:
                    self._write(*item)
                except Exception as exc:  # reported by put()/close() in the main thread
                    self._error = exc

    def _write(self, chrom: str, start: int, values: np.ndarray) -> None:
        if self.kind == "bigwig":  # rounded by the writer's threads
            self.handle.add(chrom, start, values)
            return
        v = np.round(values.astype(np.float64), self.digits)
        if self.kind == "pybigwig":
            self.handle.addEntries(chrom, start, values=v, span=1, step=1)
            return
        change = np.flatnonzero(np.diff(v)) + 1
        starts = np.concatenate([[0], change])
        ends = np.concatenate([change, [len(v)]])
        d = self.digits
        self.handle.writelines(f"{chrom}\t{start + s}\t{start + e}\t{v[s]:.{d}f}\n"
                               for s, e in zip(starts.tolist(), ends.tolist(), strict=True))

    def close(self) -> None:
        """Write what is queued, close the file; raise a writing error."""
        if self._thread is not None:
            self._q.put(None)
            self._thread.join()
        try:
            self.handle.close()
        except LeopardError:
            raise
        except Exception as exc:
            if self._error is None:
                self._error = exc
        if self._error is not None:
            raise LeopardError(f"{self.path}: writing failed ({self._error})")
