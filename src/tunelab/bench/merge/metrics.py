"""Figures of merit of the merge benchmark — pure functions, exactly the seed's definitions.

Per worker ``w`` and iteration:

* ``bandwidth_w = bytes_sent_to_other_workers_w / exchange_time_w`` where the exchange time is
  the time spent in the two exchange phases (left, then right) and bytes are the payload of
  the sent partitions (16 bytes per row: an int64 key and an int64 payload);
* the reported bandwidth is the **harmonic mean** over workers (min, median, max too);
* ``bandwidth_transfer`` (not the seed's): the same bytes over the exchange time less its
  count swap, which ends when every peer has arrived: the transfer itself, without the wait
  for a slower peer (NaN for a transport that does not time the swap, Dask);
* ``throughput = n_chunks × data_processed / wall_clock`` with ``n_chunks = workers``,
  ``data_processed = 2 tables × 2 int64 columns × chunk_size rows = 32 · chunk_size`` bytes,
  and ``wall_clock`` the iteration's time from the common start to the last worker's end
  (the maximum over workers).

Warm-up iterations are excluded; the summary is mean ± sample std over timed iterations.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "IterationStats",
    "Summary",
    "WorkerIteration",
    "data_processed_bytes",
    "harmonic_mean",
    "iteration_stats",
    "per_iteration",
    "summarize",
    "throughput",
    "worker_bandwidth",
]

TABLES = 2
COLUMNS = 2
ITEMSIZE = 8


@dataclass(frozen=True)
class WorkerIteration:
    """What one worker measured in one iteration."""

    rank: int
    iteration: int
    warmup: bool
    wall_s: float
    exchange_left_s: float
    exchange_right_s: float
    bytes_sent_left: int
    bytes_sent_right: int
    bytes_recv: int
    merged_rows: int
    sync_left_s: float = math.nan
    sync_right_s: float = math.nan

    @property
    def exchange_s(self) -> float:
        """Time in both exchange phases."""
        return self.exchange_left_s + self.exchange_right_s

    @property
    def transfer_s(self) -> float:
        """Time in both exchange phases after every peer arrived (NaN when not timed)."""
        return self.exchange_s - self.sync_left_s - self.sync_right_s

    @property
    def bytes_sent(self) -> int:
        """Bytes sent to other workers in both phases."""
        return self.bytes_sent_left + self.bytes_sent_right

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return asdict(self)


@dataclass(frozen=True)
class IterationStats:
    """One iteration over all workers."""

    iteration: int
    wall_s: float
    throughput: float
    bandwidth: float
    bandwidth_min: float
    bandwidth_median: float
    bandwidth_max: float
    bandwidth_lr: float
    exchange_s: float
    bytes_sent: int
    merged_rows: int
    bandwidth_transfer: float = math.nan
    sync_s: float = math.nan


@dataclass(frozen=True)
class Summary:
    """Mean and sample standard deviation over the timed iterations."""

    iterations: int
    workers: int
    chunk_size: int
    data_processed: int
    throughput: float
    throughput_std: float
    bandwidth: float
    bandwidth_std: float
    bandwidth_min: float
    bandwidth_median: float
    bandwidth_max: float
    bandwidth_lr: float
    wall_s: float
    wall_s_std: float
    exchange_s: float
    bytes_sent: float
    merged_rows: int
    bandwidth_transfer: float = math.nan
    sync_s: float = math.nan


def data_processed_bytes(chunk_size: int) -> int:
    """Data processed per worker and iteration: 2 tables × 2 int64 columns × chunk rows."""
    return TABLES * COLUMNS * ITEMSIZE * chunk_size


def worker_bandwidth(bytes_sent: float, exchange_s: float) -> float:
    """Bytes sent to other workers ÷ time in the exchange phases (``inf`` for zero time)."""
    if exchange_s <= 0:
        return math.inf if bytes_sent > 0 else 0.0
    return bytes_sent / exchange_s


def harmonic_mean(values: Iterable[float]) -> float:
    """Harmonic mean; 0 when any value is 0, infinite values contribute nothing."""
    vals = list(values)
    if not vals:
        raise ValueError("harmonic mean of no values")
    if any(v <= 0 for v in vals):
        return 0.0
    return len(vals) / sum(1.0 / v for v in vals)


def throughput(workers: int, chunk_size: int, wall_s: float) -> float:
    """``n_chunks × data processed ÷ wall-clock`` in bytes per second."""
    return workers * data_processed_bytes(chunk_size) / wall_s


def iteration_stats(records: Sequence[WorkerIteration], chunk_size: int) -> IterationStats:
    """Combine all workers' records of one iteration."""
    if not records:
        raise ValueError("no worker records")
    iters = {r.iteration for r in records}
    if len(iters) != 1:
        raise ValueError(f"records of several iterations: {sorted(iters)}")
    bws = [worker_bandwidth(r.bytes_sent, r.exchange_s) for r in records]
    bws_lr = [_seed_slide_bandwidth(r) for r in records]
    transfer = [r.transfer_s for r in records]
    timed = all(math.isfinite(t) and t > 0 for t in transfer)
    wall = max(r.wall_s for r in records)
    return IterationStats(
        iteration=records[0].iteration,
        wall_s=wall,
        throughput=throughput(len(records), chunk_size, wall),
        bandwidth=harmonic_mean(bws),
        bandwidth_min=min(bws),
        bandwidth_median=statistics.median(bws),
        bandwidth_max=max(bws),
        bandwidth_lr=harmonic_mean(bws_lr),
        exchange_s=max(r.exchange_s for r in records),
        bytes_sent=sum(r.bytes_sent for r in records),
        merged_rows=sum(r.merged_rows for r in records),
        bandwidth_transfer=(harmonic_mean(worker_bandwidth(r.bytes_sent, r.transfer_s)
                                          for r in records) if timed else math.nan),
        sync_s=(max(r.sync_left_s + r.sync_right_s for r in records) if timed else math.nan),
    )


