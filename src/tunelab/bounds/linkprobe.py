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

Data flows as in a workload's exchange: each rank sends from one buffer it keeps using (what
a workload sends it has just produced: in the cache) and receives into sets of buffers that
cycle through ``--working-set`` bytes, by default four times the host's last-level cache
(where a workload receives, it has not touched since: in memory). Measured three ways on a
2-core AMD EPYC (32 MiB L3, 4 MiB messages both ways over ob1): one reused buffer pair
(both ends in the cache) 10-16 GB/s, a rate the merge exchange's transfer reached only 0.56
of; both ends cycled through memory 3.6-5.8 GB/s, which the merge's transfer exceeded
(1.69x: no bound); a hot source and a cold destination 6.5-6.7 GB/s, with the merge's
transfer at 0.86 of it (docs/bounds.md).

For ``bothways`` and ``alltoall`` every exchange starts after a barrier and is timed on its
own, from this rank's first post to its last completion (the merge times its exchange so);
a block's rate is the harmonic mean over the ranks of their own rates (the merge's
definition of its bandwidth). Rank 0 prints one JSON
line: ``{"probe": "link", "hosts": […], "results": [{"pattern", "message_bytes", "ranks",
"iterations", "buffer_sets", "working_set_bytes", "samples"}]}``, one sample per timed
block (``--repeats``), after one untimed block.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from tunelab.sysinfo import mem_available

__all__ = ["PATTERNS", "buffer_sets", "default_working_set", "last_level_cache", "main"]

PATTERNS = ("oneway", "bothways", "alltoall")
CACHE_MULTIPLE = 4
"""The default working set of a rank, in last-level caches."""
FALLBACK_CACHE = 32 << 20
"""The last-level cache assumed where sysfs does not say (bytes)."""
MAX_SETS = 1024
"""Buffer sets at the most (tiny messages need no more to leave the cache)."""


def last_level_cache() -> int:
    """Bytes of this host's largest CPU cache (sysfs), else :data:`FALLBACK_CACHE`."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    best = 0
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip()
            best = max(best, int(text.rstrip("KMG")) * units.get(text[-1:], 1))
        except (OSError, ValueError):
            continue
    return best or FALLBACK_CACHE


def default_working_set(local_ranks: int) -> int:
    """Bytes of buffers per rank: :data:`CACHE_MULTIPLE` last-level caches, no more than a
    quarter of the memory available shared by the ``local_ranks`` of this host."""
    return min(CACHE_MULTIPLE * last_level_cache(), mem_available() // (4 * max(1, local_ranks)))


def buffer_sets(size: int, nranks: int, working_set: int) -> int:
    """Sets of receive buffers (one per peer, ``size`` bytes each) that, with the one send
    buffer, make ``working_set`` bytes: at least one, at most :data:`MAX_SETS`."""
    per_set = max(1, nranks - 1) * max(size, 1)
    return max(1, min(MAX_SETS, -(-(working_set - size) // per_set)))


def _iterations(size: int, block_bytes: int) -> int:
    return int(min(2000, max(3, block_bytes // max(size, 1))))


def _block(comm: Any, mpi: Any, pattern: str, send: np.ndarray,
           recvs: Iterator[list[np.ndarray]], iters: int) -> float:
    """One block of ``iters`` exchanges, each into the next receive set (the cycle goes on
    across blocks, so no set is reused sooner than all the others); this rank's bytes sent
    per second (0 when idle)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    nbytes = send.nbytes
    comm.Barrier()
    t = time.perf_counter()
    if pattern == "oneway":
        if rank > 1:
            return 0.0
        other = 1 - rank
        for _ in range(iters):
            recv = next(recvs)[0]
            if rank == 0:
                comm.Send([send, mpi.BYTE], dest=other)
                comm.Recv([recv, mpi.BYTE], source=other)
            else:
                comm.Recv([recv, mpi.BYTE], source=other)
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
        into = next(recvs)
        comm.Barrier()  # every exchange starts together and is timed on its own
        t = time.perf_counter()
        reqs = [comm.Irecv([into[k], mpi.BYTE], source=p) for k, p in enumerate(peers)]
        reqs += [comm.Isend([send, mpi.BYTE], dest=p) for p in peers]
        mpi.Request.Waitall(reqs)
        busy += time.perf_counter() - t
    return float(len(peers)) * nbytes * iters / busy


def _resident(size: int) -> np.ndarray:
    """A receive buffer with its pages written (``np.zeros`` maps them lazily: the first
    exchange into it would time page faults, not the link)."""
    buf = np.empty(size, dtype=np.uint8)
    buf.fill(0)
    return buf


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
    parser.add_argument("--working-set", type=int, default=0,
                        help="bytes of buffers per rank (0: four last-level caches)")
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
    local = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
    working_set = args.working_set or default_working_set(local)
    for size in sizes:
        sets = buffer_sets(size, nranks, working_set)
        send = np.full(size, rank % 251, dtype=np.uint8)  # one, kept hot
        recv_sets = [[_resident(size) for _ in range(nranks - 1)] for _ in range(sets)]
        recvs = itertools.cycle(recv_sets)
        iters = _iterations(size, args.block_bytes)
        for pattern in patterns:
            _block(comm, MPI, pattern, send, recvs, max(1, iters // 4))  # untimed warm-up
            samples = []
            for _ in range(max(1, args.repeats)):
                mine = _block(comm, MPI, pattern, send, recvs, iters)
                every = comm.gather(mine, root=0)
                if rank == 0 and every is not None:
                    samples.append(every[0] if pattern == "oneway" else _harmonic(every))
            results.append({"pattern": pattern, "message_bytes": size, "ranks": nranks,
                            "iterations": iters, "buffer_sets": sets,
                            "working_set_bytes": size * (1 + sets * (nranks - 1)),
                            "samples": samples})
        del send, recv_sets, recvs
    if rank == 0:
        print(json.dumps({"probe": "link", "hosts": sorted(set(hosts or [])),
                          "results": results}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
