"""The column-buffer exchange (``Comm.swap_counts`` then ``Comm.alltoallv``) over real TCP
sockets between threads: uneven and empty partitions, one count swap for two exchanges, reused
receive buffers, refused impossible row counts."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tunelab.bench.merge import data
from tunelab.bench.merge.backend import MASK_WORKERS, PandasBackend
from tunelab.bench.merge.buffers import BufferPool
from tunelab.bench.merge.comm import WorkerFailure
from tunelab.bench.merge.runner import flip_one_payload, merged_checksum
from tunelab.bench.merge.tcp import TcpComm


def _group(n: int, tmp_path: Path, work: Callable[[TcpComm], Any],
           timeout: float = 20.0) -> list[Any]:
    """Run ``work`` on ``n`` real TCP workers (one thread each); results or exceptions."""
    out: list[Any] = [None] * n

    def run(rank: int) -> None:
        comm = None
        try:
            comm = TcpComm(rank, n, timeout, str(tmp_path))
            out[rank] = work(comm)
        except Exception as exc:  # the test inspects it
            out[rank] = exc
        finally:
            if comm is not None:
                comm.close()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return out


def _rows_for(rank: int, n: int, counts: list[int]) -> tuple[list[np.ndarray], np.ndarray]:
    """Columns whose row ``i`` for destination ``p`` encodes (source, destination, i)."""
    key = np.concatenate([rank * 1_000_000 + p * 10_000 + np.arange(c, dtype=np.int64)
                          for p, c in enumerate(counts)])
    return [key, -key], np.asarray(counts, dtype=np.int64)


@pytest.mark.parametrize("plan", [
    [[3, 5, 0], [0, 0, 7], [2, 1, 4]],   # a worker sending nothing to some peers
    [[0, 0, 0], [1, 0, 0], [0, 0, 0]],   # almost empty
])
def test_alltoallv_delivers_every_row_in_rank_order(tmp_path: Path,
                                                    plan: list[list[int]]) -> None:
    n = len(plan)

    def work(comm: TcpComm) -> list[np.ndarray]:
        got = None
        for _ in range(2):  # the second exchange reuses the receive buffers
            cols, counts = _rows_for(comm.rank, n, plan[comm.rank])
            [recv] = comm.swap_counts([counts], 16)
            got = comm.alltoallv(cols, counts, recv, "left")
            assert got.counts.tolist() == [plan[src][comm.rank] for src in range(n)]
            assert got.seconds > 0
        assert got is not None
        return [c.copy() for c in got.columns]

    for rank, res in enumerate(_group(n, tmp_path, work)):
        assert not isinstance(res, Exception), res
        want = np.concatenate([src * 1_000_000 + rank * 10_000 + np.arange(plan[src][rank])
                               for src in range(n)]).astype(np.int64)
        assert res[0].tolist() == want.tolist()
        assert res[1].tolist() == (-want).tolist()


def test_counts_swapped_once_serve_both_exchanges(tmp_path: Path) -> None:
    plan = [[[3, 5, 0], [0, 0, 7], [2, 1, 4]], [[1, 0, 2], [6, 0, 0], [0, 3, 3]]]  # left, right
    n = 3

    def work(comm: TcpComm) -> list[list[int]]:
        sides = [_rows_for(comm.rank, n, plan[k][comm.rank]) for k in range(2)]
        recv = comm.swap_counts([counts for _, counts in sides], 16)
        assert [r.tolist() for r in recv] == [[plan[k][src][comm.rank] for src in range(n)]
                                              for k in range(2)]
        keys = []
        for (cols, counts), name, want in zip(sides, ("left", "right"), recv, strict=True):
            got = comm.alltoallv(cols, counts, want, name)
            assert got.counts.tolist() == want.tolist()
            keys.append(got.columns[0].tolist())
        return keys

    for rank, res in enumerate(_group(n, tmp_path, work)):
        assert not isinstance(res, Exception), res
        for k in range(2):
            want = [src * 1_000_000 + rank * 10_000 + i
                    for src in range(n) for i in range(plan[k][src][rank])]
            assert res[k] == want


def test_receive_columns_are_reused_between_iterations(tmp_path: Path) -> None:
    def work(comm: TcpComm) -> bool:
        cols, counts = _rows_for(comm.rank, 2, [4, 4])
        recv = np.array([4, 4], dtype=np.int64)  # every worker sends 4 rows to each
        first = comm.alltoallv(cols, counts, recv, "left").columns[0]
        second = comm.alltoallv(cols, counts, recv, "left").columns[0]
        other = comm.alltoallv(cols, counts, recv, "right").columns[0]
        return np.shares_memory(first, second) and not np.shares_memory(first, other)

    assert _group(2, tmp_path, work) == [True, True]


def test_an_impossible_row_count_is_refused_before_allocating(tmp_path: Path) -> None:
    def work(comm: TcpComm) -> Any:
        if comm.rank == 1:  # a broken peer announces a negative count
            comm.swap_counts([np.array([-5, 2], dtype=np.int64)], 16)
            return None
        return comm.swap_counts([np.array([2, 2], dtype=np.int64)], 16)

    res = _group(2, tmp_path, work, timeout=5.0)
    assert isinstance(res[0], WorkerFailure)
    assert "worker 1 announced an impossible row count (-5)" in str(res[0])


@pytest.mark.parametrize("workers", [2, 3, MASK_WORKERS + 1, 9])  # masked copies, then a sort
def test_pandas_partition_orders_rows_by_destination(workers: int) -> None:
    key, payload = data.right_chunk(1, workers, 5_000, 0.3, seed=4)
    backend = PandasBackend()
    pool = BufferPool()
    (k, p), counts = backend.partition(backend.frame(key, payload), workers, pool, "right")
    assert counts.dtype == np.int64 and counts.sum() == len(key)
    dest = data.partition_ids(k, workers)
    assert np.all(np.diff(dest) >= 0)  # grouped by destination, in rank order
    assert np.bincount(dest, minlength=workers).tolist() == counts.tolist()
    # rows keep their payload and, within a destination, their original order
    order = np.argsort(data.partition_ids(key, workers), kind="stable")
    assert k.tolist() == key[order].tolist() and p.tolist() == payload[order].tolist()
    # the next partition of the same side writes into the same buffers
    (k2, _), _ = backend.partition(backend.frame(key, payload), workers, pool, "right")
    assert np.shares_memory(k, k2)


def test_destinations_equal_partition_ids() -> None:
    keys = np.random.default_rng(0).integers(-2**62, 2**62, 10_000, dtype=np.int64)
    scratch = np.empty(len(keys), dtype=np.uint64)
    for workers in (2, 3, 300):
        d = data.destinations(keys, workers, scratch)
        assert d.dtype == (np.uint8 if workers <= 256 else np.uint16)
        assert d.astype(np.int64).tolist() == data.partition_ids(keys, workers).tolist()


def test_buffer_pool_grows_and_keeps_names_apart() -> None:
    pool = BufferPool()
    a = pool.get("x", 10, np.int64)
    b = pool.get("x", 8, np.int64)
    assert np.shares_memory(a, b) and len(b) == 8
    c = pool.get("x", 1_000, np.int64)
    assert len(c) == 1_000 and not np.shares_memory(a, c)
    assert not np.shares_memory(c, pool.get("y", 10, np.int64))
    assert pool.nbytes() >= 1_000 * 8


def test_row_checksum_sees_any_single_change_and_ignores_order() -> None:
    rng = np.random.default_rng(0)
    key, pl, pr = (rng.integers(0, 2**62, 500, dtype=np.int64) for _ in range(3))
    base = data.row_checksum(key, pl, pr)
    order = rng.permutation(500)
    assert data.row_checksum(key[order], pl[order], pr[order]) == base
    for col in (key, pl, pr):
        for bit in (0, 31, 62):
            col[7] ^= 1 << bit
            assert data.row_checksum(key, pl, pr) != base
            col[7] ^= 1 << bit


def test_expected_checksums_sum_to_the_merged_rows_checksum() -> None:
    workers, n, frac, seed = 3, 1000, 0.3, 7
    import pandas as pd

    lefts = [data.left_chunk(r, workers, n, seed) for r in range(workers)]
    rights = [data.right_chunk(r, workers, n, frac, seed) for r in range(workers)]
    left = pd.DataFrame({"key": np.concatenate([k for k, _ in lefts]),
                         "payload": np.concatenate([p for _, p in lefts])})
    right = pd.DataFrame({"key": np.concatenate([k for k, _ in rights]),
                          "payload": np.concatenate([p for _, p in rights])})
    merged = PandasBackend().merge(left, right)
    want = sum(data.expected_checksum(workers, n, seed, k, p) for k, p in rights) % 2**64
    assert merged_checksum(merged) == want
    assert merged_checksum(flip_one_payload(merged)) != want
