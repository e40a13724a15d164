"""The link probe over plain TCP sockets: the stack of the merge benchmark's ``tcp`` transport.

One process per rank, started by :func:`tunelab.bounds.link.link_rates` (stack ``tcp``)::

    python -m tunelab.bounds.tcpprobe --rank R --ranks N --dir RENDEZVOUS \\
        --patterns oneway,alltoall --sizes 4194304 --repeats 5 --block-bytes 134217728

Every rank listens on an ephemeral port of ``--host`` and publishes it in the rendezvous
directory; rank r connects to every lower rank and accepts the higher ones (one connection
per pair, ``TCP_NODELAY``, 4 MiB socket buffers, as the merge's transport sets them), driven
as the merge's transport drives them: non-blocking, on one asyncio loop. The patterns and
rates are those of :mod:`tunelab.bounds.linkprobe`: a ping-pong between ranks 0 and 1;
exchanges (pairs, or every rank with every other) that start after a barrier, send while
receiving into pre-sized buffers, and are timed on their own; a block's rate is the harmonic
mean over ranks. (Sending and receiving from threads on blocking sockets, as this probe did
first, gave a bound that jumped between 1.2 and 2.5 GB/s from run to run on a 2-core AMD
EPYC, while the merge's exchange held at 1.7-1.8 GB/s.) Rank 0 prints the same JSON line as
the MPI probe.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import struct
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import numpy as np

from tunelab.bounds.linkprobe import PATTERNS

__all__ = ["main"]

_BUF = 4 << 20


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from a blocking ``sock`` (set-up only)."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            raise ConnectionError("a peer closed its connection")
        got += n


def _connect(rank: int, ranks: int, directory: Path, host: str,
             timeout: float) -> dict[int, socket.socket]:
    """One connected socket per other rank."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, 0))
    listener.listen(ranks)
    listener.settimeout(timeout)
    tmp = directory / f".rank-{rank}.tmp"
    tmp.write_text(f"{host} {listener.getsockname()[1]}")
    os.replace(tmp, directory / f"rank-{rank}.addr")
    deadline = time.monotonic() + timeout
    peers: dict[int, socket.socket] = {}
    for p in range(rank):
        path = directory / f"rank-{p}.addr"
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {p} published no address in {timeout:g} s")
            time.sleep(0.01)
        addr, port = path.read_text().split()
        sock = socket.create_connection((addr, int(port)), timeout=timeout)
        sock.sendall(struct.pack("!i", rank))
        peers[p] = sock
    for _ in range(ranks - 1 - rank):
        sock, _ = listener.accept()
        sock.settimeout(timeout)
        head = bytearray(4)
        _recv_into(sock, memoryview(head))
        peers[struct.unpack("!i", head)[0]] = sock
    listener.close()
    for sock in peers.values():
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUF)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUF)
        sock.settimeout(timeout)
    return peers


class _Group:
    """This rank's sockets, non-blocking on one asyncio loop (as the merge's transport drives
    them), with a barrier and a gather at rank 0."""

    def __init__(self, rank: int, ranks: int, peers: dict[int, socket.socket],
                 timeout: float) -> None:
        self.rank, self.ranks, self.peers, self.timeout = rank, ranks, peers, timeout
        self.loop = asyncio.new_event_loop()
        for sock in peers.values():
            sock.setblocking(False)

    def run(self, *coros: Coroutine[Any, Any, Any]) -> None:
        """Run ``coros`` together on the loop, within the timeout."""
        async def every() -> None:
            await asyncio.wait_for(asyncio.gather(*coros), self.timeout)

        self.loop.run_until_complete(every())

    async def recv(self, peer: int, view: memoryview) -> None:
        """Fill ``view`` from ``peer``."""
        got, n = 0, len(view)
        while got < n:
            k = await self.loop.sock_recv_into(self.peers[peer], view[got:])
            if not k:
                raise ConnectionError(f"rank {peer} closed its connection")
            got += k

    async def send(self, peer: int, data: Any) -> None:
        """Send ``data`` to ``peer``."""
        await self.loop.sock_sendall(self.peers[peer], data)

    def barrier(self) -> None:
        self.gather(0.0)
        if self.rank == 0:
            self.run(*(self.send(p, b"\1") for p in self.peers))
        else:
            self.run(self.recv(0, memoryview(bytearray(1))))

    def gather(self, value: float) -> list[float] | None:
        """Every rank's ``value`` at rank 0 (None elsewhere)."""
        if self.rank != 0:
            self.run(self.send(0, struct.pack("!d", value)))
            return None
        raws = [bytearray(8) for _ in range(1, self.ranks)]
        self.run(*(self.recv(p, memoryview(raws[p - 1])) for p in range(1, self.ranks)))
        return [value, *(struct.unpack("!d", raw)[0] for raw in raws)]

    def close(self) -> None:
        """Close the sockets and the loop."""
        for sock in self.peers.values():
            sock.close()
        self.loop.close()


