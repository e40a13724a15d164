"""MPI transport: mpi4py non-blocking point-to-point over Open MPI (ob1 or the UCX PML).

Each exchange posts ``Irecv``/``Isend`` of the sizes, then of the data, to and from every
peer, and polls ``Testall`` against a deadline, so a peer that stops answering is reported
instead of waited for. A failed worker calls ``MPI_Abort`` after printing its message so the
whole job ends. Launched by ``mpirun`` (see :mod:`~tunelab.bench.merge.launch`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from tunelab.bench.merge.comm import Comm
from tunelab.errors import WorkloadError

__all__ = ["MpiComm", "import_mpi"]

_TAG_SIZE, _TAG_DATA = 11, 12


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
        got = {p: np.empty(int(sizes_in[p][0]), dtype=np.uint8) for p in peers}
        reqs = [self._comm.Irecv([got[p], MPI.BYTE], source=p, tag=_TAG_DATA) for p in peers]
        reqs += [self._comm.Isend([out[p], MPI.BYTE], dest=p, tag=_TAG_DATA) for p in peers]
        self._wait(reqs, peers + peers, "data")
        return got

    def abort(self, code: int) -> None:
        """End every rank of the job (after a failure this worker has reported)."""
        self._comm.Abort(code)
