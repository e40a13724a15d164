"""Figures of merit of a DDP run, from every worker's per-step records (pure functions).

Per timed step and worker a :class:`StepRecord` holds the step's wall time and its parts:
``compute_s`` (forward and backward until the last gradient bucket was ready, or the
emulated wait), ``allreduce_s`` (first bucket handed to the network until the last one
reduced: the communication window), ``exposed_s`` (the part of the step spent waiting for
communication after compute ended; ``peer_s`` is the part of it spent waiting at the step's
meeting for workers that are behind — under ``--allreduce emulate`` the time beyond the
modelled all-reduce, most often a peer still waiting for its data) and ``other_s``
(optimizer and bookkeeping).

A step runs from one request for a batch to the next, so its parts add up to it exactly:
``data_s`` (waiting for the batch: the loader's queue, the copy to the device), ``drop_s``
(dropping the page cache at an epoch boundary, ``--cache cold``), the accelerator's compute
(``compute_s`` + ``other_s``: the emulated wait, or forward, backward and optimizer), the
all-reduce not overlapped (``exposed_s``) and the harness's own ``overhead`` (the loop, its
status file: the rest). Accelerator utilisation is MLPerf Storage's: **AU = compute / (step -
drop)**, the share of the time the accelerator computes; the all-reduce's exposed share
(``comm_frac``) is reported beside it, never inside it, and with the input-wait and overhead
shares they add up to 1. ``au`` covers the timed steps; ``au_run`` the whole run of the
worker, from its first request for data (the loader's start-up) to the loader's shutdown,
warm-up, barriers and cache drops included. A run is ``input_bound`` when some worker
waited for data more than 10 % of its timed steps.

A step ends for all workers together (the all-reduce synchronises them), so a step's time is
the slowest worker's; throughput is the samples delivered in the timed steps over the slowest
worker's elapsed time. Bandwidths follow the NCCL-tests convention: *algorithm bandwidth* =
bytes / the all-reduce's own time (``comm_busy_s``: some bucket being reduced; not the window
from the first bucket to the last, which spans the backward pass between them); *bus
bandwidth* = algorithm bandwidth x 2(N-1)/N, the bytes each worker's
link carries in a ring all-reduce, comparable with the link's rate.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["INPUT_BOUND", "RankRecord", "RunAccount", "StepRecord", "Summary", "ring_factor",
           "summarize"]

#: data wait above this share of the step makes a run ``input_bound``
INPUT_BOUND = 0.10


@dataclass(frozen=True)
class StepRecord:
    """One worker's step, seconds; ``bytes`` all-reduced in it; the batch's samples and the
    bytes read for it (counted, and the kernel's ``rchar`` and device ``read_bytes`` for the
    same reads; -1 where unknown); ``peer_s``: the part of ``exposed_s`` spent waiting for
    the other workers beyond the all-reduce's own time (0 where not known apart)."""

    step_s: float
    compute_s: float
    allreduce_s: float
    exposed_s: float
    other_s: float
    bytes: int
    data_s: float = 0.0
    drop_s: float = 0.0
    samples: int = -1
    read_bytes: int = 0
    rchar: int = 0
    device_bytes: int = 0
    corrupt: int = 0
    peer_s: float = 0.0
    comm_busy_s: float = 0.0

    @property
    def accel_s(self) -> float:
        """The accelerator's own compute (forward, backward, optimizer; or the emulated wait):
        what AU counts."""
        return self.compute_s + self.other_s

    @property
    def busy_s(self) -> float:
        """Compute and the all-reduce not overlapped: the step without input and harness."""
        return self.compute_s + self.exposed_s + self.other_s


@dataclass(frozen=True)
class RunAccount:
    """A worker's whole run: from its first request for data to its loader's shutdown."""

    run_s: float
    compute_s: float
    wait_s: float
    drop_s: float
    first_wait_s: float
    shutdown_s: float
    read_bytes: int = 0
    rchar: int = 0
    device_bytes: int = 0
    corrupt: int = 0


@dataclass(frozen=True)
class RankRecord:
    """One worker's timed section."""

    rank: int
    node: int
    elapsed_s: float
    steps: tuple[StepRecord, ...]
    run: RunAccount | None = None


@dataclass(frozen=True)
class Summary:
    """The run's figures of merit (seconds, samples/s, bytes, bytes/s)."""

    workers: int
    steps: int
    samples_per_step: int
    throughput: float
    throughput_per_worker: float
    step_s: float
    step_s_std: float
    compute_s: float
    allreduce_s: float
    exposed_s: float
    other_s: float
    grad_bytes: int
    algbw: float
    busbw: float
    data_s: float = 0.0
    drop_s: float = 0.0
    overhead_s: float = 0.0
    au: float = math.nan
    au_min: float = math.nan
    comm_frac: float = math.nan
    wait_frac: float = math.nan
    overhead_frac: float = math.nan
    input_frac: float = math.nan
    input_bound: bool = False
    au_run: float = math.nan
    au_run_min: float = math.nan
    first_wait_s: float = math.nan
    shutdown_s: float = math.nan
    samples: int = 0
    read_bytes: int = 0
    read_Bps: float = 0.0
    rchar: int = -1
    rchar_Bps: float = math.nan
    device_bytes: int = -1
    device_Bps: float = math.nan
    run_read_bytes: int = 0
    run_device_bytes: int = -1
    device_share: float = math.nan  # of the timed steps' reads
    corrupt: int = 0
    peer_s: float = 0.0
    peer_frac: float = math.nan
    allreduce_busy_s: float = 0.0


