"""Reading regions of a genome for prediction: sequence codes, DNase and DNase minus the
average track, in this process or by worker processes.

pyfaidx and pyBigWig handles are not thread-safe, and one process read ~45 Mbp/s of FASTA +
bigWig on a 2-core EPYC: a GPU predicting 150 Mbp/s would wait for it. :func:`read_regions`
therefore hands regions to ``workers`` processes (``spawn``: nothing of torch or CUDA is
inherited), each with its own open files, which write into **slots** of shared memory (files
under ``/dev/shm``) that this process maps: nothing is pickled but a region and a slot
number. Regions come back in order; each :class:`Loaded` must be :meth:`~Loaded.release`-d
once its arrays have been consumed (copied to a device or predicted), which frees its slot
for a region further ahead. ``workers=0`` reads in this process, in turn with the caller.
:func:`start_reading` starts the processes at once instead of at the first region asked for:
prediction on a GPU reads its first regions while CUDA starts and its runtime is chosen.

Stored NaN/infinite values are refused per region (the same check as loading for training);
a worker's :class:`~tunelab.leopard.errors.LeopardError` reaches the caller as itself.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import multiprocessing as mp
import os
import shutil
import tempfile
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tunelab.leopard.errors import LeopardError
from tunelab.leopard.genomefiles import (
    open_bigwig,
    open_fasta,
    read_bigwig_region,
    sequence_codes,
)
from tunelab.leopard.prefetch import prefetch

__all__ = ["Loaded", "Reading", "Region", "Tracks", "read_regions", "region_reader",
           "start_reading"]

#: sequence codes, DNase, DNase minus the average (6-channel models) of one region
Arrays = tuple[np.ndarray, np.ndarray, np.ndarray | None]


@dataclass(frozen=True)
class Tracks:
    """The files a region is read from: the FASTA, the DNase bigWig and, for 6 channels, the
    average DNase bigWig — read as DNase minus the average (``difference``, what prediction
    feeds the network) or as it is (what training data holds)."""

    fasta: Path
    dnase: Path
    dnase_avg: Path | None = None
    difference: bool = True


@dataclass(frozen=True)
class Region:
    """Bases ``[start, end)`` of ``chrom``; ``tag`` travels with it (the caller's)."""

    chrom: str
    start: int
    end: int
    tag: Any = None


@dataclass
class Loaded:
    """A region's arrays; call :meth:`release` when they are no longer needed."""

    region: Region
    arrays: Arrays
    _release: Callable[[], None] | None = None

    def release(self) -> None:
        """Give the arrays' memory back for a region further ahead (idempotent)."""
        if self._release is not None:
            fn, self._release = self._release, None
            fn()


class _Files:
    """The open FASTA and bigWig handles of one process."""

    def __init__(self, tracks: Tracks) -> None:
        self.tracks = tracks
        self.fa = open_fasta(tracks.fasta)
        self.bws = [(open_bigwig(tracks.dnase, "DNase"), tracks.dnase)]
        if tracks.dnase_avg is not None:
            self.bws.append((open_bigwig(tracks.dnase_avg, "average DNase"), tracks.dnase_avg))

    def read(self, r: Region) -> Arrays:
        seq = sequence_codes(str(self.fa[r.chrom][r.start:r.end]))
        if len(seq) != r.end - r.start:
            raise LeopardError(f"{self.tracks.fasta}: chromosome {r.chrom!r} reads {len(seq)} "
                               f"bases at {r.start}-{r.end}, index says {r.end - r.start}")
        signals = [read_bigwig_region(bw, path, r.chrom, r.start, r.end)
                   for bw, path in self.bws]
        dn = signals[0]
        if len(signals) == 1:
            return seq, dn, None
        return seq, dn, dn - signals[1] if self.tracks.difference else signals[1]

    def close(self) -> None:
        for bw, _ in self.bws:
            bw.close()


def read_regions(tracks: Tracks, regions: Iterable[Region], workers: int = 0,
                 longest: int = 0) -> Generator[Loaded, None, None]:
    """The regions' arrays, in order: read here (``workers=0``), by one thread (``1``: one
    reader needs no process of its own, and starting one cost a second or more on a busy
    machine) or by ``workers`` processes into shared memory, at most ``workers + 2`` regions
    ahead of the consumer; ``longest`` is an upper bound on a region's length (it sizes the
    slots)."""
    if workers <= 1:
        here = _in_turn(tracks, regions)
        yield from here if workers <= 0 else prefetch(here, depth=2, name="leopard-reader")
        return
    reads = _ParallelReads(tracks, iter(regions), workers, longest)
    try:
        yield from reads
    finally:
        reads.close()


class Reading(Protocol):
    """Regions being read (:func:`start_reading`): iterate them in order, then close."""

    def __iter__(self) -> Iterator[Loaded]: ...

    def __next__(self) -> Loaded: ...

    def close(self) -> None: ...


def start_reading(tracks: Tracks, regions: Iterable[Region], workers: int = 0,
                  longest: int = 0) -> Reading:
    """:func:`read_regions`, started now when ``workers`` processes read: they spawn and
    read the first ``workers + 2`` regions while the caller does something else (a GPU
    starting, say). Call ``close()`` when done, iterated to the end or not."""
    if workers <= 1:
        return read_regions(tracks, regions, workers, longest)
    return _ParallelReads(tracks, iter(regions), workers, longest)


def _in_turn(tracks: Tracks, regions: Iterable[Region]) -> Iterator[Loaded]:
    files = _Files(tracks)
    try:
        for r in regions:
            yield Loaded(r, files.read(r))
    finally:
        files.close()


# ------------------------------------------------------------------------ worker processes

#: slot layout for regions up to ``cap`` bp: codes [0, cap), DNase [cap, 5 cap),
#: DNase minus average [5 cap, 9 cap) (4-byte aligned: cap is a multiple of 64)
_PER_BASE = 9
_WORKER: dict[str, Any] = {}


def _slot_path(folder: str, slot: int) -> str:
    return os.path.join(folder, f"slot{slot}")


def _init_worker(tracks: Tracks, folder: str, cap: int) -> None:
    _WORKER.update(files=_Files(tracks), folder=folder, cap=cap, maps={})


def _views(buf: Any, cap: int, n: int) -> Arrays:
    raw = np.frombuffer(buf, dtype=np.uint8)
    return (raw[:n], raw[cap:cap + 4 * n].view(np.float32),
            raw[5 * cap:5 * cap + 4 * n].view(np.float32))


def _read_into(region: Region, slot: int) -> tuple[int, bool]:
    """Worker side: read ``region`` into ``slot``; return its length and whether it has the
    third array."""
    maps, cap = _WORKER["maps"], _WORKER["cap"]
    if slot not in maps:
        with open(_slot_path(_WORKER["folder"], slot), "r+b") as fh:
            maps[slot] = mmap.mmap(fh.fileno(), cap * _PER_BASE)
    seq, dn, diff = _WORKER["files"].read(region)
    n = len(seq)
    out = _views(maps[slot], cap, n)
    out[0][:] = seq
    out[1][:] = dn
    if diff is not None:
        assert out[2] is not None
        out[2][:] = diff
    return n, diff is not None


def _slot_home(need: int) -> str | None:
    """``/dev/shm`` when it has room for ``need`` bytes with a margin (a container's may be
    64 MiB, and a full tmpfs kills the writer with SIGBUS), else the temporary folder."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and shutil.disk_usage(shm).free > 1.25 * need:
        return shm
    return None


class _ParallelReads:
    """Regions read by ``workers`` processes into shared-memory slots, handed out in order.
    Started when made: the processes are spawned and the first ``workers + 2`` regions are
    being read before the first :meth:`__next__`. :meth:`close` stops the processes and
    frees the slots (made at the end, at an error, or by the caller)."""

    def __init__(self, tracks: Tracks, regions: Iterator[Region], workers: int,
                 longest: int) -> None:
        self._regions = regions
        self._cap = cap = max(64, -(-longest // 64) * 64)
        n_slots = workers + 2
        self._folder = tempfile.mkdtemp(prefix="tunelab-leopard-",
                                        dir=_slot_home(cap * _PER_BASE * n_slots))
        self._maps: list[mmap.mmap] = []
        self._pool: ProcessPoolExecutor | None = None
        self._free = deque(range(n_slots))
        self._queued: deque[tuple[Region, int, Future[tuple[int, bool]]]] = deque()
        self._exhausted = False
        self._closed = False  # a region released after the end frees nothing
        try:
            for k in range(n_slots):
                with open(_slot_path(self._folder, k), "w+b") as fh:
                    fh.truncate(cap * _PER_BASE)
                    self._maps.append(mmap.mmap(fh.fileno(), cap * _PER_BASE))
            self._pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"),
                                             initializer=_init_worker,
                                             initargs=(tracks, self._folder, cap))
            self._refill()
        except BaseException:
            self.close()
            raise

    def _refill(self) -> None:
        while self._free and not self._exhausted and not self._closed:
            r = next(self._regions, None)
            if r is None:
                self._exhausted = True
                return
            if r.end - r.start > self._cap:
                raise LeopardError(f"region {r.chrom}:{r.start}-{r.end} is longer than the "
                                   f"{self._cap:,} bp a reader slot holds")
            assert self._pool is not None
            slot = self._free.popleft()
            self._queued.append((r, slot, self._pool.submit(_read_into, r, slot)))

    def _give_back(self, slot: int) -> None:
        self._free.append(slot)
        self._refill()

    def __iter__(self) -> Iterator[Loaded]:
        return self

    def __next__(self) -> Loaded:
        if self._closed:
            raise StopIteration
        try:
            if not self._queued and not self._exhausted:
                self._refill()
                if not self._queued and not self._exhausted:
                    raise RuntimeError("every reader slot is held: release() each Loaded "
                                       "region")
            if not self._queued:
                self.close()
                raise StopIteration
            r, slot, fut = self._queued.popleft()
            n, has_diff = fut.result()
        except StopIteration:
            raise
        except BaseException:
            self.close()
            raise
        seq, dn, diff = _views(self._maps[slot], self._cap, n)
        return Loaded(r, (seq, dn, diff if has_diff else None),
                      functools.partial(self._give_back, slot))

    def close(self) -> None:
        """Stop the worker processes and free the slots (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        for m in self._maps:
            with contextlib.suppress(BufferError):  # a view the caller still holds
                m.close()
        shutil.rmtree(self._folder, ignore_errors=True)


def region_reader(tracks: Tracks, workers: int) -> Callable[
        [list[tuple[str, int, int]]],
        Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None, Callable[[], None]]]]:
    """A :data:`tunelab.leopard.data.RegionReader` over :func:`read_regions` (``workers``
    processes), for :func:`tunelab.leopard.data.load_chromosomes`."""
    def read(spans: list[tuple[str, int, int]]) -> Iterator[
            tuple[np.ndarray, np.ndarray, np.ndarray | None, Callable[[], None]]]:
        longest = max((b - a for _, a, b in spans), default=1)
        for item in read_regions(tracks, [Region(*s) for s in spans], workers, longest):
            seq, dn, third = item.arrays
            yield seq, dn, third, item.release

    return read
