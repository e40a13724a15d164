"""The link probe: an mpi4py program that measures how fast ranks move bytes to each other.

Run under ``mpirun`` (see :mod:`tunelab.bounds.link`)::

    mpirun -np 2 python -m tunelab.bounds.linkprobe --patterns oneway,alltoall \\
        --sizes 1048576,4194304 --repeats 5 --block-bytes 67108864

Patterns, every rate in bytes one rank sends per second:

* ``oneway`` — a ping-pong between ranks 0 and 1 (one direction at a time): 2 x size x
  iterations / elapsed, as ping-pong bandwidth is usually reported;
* ``bothways`` — ranks in pairs (0-1, 2-3, …) send to each other at the same time
  (``Isend`` + ``Irecv``, ``Waitall``): size x iterations / seconds exchanging, per rank;
* ``alltoall`` — every rank sends one message to every other rank at the same time, as the
  merge benchmark's exchange does: (ranks - 1) x size x iterations / seconds exchanging.

For ``bothways`` and ``alltoall`` every exchange starts after a barrier and is timed on its
own, from this rank's first post to its last completion (the merge times its exchange so);
a block's rate is the harmonic mean over the ranks of their own rates (the merge's
definition of its bandwidth). Rank 0 prints one JSON
line: ``{"probe": "link", "hosts": […], "results": [{"pattern", "message_bytes", "ranks",
"samples"}]}``, one sample per timed block (``--repeats``), after one untimed block.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from typing import Any

import numpy as np

__all__ = ["PATTERNS", "main"]

PATTERNS = ("oneway", "bothways", "alltoall")


def _iterations(size: int, block_bytes: int) -> int:
    return int(min(2000, max(3, block_bytes // max(size, 1))))


def _block(comm: Any, mpi: Any, pattern: str, send: np.ndarray, recv: list[np.ndarray],
           iters: int) -> float:
    """One block of ``iters`` exchanges; this rank's bytes sent per second (0 when idle)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    nbytes = send.nbytes
    comm.Barrier()
    t = time.perf_counter()
    if pattern == "oneway":
        if rank > 1:
            return 0.0
        other = 1 - rank
        for _ in range(iters):
            if rank == 0:
                comm.Send([send, mpi.BYTE], dest=other)
                comm.Recv([recv[0], mpi.BYTE], source=other)
            else:
                comm.Recv([recv[0], mpi.BYTE], source=other)
                comm.Send([send, mpi.BYTE], dest=other)
        return 2.0 * nbytes * iters / (time.perf_counter() - t)
    if pattern == "bothways":
        peers = [rank ^ 1] if (rank ^ 1) < size else []
    else:
        peers = [(rank + k) % size for k in range(1, size)]
    if not peers:
        for _ in range(iters):
            comm.Barrier()
        return 0.0
    busy = 0.0
    for _ in range(iters):
        comm.Barrier()  # every exchange starts together and is timed on its own
        t = time.perf_counter()
        reqs = [comm.Irecv([recv[i], mpi.BYTE], source=p) for i, p in enumerate(peers)]
        reqs += [comm.Isend([send, mpi.BYTE], dest=p) for p in peers]
        mpi.Request.Waitall(reqs)
        busy += time.perf_counter() - t
    return float(len(peers)) * nbytes * iters / busy


def _harmonic(rates: list[float]) -> float:
    active = [r for r in rates if r > 0]
    return len(active) / sum(1.0 / r for r in active) if active else 0.0


def main(argv: list[str] | None = None) -> int:
    """Run the probe; rank 0 prints the JSON line."""
    parser = argparse.ArgumentParser(prog="python -m tunelab.bounds.linkprobe")
    parser.add_argument("--patterns", default="oneway,bothways,alltoall")
    parser.add_argument("--sizes", default="4194304")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--block-bytes", type=int, default=64 << 20)
    args = parser.parse_args(argv)
    patterns = [p for p in args.patterns.split(",") if p]
    bad = [p for p in patterns if p not in PATTERNS]
    if bad:
        parser.error(f"unknown pattern {bad[0]!r}; valid: {', '.join(PATTERNS)}")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, nranks = comm.Get_rank(), comm.Get_size()
    if nranks < 2:
        print("linkprobe: needs at least 2 ranks", file=sys.stderr)
        return 2
    hosts = comm.gather(socket.gethostname(), root=0)
    results = []
    for size in sizes:
        send = np.full(size, rank % 251, dtype=np.uint8)
        recv = [np.empty(size, dtype=np.uint8) for _ in range(nranks - 1)]
        iters = _iterations(size, args.block_bytes)
        for pattern in patterns:
            _block(comm, MPI, pattern, send, recv, max(1, iters // 4))  # untimed warm-up
            samples = []
            for _ in range(max(1, args.repeats)):
                mine = _block(comm, MPI, pattern, send, recv, iters)
                every = comm.gather(mine, root=0)
                if rank == 0 and every is not None:
                    samples.append(every[0] if pattern == "oneway" else _harmonic(every))
            results.append({"pattern": pattern, "message_bytes": size, "ranks": nranks,
                            "iterations": iters, "samples": samples})
    if rank == 0:
        print(json.dumps({"probe": "link", "hosts": sorted(set(hosts or [])),
                          "results": results}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