def ring_factor(workers: int) -> float:
    """Bytes a ring all-reduce moves over each worker's link per byte reduced: 2(N-1)/N."""
    return 2.0 * (workers - 1) / workers


def summarize(ranks: Sequence[RankRecord], samples_per_step: int) -> Summary:
    """The run's figures from every worker's records (all with the same number of steps)."""
    if not ranks or not ranks[0].steps:
        raise ValueError("no timed steps to summarise")
    n_steps = len(ranks[0].steps)
    if any(len(r.steps) != n_steps for r in ranks):
        raise ValueError("workers recorded different numbers of steps")
    workers = len(ranks)
    step_s = [max(r.steps[i].step_s for r in ranks) for i in range(n_steps)]

    def mean_of(attr: str) -> float:
        return statistics.fmean(getattr(s, attr) for r in ranks for s in r.steps)

    elapsed = max(r.elapsed_s for r in ranks)
    delivered = sum(s.samples if s.samples >= 0 else samples_per_step // workers
                    for r in ranks for s in r.steps)
    throughput = delivered / elapsed
    allreduce = mean_of("allreduce_s")
    busy = mean_of("comm_busy_s")
    grad_bytes = ranks[0].steps[-1].bytes
    algbw = grad_bytes / busy if busy > 0 and grad_bytes else 0.0
    shares = [_shares(r.steps) for r in ranks]
    read = sum(s.read_bytes for r in ranks for s in r.steps)
    known = all(s.rchar >= 0 for r in ranks for s in r.steps)
    rchar = sum(s.rchar for r in ranks for s in r.steps) if known else -1
    device = sum(s.device_bytes for r in ranks for s in r.steps) if known else -1
    runs = [r.run for r in ranks if r.run is not None]
    run_read = sum(a.read_bytes for a in runs)
    run_device = sum(a.device_bytes for a in runs) if known else -1
    # the timed steps only: the first ones also page in what a dropped cache took away
    # (libraries the loader processes map), which read_bytes counts too
    au_run = [a.compute_s / a.run_s for a in runs if a.run_s > 0]
    return Summary(
        workers=workers,
        steps=n_steps,
        samples_per_step=samples_per_step,
        throughput=throughput,
        throughput_per_worker=throughput / workers,
        step_s=statistics.fmean(step_s),
        step_s_std=statistics.stdev(step_s) if n_steps > 1 else 0.0,
        compute_s=mean_of("compute_s"),
        allreduce_s=allreduce,
        exposed_s=mean_of("exposed_s"),
        other_s=mean_of("other_s"),
        grad_bytes=grad_bytes,
        algbw=algbw,
        busbw=algbw * ring_factor(workers),
        data_s=mean_of("data_s"),
        drop_s=mean_of("drop_s"),
        overhead_s=statistics.fmean(s.step_s - s.data_s - s.drop_s - s.busy_s
                                    for r in ranks for s in r.steps),
        au=statistics.fmean(sh.au for sh in shares),
        au_min=min(sh.au for sh in shares),
        comm_frac=statistics.fmean(sh.comm for sh in shares),
        wait_frac=statistics.fmean(sh.wait for sh in shares),
        overhead_frac=statistics.fmean(sh.overhead for sh in shares),
        input_frac=max(sh.input for sh in shares),
        input_bound=max(sh.input for sh in shares) > INPUT_BOUND,
        au_run=statistics.fmean(au_run) if au_run else math.nan,
        au_run_min=min(au_run) if au_run else math.nan,
        first_wait_s=max((a.first_wait_s for a in runs), default=math.nan),
        shutdown_s=max((a.shutdown_s for a in runs), default=math.nan),
        samples=delivered,
        read_bytes=read,
        read_Bps=read / elapsed,
        rchar=rchar,
        rchar_Bps=rchar / elapsed if known else math.nan,
        device_bytes=device,
        device_Bps=device / elapsed if known else math.nan,
        run_read_bytes=run_read,
        run_device_bytes=run_device,
        device_share=device / read if known and read else math.nan,
        corrupt=sum(a.corrupt for a in runs),
        peer_s=mean_of("peer_s"),
        peer_frac=statistics.fmean(sh.peer for sh in shares),
        allreduce_busy_s=busy,
    )


class _Shares(NamedTuple):
    au: float
    comm: float
    wait: float
    overhead: float
    input: float
    peer: float


def _shares(steps: Sequence[StepRecord]) -> _Shares:
    """AU (compute), the exposed all-reduce's, the input wait's and the overhead's shares of
    the time not spent dropping the cache (they add up to 1), the input wait's share of the
    whole step time, and the part of the exposed all-reduce's share spent waiting for peers."""
    total = sum(s.step_s for s in steps)
    span = total - sum(s.drop_s for s in steps)
    if span <= 0:
        return _Shares(math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
    au = sum(s.accel_s for s in steps) / span
    comm = sum(s.exposed_s for s in steps) / span
    wait = sum(s.data_s for s in steps) / span
    return _Shares(au, comm, wait, 1.0 - au - comm - wait, sum(s.data_s for s in steps) / total,
                   sum(s.peer_s for s in steps) / span)
