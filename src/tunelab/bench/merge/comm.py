"""What a transport provides to the worker loop: all-to-all exchanges with timeouts.

A :class:`Comm` is one worker's view of the group. A transport implements two primitives:

* :meth:`Comm.exchange` sends one contiguous array to every other worker and returns the raw
  bytes received from each (messages of any size: ``allgather``, ``barrier``);
* :meth:`Comm._transfer` moves column buffers: it sends given contiguous arrays to every peer
  and receives *into* given pre-sized arrays (no allocation, no copy on the way in).

:meth:`Comm.swap_counts` swaps the row counts of one or more exchanges in one message per
peer (the workers meet there); :meth:`Comm.alltoallv` builds each data exchange on the
second primitive: it takes
receive columns of exactly the right size from a :class:`~.buffers.BufferPool` (reused every
iteration, so no page is faulted in while the clock runs), lets the transport move every
peer's slice straight into place, and copies the worker's own slice locally after the timed
part. Every receive has a deadline (``timeout`` seconds), and a peer that does not answer or
whose connection breaks raises :class:`WorkerFailure` naming the peer, the phase and the
iteration. ``allgather`` and ``barrier`` are built on ``exchange``, so they have the same
guarantee.
"""

from __future__ import annotations

import os
import pickle
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tunelab.bench.merge.buffers import BufferPool
from tunelab.bench.merge.config import Fault
from tunelab.errors import TunelabError

__all__ = ["MAX_MESSAGE_BYTES", "Comm", "Received", "StatusBoard", "VerificationError",
           "WorkerFailure", "read_status"]

#: Largest message a peer may announce (a bound checked before allocating the receive buffer).
MAX_MESSAGE_BYTES = 1 << 36


