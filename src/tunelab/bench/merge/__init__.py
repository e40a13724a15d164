"""All-to-all dataframe-merge communication benchmark (the seed's "Communications Performance
with UCX").

N workers each hold a left and a right chunk; every iteration they hash-partition both into N
bins, exchange the bins all-to-all (left, then right), concatenate what arrived and inner-merge
on ``key``; the result is verified every iteration. Transports: ``mpi`` (mpi4py over Open MPI,
PML ob1 or ucx), ``tcp`` (asyncio streams), ``ucxx`` (UCXX bindings), ``dask`` (a dask
dataframe merge on a distributed cluster). Run ``python -m tunelab.bench.merge --help``.

Modules: :mod:`.config` (options), :mod:`.data` (chunks, hash), :mod:`.backend` (pandas/cudf),
:mod:`.metrics` (pure FOM formulas), :mod:`.comm` (transport contract), :mod:`.runner` (worker
loop, verification), :mod:`.tcp`, :mod:`.mpi`, :mod:`.ucxx`, :mod:`.dask` (transports),
:mod:`.launch` (process start, failure reports), :mod:`.report` (table, JSON line).
"""

from __future__ import annotations

from tunelab.bench.merge.config import TRANSPORTS, MergeConfig
from tunelab.bench.merge.metrics import (
    IterationStats,
    Summary,
    WorkerIteration,
    data_processed_bytes,
    harmonic_mean,
    iteration_stats,
    summarize,
    throughput,
    worker_bandwidth,
)

__all__ = [
    "TRANSPORTS",
    "IterationStats",
    "MergeConfig",
    "Summary",
    "WorkerIteration",
    "data_processed_bytes",
    "harmonic_mean",
    "iteration_stats",
    "summarize",
    "throughput",
    "worker_bandwidth",
]
