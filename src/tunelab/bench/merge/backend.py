"""The few dataframe operations the benchmark needs, behind one small interface.

``pandas`` (CPU, numpy buffers) is always available; ``cudf`` (GPU, cupy buffers) is used
when it imports. A partitioned chunk travels as **column buffers**: the ``key`` column and the
``payload`` column, each contiguous int64 with its rows ordered by destination worker, so the
slice for worker ``p`` is one contiguous run of each column (16 bytes per row in all) and
arrives straight in the receiver's pre-sized columns: nothing is pickled or concatenated.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from tunelab.bench.merge.buffers import BufferPool
from tunelab.bench.merge.data import destinations, partition_ids
from tunelab.errors import WorkloadError

__all__ = ["MASK_WORKERS", "Backend", "CudfBackend", "PandasBackend", "get_backend"]


class Backend(Protocol):
    """Dataframe operations of one library. Frames have columns ``key`` and ``payload``."""

    name: str

    def frame(self, key: Any, payload: Any) -> Any:
        """A frame on this backend's device from two columns (host or device arrays)."""

    def partition(self, df: Any, workers: int, pool: BufferPool,
                  name: str) -> tuple[list[Any], np.ndarray]:
        """``([key, payload], counts)``: the columns with rows ordered by destination worker
        (``pool`` buffers under ``name`` where the backend is on the host) and the number of
        rows per destination (host ``int64``)."""

    def merge(self, left: Any, right: Any) -> Any:
        """Inner merge on ``key``; columns ``key, payload_left, payload_right``."""

    def num_rows(self, df: Any) -> int:
        """Number of rows."""

    def to_host(self, column: Any) -> np.ndarray:
        """A host numpy array of a column (no copy for host columns)."""

    def to_pandas(self, df: Any) -> Any:
        """The frame as pandas (for verification)."""


# Up to this many workers the pandas backend partitions with one masked copy per destination
# (2 workers: 10 ms for 1M rows against 21 ms for a stable argsort and two gathers, on the
# project's AMD EPYC VM); from 8 on, W passes over the chunk cost more than the sort.
MASK_WORKERS = 4


class PandasBackend:
    """pandas on the CPU."""

    name = "pandas"

    def __init__(self) -> None:
        import pandas as pd

        self._pd = pd

    def frame(self, key: np.ndarray, payload: np.ndarray) -> Any:
        return self._pd.DataFrame({"key": key, "payload": payload}, copy=False)

    def partition(self, df: Any, workers: int, pool: BufferPool,
                  name: str) -> tuple[list[np.ndarray], np.ndarray]:
        key = df["key"].to_numpy()
        payload = df["payload"].to_numpy()
        n = len(key)
        dest = destinations(key, workers, pool.get("hash", n, np.uint64))
        cols = [pool.get(f"{name}:send:{i}", n, np.int64) for i in range(2)]
        if workers > MASK_WORKERS:
            order = np.argsort(dest, kind="stable")  # a radix sort on uint8/uint16
            np.take(key, order, out=cols[0])
            np.take(payload, order, out=cols[1])
            return cols, np.bincount(dest, minlength=workers).astype(np.int64)
        counts = np.empty(workers, dtype=np.int64)
        mask = pool.get("mask", n, np.bool_)
        start = 0
        for p in range(workers):  # one pass per destination, rows kept in order
            np.equal(dest, p, out=mask)
            counts[p] = np.count_nonzero(mask)
            for src, col in zip((key, payload), cols, strict=True):
                np.compress(mask, src, out=col[start:start + counts[p]])
            start += int(counts[p])
        return cols, counts

    def merge(self, left: Any, right: Any) -> Any:
        return left.merge(right, on="key", how="inner", suffixes=("_left", "_right"))

    def num_rows(self, df: Any) -> int:
        return len(df)

    def to_host(self, column: Any) -> np.ndarray:
        return np.asarray(column)

    def to_pandas(self, df: Any) -> Any:
        return df


class CudfBackend:
    """cuDF on the GPU (columns are cupy arrays; host transports copy them to the host)."""

    name = "cudf"

    def __init__(self) -> None:
        try:
            import cudf
            import cupy
        except ImportError as exc:
            raise WorkloadError(
                f"--backend cudf needs cudf and cupy (a GPU and RAPIDS): {exc}"
            ) from exc
        self._cudf = cudf
        self._cp = cupy

    def frame(self, key: Any, payload: Any) -> Any:
        cp = self._cp
        return self._cudf.DataFrame({"key": cp.asarray(key), "payload": cp.asarray(payload)})

    def partition(self, df: Any, workers: int, pool: BufferPool,
                  name: str) -> tuple[list[Any], np.ndarray]:
        del pool, name  # device memory: cupy's own memory pool reuses it
        cp = self._cp
        key, payload = df["key"].values, df["payload"].values
        pid = partition_ids(key, workers)
        order = cp.argsort(pid, kind="stable")
        counts = cp.bincount(pid, minlength=workers)
        return [key[order], payload[order]], np.asarray(counts.get(), dtype=np.int64)

    def merge(self, left: Any, right: Any) -> Any:
        return left.merge(right, on="key", how="inner", suffixes=("_left", "_right"))

    def num_rows(self, df: Any) -> int:
        return len(df)

    def to_host(self, column: Any) -> np.ndarray:
        return column.get() if hasattr(column, "get") else np.asarray(column)

    def to_pandas(self, df: Any) -> Any:
        return df.to_pandas()


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (``pandas`` or ``cudf``), or a one-line error."""
    if name == "pandas":
        return PandasBackend()
    if name == "cudf":
        return CudfBackend()
    raise WorkloadError(f"--backend: unknown value {name!r}; choose one of pandas, cudf")
