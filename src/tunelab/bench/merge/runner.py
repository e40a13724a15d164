"""The worker loop shared by the mpi, tcp and ucxx transports.

Each iteration: barrier; partition the left chunk and then the right chunk into N bins each
(column buffers ordered by destination); exchange the left bins straight into pre-sized receive
columns, then the right bins; inner-merge on ``key`` the frames over those columns (the bin
kept locally is copied into place, nothing is concatenated). Both sides are partitioned before
either is exchanged, as in UCX-Py's ``cudf_merge`` benchmark the seed ran, and one message to
each peer swaps the row counts of both exchanges: the workers meet once per iteration, at the
left exchange (timed as part of it), so how much longer one worker's partitioning took is
waited for once, not at both exchanges. Then, outside the timed section, verify: the global
merged row count must equal the number of matching keys, the merged rows' checksum summed over
all workers must equal the one computed from the generated data (a changed key or payload is
caught at any size), and for small sizes every worker's rows must equal those of a
single-process pandas merge. A wrong result raises :class:`VerificationError`.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from tunelab.bench.merge import data
from tunelab.bench.merge.backend import Backend
from tunelab.bench.merge.comm import Comm, VerificationError
from tunelab.bench.merge.config import MergeConfig
from tunelab.bench.merge.metrics import WorkerIteration

__all__ = ["compare_with_reference", "flip_one_payload", "merged_checksum", "reference_merge",
           "run_worker"]

_MOD = 1 << 64


def reference_merge(cfg: MergeConfig, rank: int | None) -> Any:
    """The rows worker ``rank`` must hold: a single-process pandas merge of every chunk,
    restricted to the keys hashed to ``rank`` (all of them for None), sorted by key."""
    import pandas as pd

    lefts = [data.left_chunk(r, cfg.workers, cfg.chunk_size, cfg.seed) for r in range(cfg.workers)]
    rights = [data.right_chunk(r, cfg.workers, cfg.chunk_size, cfg.frac_match, cfg.seed)
              for r in range(cfg.workers)]
    left = pd.DataFrame({"key": np.concatenate([k for k, _ in lefts]),
                         "payload": np.concatenate([p for _, p in lefts])})
    right = pd.DataFrame({"key": np.concatenate([k for k, _ in rights]),
                          "payload": np.concatenate([p for _, p in rights])})
    merged = left.merge(right, on="key", how="inner", suffixes=("_left", "_right"))
    mine = merged
    if rank is not None:
        mine = merged[data.partition_ids(merged["key"].to_numpy(), cfg.workers) == rank]
    return mine.sort_values("key", kind="stable").reset_index(drop=True)


def compare_with_reference(got: Any, want: Any) -> str | None:
    """None when ``got`` holds exactly the reference rows, else what differs."""
    got = got.sort_values("key", kind="stable").reset_index(drop=True)
    if len(got) != len(want):
        return f"{len(got)} merged rows, the pandas reference has {len(want)}"
    for col in ("key", "payload_left", "payload_right"):
        bad = np.flatnonzero(got[col].to_numpy() != want[col].to_numpy())
        if bad.size:
            return f"column {col} differs from the pandas reference in {bad.size} rows"
    return None


def merged_checksum(merged: Any) -> int:
    """:func:`~tunelab.bench.merge.data.row_checksum` of a merged pandas frame."""
    return data.row_checksum(merged["key"].to_numpy(), merged["payload_left"].to_numpy(),
                             merged["payload_right"].to_numpy())


def flip_one_payload(merged: Any) -> Any:
    """Fault injection: a copy of ``merged`` with one bit of its first right payload flipped
    (the kind of damage a row count cannot see)."""
    merged = merged.copy()
    col = merged.columns.get_loc("payload_right")
    merged.iat[0, col] = merged.iat[0, col] ^ 1
    return merged


def _partition(comm: Comm, backend: Backend, df: Any, side: str,
               it: int) -> tuple[list[Any], Any]:
    """Partition ``df`` into one bin per worker: the host column buffers (rows grouped by
    destination) and the rows for each worker."""
    comm.enter(f"partition-{side}", it)
    cols, counts = backend.partition(df, comm.size, comm.pool, side)
    return [backend.to_host(c) for c in cols], counts


def _exchange(comm: Comm, backend: Backend, host: list[Any], counts: Any,
              recv_counts: np.ndarray, side: str) -> tuple[Any, float, int, int]:
    """Exchange one side's bins (the row counts already swapped); the frame of what this
    worker holds now, the exchange seconds, bytes sent to and received from other workers."""
    row_bytes = sum(c.dtype.itemsize for c in host)
    sent = row_bytes * int(counts.sum() - counts[comm.rank])
    got = comm.alltoallv(host, counts, recv_counts, side)
    received = row_bytes * int(got.counts.sum() - got.counts[comm.rank])
    return backend.frame(*got.columns), got.seconds, sent, received


def run_worker(comm: Comm, cfg: MergeConfig, backend: Backend) -> list[WorkerIteration]:
    """Run every iteration on this worker; return all workers' records (on every worker)."""
    rank, n = comm.rank, cfg.workers
    if comm.size != n:
        raise VerificationError(f"the transport has {comm.size} workers, --workers is {n}")
    comm.enter("generate", -1)
    left = backend.frame(*data.left_chunk(rank, n, cfg.chunk_size, cfg.seed))
    right_key, right_payload = data.right_chunk(rank, n, cfg.chunk_size, cfg.frac_match,
                                                cfg.seed)
    right = backend.frame(right_key, right_payload)
    expected = data.expected_matches(n, cfg.chunk_size, cfg.frac_match)
    my_checksum = data.expected_checksum(n, cfg.chunk_size, cfg.seed, right_key, right_payload)
    del right_key, right_payload
    reference = reference_merge(cfg, rank) if cfg.full_verify else None
    records: list[WorkerIteration] = []
    for it in range(cfg.total_iterations):
        comm.enter("barrier", it)
        comm.barrier()
        t0 = time.perf_counter()
        lbins, lcounts = _partition(comm, backend, left, "left", it)
        rbins, rcounts = _partition(comm, backend, right, "right", it)
        comm.enter("exchange-left", it)
        t_swap = time.perf_counter()
        lrecv, rrecv = comm.swap_counts([lcounts, rcounts], sum(c.itemsize for c in lbins))
        w_left = time.perf_counter() - t_swap  # until every peer arrived
        lframe, t_left, sent_left, recv_left = _exchange(comm, backend, lbins, lcounts, lrecv,
                                                         "left")
        comm.enter("exchange-right", it)
        rframe, t_right, sent_right, recv_right = _exchange(comm, backend, rbins, rcounts,
                                                            rrecv, "right")
        comm.enter("merge", it)
        merged = backend.merge(lframe, rframe)
        wall = time.perf_counter() - t0
        if comm.corrupts("merge"):  # fault injection: lose one row, verification must see it
            merged = merged.iloc[1:]
        comm.enter("verify", it)
        rows = backend.num_rows(merged)
        host = backend.to_pandas(merged)
        if comm.corrupts("merge", "flip"):  # fault injection: one payload bit flipped
            host = flip_one_payload(host)
        checksum = merged_checksum(host)
        problem = None
        if reference is not None:
            problem = compare_with_reference(host, reference)
        verdicts = comm.allgather((rows, problem, checksum, my_checksum))
        del host
        total = sum(v[0] for v in verdicts)
        bad = [(w, v[1]) for w, v in enumerate(verdicts) if v[1]]
        if bad:
            w, p = bad[0]
            raise VerificationError(f"iteration {it}: worker {w}: {p}")
        if total != expected:
            raise VerificationError(f"iteration {it}: the merge has {total} rows in all, "
                                    f"expected {expected} matching keys")
        if sum(v[2] for v in verdicts) % _MOD != sum(v[3] for v in verdicts) % _MOD:
            raise VerificationError(f"iteration {it}: the merged rows' checksum differs from "
                                    "the generated data's: a key or payload changed on the way")
        records.append(WorkerIteration(
            rank=rank, iteration=it - cfg.warmup, warmup=it < cfg.warmup, wall_s=wall,
            exchange_left_s=w_left + t_left, exchange_right_s=t_right,
            bytes_sent_left=sent_left, bytes_sent_right=sent_right,
            bytes_recv=recv_left + recv_right, merged_rows=rows, sync_left_s=w_left,
            sync_right_s=0.0))
    comm.enter("gather", cfg.total_iterations - 1)
    gathered = comm.allgather(records)
    comm.enter("done")
    return [rec for worker in gathered for rec in worker]