def _seed_slide_bandwidth(r: WorkerIteration) -> float:
    """The slides' variant: the mean of the left-phase and right-phase bandwidths (a transport
    that cannot tell the phases apart, Dask, reports the combined bandwidth)."""
    if r.exchange_right_s == 0 and r.bytes_sent_right == 0:
        return worker_bandwidth(r.bytes_sent_left, r.exchange_left_s)
    return (worker_bandwidth(r.bytes_sent_left, r.exchange_left_s)
            + worker_bandwidth(r.bytes_sent_right, r.exchange_right_s)) / 2


def per_iteration(records: Sequence[WorkerIteration], chunk_size: int) -> list[IterationStats]:
    """Statistics of every timed iteration (warm-up records are dropped), in order."""
    by_iter: dict[int, list[WorkerIteration]] = {}
    for r in records:
        if not r.warmup:
            by_iter.setdefault(r.iteration, []).append(r)
    return [iteration_stats(by_iter[i], chunk_size) for i in sorted(by_iter)]


def summarize(stats: Sequence[IterationStats], workers: int, chunk_size: int) -> Summary:
    """Mean ± sample std over the timed iterations."""
    if not stats:
        raise ValueError("no timed iterations")

    def mean(name: str) -> float:
        return statistics.fmean(getattr(s, name) for s in stats)

    def std(name: str) -> float:
        return statistics.stdev(getattr(s, name) for s in stats) if len(stats) > 1 else 0.0

    return Summary(
        iterations=len(stats),
        workers=workers,
        chunk_size=chunk_size,
        data_processed=data_processed_bytes(chunk_size),
        throughput=mean("throughput"),
        throughput_std=std("throughput"),
        bandwidth=mean("bandwidth"),
        bandwidth_std=std("bandwidth"),
        bandwidth_min=mean("bandwidth_min"),
        bandwidth_median=mean("bandwidth_median"),
        bandwidth_max=mean("bandwidth_max"),
        bandwidth_lr=mean("bandwidth_lr"),
        wall_s=mean("wall_s"),
        wall_s_std=std("wall_s"),
        exchange_s=mean("exchange_s"),
        bytes_sent=mean("bytes_sent"),
        merged_rows=stats[0].merged_rows,
        bandwidth_transfer=mean("bandwidth_transfer"),
        sync_s=mean("sync_s"),
    )
