"""MPI transport: mpi4py non-blocking point-to-point over Open MPI (ob1 or the UCX PML).

The data exchange posts one ``Irecv`` per peer and column straight into the pre-sized receive
columns (mpi4py's buffer interface: numpy memory, no pickling) and one ``Isend`` per peer and
column from the partitioned send columns, then polls ``Testall`` against a deadline, so a
peer that stops answering is reported instead of waited for. Small messages (row counts,
``allgather``) use the same calls on byte arrays. A failed worker calls ``MPI_Abort`` after
printing its message so the whole job ends. Launched by ``mpirun`` (see
:mod:`~tunelab.bench.merge.launch`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tunelab.bench.merge.comm import MAX_MESSAGE_BYTES, Comm
from tunelab.errors import WorkloadError

__all__ = ["MpiComm", "import_mpi"]

_TAG_SIZE, _TAG_DATA, _TAG_COLUMN = 11, 12, 20


def import_mpi() -> Any:
    """``mpi4py.MPI``, or a one-line error saying how to install it."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise WorkloadError(
            f"--transport mpi needs mpi4py ({exc}); install it with "
            "pip install 'tunelab[merge]' (it links to the system Open MPI: apt-get install "
            "libopenmpi-dev)"
        ) from exc
    return MPI


class MpiComm(Comm):
    """All-to-all over ``MPI_COMM_WORLD``."""

    def __init__(self, timeout: float, **kw: object) -> None:
        self._mpi = import_mpi()
        world = self._mpi.COMM_WORLD
        super().__init__(world.Get_rank(), world.Get_size(), timeout, **kw)  # type: ignore[arg-type]
        self._comm = world
        self._oversubscribed = self.size > (os.cpu_count() or 1)

    def _wait(self, requests: list[Any], peers: list[int], what: str) -> None:
        deadline = time.monotonic() + self.timeout
        spins = 0
        testall = self._mpi.Request.Testall
        while not testall(requests):
            # Busy-poll like MPI_Waitall does (progress happens inside Testall); look at the
            # clock every 256 polls, and give the core away when ranks outnumber cores.
            spins += 1
            if spins & 255 == 0:
                if time.monotonic() > deadline:
                    pending = [p for r, p in zip(requests, peers, strict=True) if not r.Test()]
                    peer = pending[0] if pending else None
                    raise self.failure(peer, f"timed out after {self.timeout:g} s waiting for "
                                             f"{{peer}} ({what})")
                if self._oversubscribed:
                    time.sleep(0)

    def exchange(self, send: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        MPI = self._mpi
        peers = self.peers
        out = {p: np.ascontiguousarray(send[p]).reshape(-1).view(np.uint8) for p in peers}
        sizes_out = {p: np.array([out[p].nbytes], dtype=np.int64) for p in peers}
        sizes_in = {p: np.empty(1, dtype=np.int64) for p in peers}
        reqs = [self._comm.Irecv(sizes_in[p], source=p, tag=_TAG_SIZE) for p in peers]
        reqs += [self._comm.Isend(sizes_out[p], dest=p, tag=_TAG_SIZE) for p in peers]
        self._wait(reqs, peers + peers, "message sizes")
        for p in peers:
            if not 0 <= int(sizes_in[p][0]) <= MAX_MESSAGE_BYTES:
                raise self.failure(p, f"{{peer}} announced a message of {int(sizes_in[p][0])} "
                                      "bytes")
        got = {p: np.empty(int(sizes_in[p][0]), dtype=np.uint8) for p in peers}
        reqs = [self._comm.Irecv([got[p], MPI.BYTE], source=p, tag=_TAG_DATA) for p in peers]
        reqs += [self._comm.Isend([out[p], MPI.BYTE], dest=p, tag=_TAG_DATA) for p in peers]
        self._wait(reqs, peers + peers, "data")
        return got

    def _transfer(self, sends: Mapping[int, Sequence[np.ndarray]],
                  recvs: Mapping[int, Sequence[np.ndarray]]) -> None:
        MPI = self._mpi
        reqs: list[Any] = []
        who: list[int] = []
        for p in self.peers:
            for i, buf in enumerate(recvs[p]):
                if buf.nbytes:
                    reqs.append(self._comm.Irecv([buf.view(np.uint8), MPI.BYTE], source=p,
                                                 tag=_TAG_COLUMN + i))
                    who.append(p)
        for p in self.peers:
            for i, buf in enumerate(sends[p]):
                if buf.nbytes:
                    reqs.append(self._comm.Isend([buf.view(np.uint8), MPI.BYTE], dest=p,
                                                 tag=_TAG_COLUMN + i))
                    who.append(p)
        self._wait(reqs, who, "data")

    def abort(self, code: int) -> None:
        """End every rank of the job (after a failure this worker has reported)."""
        self._comm.Abort(code)
