"""Figures of merit of a DDP run, from every worker's per-step records (pure functions).

Per timed step and worker a :class:`StepRecord` holds the step's wall time and its parts:
``compute_s`` (forward and backward until the last gradient bucket was ready, or the
emulated wait), ``allreduce_s`` (first bucket handed to the network until the last one
reduced: the communication window), ``exposed_s`` (the part of the step spent waiting for
communication after compute ended) and ``other_s`` (optimizer and bookkeeping).

A step ends for all workers together (the all-reduce synchronises them), so a step's time is
the slowest worker's; throughput is samples of the timed steps over the slowest worker's
elapsed time. Bandwidths follow the NCCL-tests convention: *algorithm bandwidth* =
bytes / time; *bus bandwidth* = algorithm bandwidth x 2(N-1)/N, the bytes each worker's
link carries in a ring all-reduce, comparable with the link's rate.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["RankRecord", "StepRecord", "Summary", "ring_factor", "summarize"]


@dataclass(frozen=True)
class StepRecord:
    """One worker's timed step, seconds; ``bytes`` all-reduced in it."""

    step_s: float
    compute_s: float
    allreduce_s: float
    exposed_s: float
    other_s: float
    bytes: int


@dataclass(frozen=True)
class RankRecord:
    """One worker's timed section."""

    rank: int
    node: int
    elapsed_s: float
    steps: tuple[StepRecord, ...]


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
    throughput = samples_per_step * n_steps / elapsed
    allreduce = mean_of("allreduce_s")
    grad_bytes = ranks[0].steps[-1].bytes
    algbw = grad_bytes / allreduce if allreduce > 0 and grad_bytes else 0.0
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
    )
