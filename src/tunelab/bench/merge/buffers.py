"""Host buffers reused from one iteration to the next.

A fresh ``np.empty`` of a few MiB is cheap to ask for but expensive to fill the first time:
every 4-KiB page faults and is zeroed by the kernel, which on these machines took longer than
moving the same bytes between processes. The partitioned send columns and the pre-sized
receive columns therefore live in a :class:`BufferPool` and are written again every iteration.
"""

from __future__ import annotations

import numpy as np

__all__ = ["BufferPool"]


class BufferPool:
    """Named host arrays, grown (never shrunk) to the largest size asked for.

    ``get(name, n, dtype)`` returns a view of ``n`` elements; a later ``get`` of the same name
    overwrites it, so a caller keeps one name per array that must stay alive at the same time
    (the left and the right columns of one iteration, for example).
    """

    def __init__(self, headroom: float = 1.1) -> None:
        self._arrays: dict[str, np.ndarray] = {}
        self._headroom = headroom

    def get(self, name: str, n: int, dtype: np.dtype | type) -> np.ndarray:
        """An uninitialised array of ``n`` elements of ``dtype`` (pages already touched)."""
        dt = np.dtype(dtype)
        arr = self._arrays.get(name)
        if arr is None or arr.dtype != dt or arr.size < n:
            arr = np.empty(max(int(n * self._headroom), 1), dtype=dt)
            arr.fill(0)  # fault the pages in now, not inside a timed exchange
            self._arrays[name] = arr
        return arr[:n]

    def nbytes(self) -> int:
        """Bytes held."""
        return sum(a.nbytes for a in self._arrays.values())
