"""Gradient all-reduce: measured inside DDP (a communication hook), or done by hand over
buckets laid out as DDP lays them out (emulated compute).

:class:`CommTimer` is a DDP communication hook: it all-reduces each gradient bucket exactly
as DDP's default hook does (sum, then divide by the world size) and records, per step, when
the first and the last bucket were handed to the network, when the last one came back, and
how many bytes were reduced. On CUDA the completion times are CUDA events recorded on the
stream that waits for NCCL, read after the step synchronises.

:func:`bucket_sizes` reproduces DDP's bucketing (parameters in reverse order of registration,
a first bucket capped at 1 MiB, then ``bucket_mb`` MiB), so emulated compute all-reduces the
same buffers, in the same order, as the real thing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

__all__ = ["FIRST_BUCKET_BYTES", "CommTimer", "StepComm", "bucket_sizes", "busy_time",
           "emulated_allreduce"]

FIRST_BUCKET_BYTES = 1 << 20  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES


@dataclass(frozen=True)
class StepComm:
    """One step's all-reduce, seconds on the step's clock (``perf_counter``); ``busy`` the
    time some bucket was being reduced (the union of each bucket's launch-to-done
    interval): the all-reduce's own time, without the backward pass between buckets that
    the window from the first launch to the last done spans."""

    first_launch: float
    last_launch: float
    done: float
    bytes: int
    buckets: int
    busy: float = 0.0


def busy_time(launches: Sequence[float], done: Sequence[float]) -> float:
    """The length of the union of the buckets' intervals, the i-th launch paired with the
    i-th completion in time (a process group reduces its buckets in the order they were
    launched)."""
    total, end = 0.0, -math.inf
    for a, b in zip(sorted(launches), sorted(done), strict=False):
        a = max(a, end)
        if b > a:
            total += b - a
            end = b
    return total


def bucket_sizes(numels: Sequence[int], element_size: int, bucket_mb: float) -> list[int]:
    """Elements per bucket for parameters of ``numels`` (in registration order), as DDP
    fills them: reverse order, the first bucket up to 1 MiB, the others up to ``bucket_mb``
    MiB (a bucket closes once it reaches its limit)."""
    limits = [FIRST_BUCKET_BYTES, int(bucket_mb * (1 << 20))]
    sizes: list[int] = []
    current = 0
    for n in reversed(numels):
        current += n
        limit = limits[min(len(sizes), 1)]
        if current * element_size >= limit:
            sizes.append(current)
            current = 0
    if current:
        sizes.append(current)
    return sizes


class CommTimer:
    """A DDP communication hook that all-reduces (sum / world) and times every bucket.

    Register with ``ddp.register_comm_hook(None, timer)``; call :meth:`take` after each
    step's ``backward`` (and, on CUDA, after synchronising) to get that step's
    :class:`StepComm` (None when no bucket was reduced).
    """

    def __init__(self, group: dist.ProcessGroup | None, device: torch.device) -> None:
        self._group = group
        self._cuda = device.type == "cuda"
        self._launches: list[Any] = []  # perf_counter seconds, or CUDA events
        self._bytes = 0
        self._done: list[Any] = []

    def __call__(self, state: object, bucket: dist.GradBucket) -> torch.futures.Future[Any]:
        import torch
        import torch.distributed as dist

        buf = bucket.buffer()
        world = dist.get_world_size(self._group)
        self._bytes += buf.numel() * buf.element_size()
        if self._cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            self._launches.append(start)
        else:
            self._launches.append(time.perf_counter())
        fut = dist.all_reduce(buf, group=self._group, async_op=True).get_future()

        def finish(f: torch.futures.Future[Any]) -> torch.Tensor:
            if self._cuda:
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                self._done.append(end)
            else:
                self._done.append(time.perf_counter())
            return f.value()[0].div_(world)

        return fut.then(finish)

    def take(self, step_start: float, step_start_event: Any = None) -> StepComm | None:
        """This step's record (times relative to the process clock), and reset."""
        if not self._launches:
            return None
        if self._cuda:  # events -> seconds on the perf_counter clock of the step's start
            def at(ev: Any) -> float:
                ev.synchronize()  # recorded on NCCL's side of the step: finished by now
                return step_start + float(step_start_event.elapsed_time(ev)) / 1e3

            launches = [at(e) for e in self._launches]
            done = [at(e) for e in self._done]
        else:
            launches, done = list(self._launches), list(self._done)
        rec = StepComm(first_launch=min(launches), last_launch=max(launches),
                       done=max(done) if done else max(launches), bytes=self._bytes,
                       buckets=len(launches), busy=busy_time(launches, done))
        self._launches, self._done, self._bytes = [], [], 0
        return rec


def emulated_allreduce(buckets: Sequence[torch.Tensor], world: int,
                       group: dist.ProcessGroup | None = None) -> StepComm:
    """All-reduce ``buckets`` as DDP does (every bucket launched, then all awaited; sum,
    then divide by ``world``) and time it."""
    import torch.distributed as dist

    first = time.perf_counter()
    works = []
    for b in buckets:
        works.append(dist.all_reduce(b, group=group, async_op=True))
    last = time.perf_counter()
    for w in works:
        w.wait()
    for b in buckets:
        b.div_(world)
    done = time.perf_counter()
    nbytes = sum(b.numel() * b.element_size() for b in buckets)
    return StepComm(first, last, done, nbytes, len(buckets), done - first)