class WorkerFailure(TunelabError):
    """A worker could not complete a phase: a peer died, hung or broke the connection."""

    def __init__(self, message: str, *, rank: int | None = None, peer: int | None = None,
                 phase: str | None = None, iteration: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.peer = peer
        self.phase = phase
        self.iteration = iteration


class VerificationError(TunelabError):
    """The merged result is wrong: the run reports no numbers."""


_STATUS_WIDTH = 96


class StatusBoard:
    """A tiny per-worker file holding ``pid phase iteration``, rewritten at every phase change.

    The launcher reads it when a worker dies, to say in which phase it was. Writing is one
    ``pwrite`` of a fixed-width record (a few microseconds), outside the timed sections.
    """

    def __init__(self, directory: str | None, rank: int) -> None:
        self._fd: int | None = None
        if directory:
            path = Path(directory) / f"rank-{rank}.status"
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def write(self, phase: str, iteration: int) -> None:
        """Record the phase the worker enters."""
        if self._fd is None:
            return
        text = f"{os.getpid()} {phase} {iteration}".ljust(_STATUS_WIDTH)[:_STATUS_WIDTH]
        os.pwrite(self._fd, text.encode() + b"\n", 0)

    def close(self) -> None:
        """Close the file (it stays on disk)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_status(directory: str | Path, rank: int) -> tuple[int, str, int] | None:
    """``(pid, phase, iteration)`` last written by worker ``rank``, or None."""
    try:
        text = (Path(directory) / f"rank-{rank}.status").read_text().split()
        return int(text[0]), text[1], int(text[2])
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class Received:
    """What :meth:`Comm.alltoallv` delivers: one array per column holding the rows from
    worker 0, 1, … in rank order (this worker's own rows included), the rows from each
    worker, and the seconds spent moving the data (not the local copy)."""

    columns: list[np.ndarray]
    counts: np.ndarray
    seconds: float


class Comm(ABC):
    """One worker's endpoint of an all-to-all group (see the module docstring)."""

    rank: int
    size: int

    def __init__(self, rank: int, size: int, timeout: float,
                 status_dir: str | None = None, fault: Fault | None = None) -> None:
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self.phase = "start"
        self.iteration = -1
        self._status: StatusBoard | None = StatusBoard(status_dir, rank) if status_dir else None
        self._fault = fault
        self.pool = BufferPool()

    # -- phases -------------------------------------------------------------------------
    def enter(self, phase: str, iteration: int | None = None) -> None:
        """Mark the start of ``phase`` (for failure reports and fault injection)."""
        self.phase = phase
        if iteration is not None:
            self.iteration = iteration
        if self._status is not None:
            self._status.write(phase, self.iteration)
        f = self._fault
        if f is not None and f.action in ("kill", "hang", "raise") and f.rank == self.rank \
                and f.phase == phase \
                and (f.iteration == self.iteration or phase in ("start", "connect", "generate")):
            if f.action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if f.action == "raise":
                raise RuntimeError("injected fault")
            while True:  # "hang": stop answering until killed
                time.sleep(3600)

    def corrupts(self, phase: str, action: str = "corrupt") -> bool:
        """Whether an injected ``corrupt`` (or ``flip``) fault applies to this worker, phase
        and iteration."""
        f = self._fault
        return (f is not None and f.action == action and f.rank == self.rank
                and f.phase == phase and f.iteration == self.iteration)

    def failure(self, peer: int | None, what: str) -> WorkerFailure:
        """A :class:`WorkerFailure` naming this worker, ``peer``, the phase and iteration."""
        where = f"in phase {self.phase}"
        if self.iteration >= 0:
            where += f" of iteration {self.iteration}"
        who = f"worker {peer}" if peer is not None else "the other workers"
        msg = f"worker {self.rank}: {what.format(peer=who)} {where}"
        return WorkerFailure(msg, rank=self.rank, peer=peer, phase=self.phase,
                             iteration=self.iteration)

    async def peer_address(self, address_dir: Any, peer: int,
                           deadline: float) -> dict[str, Any]:
        """The address ``peer`` published in the rendezvous directory, waiting until
        ``deadline`` (monotonic seconds); a failure naming the peer if it never appears."""
        import asyncio

        from tunelab.bench.merge import rendezvous

        info = await asyncio.to_thread(rendezvous.wait_for, address_dir, peer, deadline)
        if info is None:
            raise self.failure(peer, f"found no address of {{peer}} in {address_dir} "
                                     f"after {self.timeout:g} s")
        return dict(info)

    def raise_first_failure(self, tasks: Mapping[Any, int], done: set[Any],
                            pending: set[Any]) -> None:
        """After ``asyncio.wait`` on per-peer tasks: raise the first worker failure, or a
        timeout naming the lowest peer still pending (cancelling what is left)."""
        failure: WorkerFailure | None = None
        for task in done:
            exc = task.exception()  # retrieve every one, so asyncio logs none
            if exc is None or failure is not None:
                continue
            if isinstance(exc, WorkerFailure):
                failure = exc
            else:
                failure = self.failure(tasks[task], f"lost the connection to {{peer}} "
                                                    f"({type(exc).__name__}: {exc})")
        if failure is None and pending:
            peer = min(tasks[t] for t in pending)
            failure = self.failure(peer, f"timed out after {self.timeout:g} s waiting for {{peer}}")
        if failure is not None:
            for task in pending:
                task.cancel()
            raise failure

    @property
    def peers(self) -> list[int]:
        """Every other rank, in rank order."""
        return [p for p in range(self.size) if p != self.rank]

    # -- primitives ---------------------------------------------------------------------
    @abstractmethod
    def exchange(self, send: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        """Send ``send[p]`` (C-contiguous) to every peer ``p``; return the bytes (``uint8``)
        received from each peer. Raises :class:`WorkerFailure` on timeout or broken link."""

    @abstractmethod
    def _transfer(self, sends: Mapping[int, Sequence[np.ndarray]],
                  recvs: Mapping[int, Sequence[np.ndarray]]) -> None:
        """Send each array of ``sends[p]`` to peer ``p`` and receive, in the same order, into
        each array of ``recvs[p]`` (contiguous, exactly the size the peer sends; empty arrays
        are skipped by both sides). Raises :class:`WorkerFailure` on timeout or broken link."""

    def alltoallv(self, columns: Sequence[np.ndarray], counts: np.ndarray,
                  recv_counts: np.ndarray, name: str) -> Received:
        """All-to-all of rows held as ``columns`` (equal length, rows grouped by destination:
        ``counts[p]`` rows for worker ``p`` in rank order; ``recv_counts[p]`` rows arrive from
        worker ``p``, as :meth:`swap_counts` returned them). ``name`` keys the receive
        buffers, which stay valid until the next call with the same name."""
        t = time.perf_counter()
        counts = np.asarray(counts, dtype=np.int64)
        send_off = np.concatenate([[0], np.cumsum(counts)])
        recv_off = np.concatenate([[0], np.cumsum(recv_counts)])
        total = int(recv_off[-1])
        out = [self.pool.get(f"{name}:recv:{i}", total, c.dtype) for i, c in enumerate(columns)]
        sends = {p: [c[send_off[p]:send_off[p + 1]] for c in columns] for p in self.peers}
        recvs = {p: [o[recv_off[p]:recv_off[p + 1]] for o in out] for p in self.peers}
        self._transfer(sends, recvs)
        seconds = time.perf_counter() - t
        r = self.rank
        for c, o in zip(columns, out, strict=True):
            o[recv_off[r]:recv_off[r + 1]] = c[send_off[r]:send_off[r + 1]]
        return Received(out, recv_counts, seconds)

    def swap_counts(self, counts: Sequence[np.ndarray], row_bytes: int) -> list[np.ndarray]:
        """For each exchange to come (``counts[k][p]``: rows this worker sends worker ``p``),
        the rows every worker will send here, checked: one message to each peer carries
        the counts of every exchange, so the workers meet once for all of them."""
        sides = len(counts)
        mine = np.asarray(counts, dtype=np.int64).reshape(sides, self.size)
        got = {p: np.empty(sides, dtype=np.int64) for p in self.peers}
        self._transfer({p: [np.ascontiguousarray(mine[:, p])] for p in self.peers},
                       {p: [got[p]] for p in self.peers})
        recv = np.empty((sides, self.size), dtype=np.int64)
        recv[:, self.rank] = mine[:, self.rank]
        for p in self.peers:
            for k, n in enumerate(got[p].tolist()):
                if not 0 <= n * row_bytes <= MAX_MESSAGE_BYTES:
                    raise self.failure(p, f"{{peer}} announced an impossible row count ({n})")
                recv[k, p] = n
        return list(recv)

    def allgather(self, obj: Any) -> list[Any]:
        """Every worker's ``obj``, in rank order (pickled over :meth:`exchange`)."""
        payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        got = self.exchange({p: payload for p in self.peers})
        return [obj if p == self.rank else pickle.loads(got[p].tobytes())
                for p in range(self.size)]

    def barrier(self) -> None:
        """Wait until every worker reached this point."""
        self.allgather(None)

    def close(self) -> None:
        """Release connections."""
        if self._status is not None:
            self._status.close()
