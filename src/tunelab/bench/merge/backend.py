"""The few dataframe operations the benchmark needs, behind one small interface.

``pandas`` (CPU, numpy buffers) is always available; ``cudf`` (GPU, cupy buffers) is used
when it imports. A partition is sent as one C-contiguous ``(rows, 2)`` int64 block —
column 0 the key, column 1 the payload — so its bytes are ``16 × rows``.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from tunelab.bench.merge.data import partition_ids
from tunelab.errors import WorkloadError

__all__ = ["Backend", "CudfBackend", "PandasBackend", "get_backend"]


class Backend(Protocol):
    """Dataframe operations of one library. Frames have columns ``key`` and ``payload``."""

    name: str

    def frame(self, key: np.ndarray, payload: np.ndarray) -> Any:
        """A frame on this backend's device from host arrays."""

    def partition(self, df: Any, workers: int) -> tuple[Any, np.ndarray]:
        """``(block, counts)``: rows ordered by destination worker as a ``(rows, 2)`` block,
        and the number of rows per destination (host ``int64`` array)."""

    def from_blocks(self, blocks: list[Any]) -> Any:
        """One frame from received ``(rows, 2)`` blocks."""

    def merge(self, left: Any, right: Any) -> Any:
        """Inner merge on ``key``; columns ``key, payload_left, payload_right``."""

    def num_rows(self, df: Any) -> int:
        """Number of rows."""

    def to_host(self, block: Any) -> np.ndarray:
        """A host numpy array of a block (no copy for host blocks)."""

    def empty_block(self, rows: int) -> Any:
        """An uninitialised ``(rows, 2)`` int64 block to receive into."""

    def to_pandas(self, df: Any) -> Any:
        """The frame as pandas (for verification)."""


def _order_by_destination(xp: Any, key: Any, payload: Any, workers: int) -> tuple[Any, np.ndarray]:
    pid = partition_ids(key, workers)
    order = xp.argsort(pid, kind="stable")
    block = xp.empty((len(key), 2), dtype=xp.int64)
    block[:, 0] = key[order]
    block[:, 1] = payload[order]
    counts = xp.bincount(pid, minlength=workers)
    return block, np.asarray(counts.get() if hasattr(counts, "get") else counts, dtype=np.int64)


class PandasBackend:
    """pandas on the CPU."""

    name = "pandas"

    def __init__(self) -> None:
        import pandas as pd

        self._pd = pd

    def frame(self, key: np.ndarray, payload: np.ndarray) -> Any:
        return self._pd.DataFrame({"key": key, "payload": payload}, copy=False)

    def partition(self, df: Any, workers: int) -> tuple[np.ndarray, np.ndarray]:
        return _order_by_destination(
            np, df["key"].to_numpy(), df["payload"].to_numpy(), workers
        )

    def from_blocks(self, blocks: list[np.ndarray]) -> Any:
        block = np.concatenate(blocks) if blocks else np.empty((0, 2), dtype=np.int64)
        return self.frame(block[:, 0], block[:, 1])

    def merge(self, left: Any, right: Any) -> Any:
        return left.merge(right, on="key", how="inner", suffixes=("_left", "_right"))

    def num_rows(self, df: Any) -> int:
        return len(df)

    def to_host(self, block: Any) -> np.ndarray:
        return np.asarray(block)

    def empty_block(self, rows: int) -> np.ndarray:
        return np.empty((rows, 2), dtype=np.int64)

    def to_pandas(self, df: Any) -> Any:
        return df


class CudfBackend:
    """cuDF on the GPU (buffers are cupy arrays; host transports copy them to the host)."""

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

    def partition(self, df: Any, workers: int) -> tuple[Any, np.ndarray]:
        return _order_by_destination(
            self._cp, df["key"].values, df["payload"].values, workers
        )

    def from_blocks(self, blocks: list[Any]) -> Any:
        cp = self._cp
        block = cp.concatenate([cp.asarray(b) for b in blocks]) if blocks else self.empty_block(0)
        return self.frame(block[:, 0], block[:, 1])

    def merge(self, left: Any, right: Any) -> Any:
        return left.merge(right, on="key", how="inner", suffixes=("_left", "_right"))

    def num_rows(self, df: Any) -> int:
        return len(df)

    def to_host(self, block: Any) -> np.ndarray:
        return block.get() if hasattr(block, "get") else np.asarray(block)

    def empty_block(self, rows: int) -> Any:
        return self._cp.empty((rows, 2), dtype=self._cp.int64)

    def to_pandas(self, df: Any) -> Any:
        return df.to_pandas()


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (``pandas`` or ``cudf``), or a one-line error."""
    if name == "pandas":
        return PandasBackend()
    if name == "cudf":
        return CudfBackend()
    raise WorkloadError(f"--backend: unknown value {name!r}; choose one of pandas, cudf")