async def _pingpong(g: _Group, out: memoryview, into: memoryview, iters: int) -> None:
    other = 1 - g.rank
    for _ in range(iters):
        if g.rank == 0:
            await g.send(other, out)
            await g.recv(other, into)
        else:
            await g.recv(other, into)
            await g.send(other, out)


def _block(g: _Group, pattern: str, send: np.ndarray, recv: list[np.ndarray],
           iters: int) -> float:
    """One block of ``iters`` exchanges; this rank's bytes sent per second (0 when idle)."""
    nbytes = send.nbytes
    out, ins = send.data, [r.data for r in recv]
    g.barrier()
    if pattern == "oneway":
        if g.rank > 1:
            return 0.0
        t = time.perf_counter()
        g.run(_pingpong(g, out, ins[0], iters))
        return 2.0 * nbytes * iters / (time.perf_counter() - t)
    if pattern == "bothways":
        partners = [g.rank ^ 1] if (g.rank ^ 1) < g.ranks else []
    else:
        partners = [p for p in range(g.ranks) if p != g.rank]
    busy = 0.0
    for _ in range(iters):
        g.barrier()
        t = time.perf_counter()
        g.run(*(g.send(p, out) for p in partners),
              *(g.recv(p, ins[i]) for i, p in enumerate(partners)))
        busy += time.perf_counter() - t
    return float(len(partners)) * nbytes * iters / busy if partners else 0.0


def _harmonic(rates: list[float]) -> float:
    active = [r for r in rates if r > 0]
    return len(active) / sum(1.0 / r for r in active) if active else 0.0


def main(argv: list[str] | None = None) -> int:
    """Run this rank of the probe; rank 0 prints the JSON line."""
    from tunelab.bounds.linkprobe import _iterations

    parser = argparse.ArgumentParser(prog="python -m tunelab.bounds.tcpprobe")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--patterns", default="oneway,bothways,alltoall")
    parser.add_argument("--sizes", default="4194304")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--block-bytes", type=int, default=64 << 20)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    patterns = [p for p in args.patterns.split(",") if p]
    bad = [p for p in patterns if p not in PATTERNS]
    if bad:
        parser.error(f"unknown pattern {bad[0]!r}; valid: {', '.join(PATTERNS)}")
    if args.ranks < 2 or not 0 <= args.rank < args.ranks:
        parser.error("needs --ranks >= 2 and 0 <= --rank < --ranks")
    g = _Group(args.rank, args.ranks, _connect(args.rank, args.ranks, args.dir, args.host,
                                               args.timeout), args.timeout)
    results = []
    for size in (int(s) for s in args.sizes.split(",") if s):
        send = np.full(size, args.rank % 251, dtype=np.uint8)
        recv = [np.empty(size, dtype=np.uint8) for _ in range(args.ranks - 1)]
        iters = _iterations(size, args.block_bytes)
        for pattern in patterns:
            _block(g, pattern, send, recv, max(1, iters // 4))  # untimed warm-up
            samples = []
            for _ in range(max(1, args.repeats)):
                every = g.gather(_block(g, pattern, send, recv, iters))
                if every is not None:
                    samples.append(every[0] if pattern == "oneway" else _harmonic(every))
            results.append({"pattern": pattern, "message_bytes": size, "ranks": args.ranks,
                            "iterations": iters, "samples": samples})
    g.barrier()
    if args.rank == 0:
        print(json.dumps({"probe": "link", "hosts": [socket.gethostname()],
                          "results": results}), flush=True)
    g.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
