"""The plain-socket baseline: non-blocking TCP sockets driven by asyncio, one per worker pair.

Framing: every message is a 16-byte header (exchange sequence number, payload bytes) and
the payload. Column buffers are sent from the partitioned columns as they are and received
with ``sock_recv_into`` straight into the pre-sized receive columns (no intermediate
``bytes`` object, no copy); the header's size must match what the exchanged row counts
announced. Addresses are exchanged through :mod:`~tunelab.bench.merge.rendezvous`; worker
``r`` connects to every lower rank and accepts connections from every higher one.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tunelab.bench.merge import rendezvous
from tunelab.bench.merge.comm import MAX_MESSAGE_BYTES, Comm

__all__ = ["TcpComm"]

_HEADER = struct.Struct("!QQ")
_HELLO = struct.Struct("!Q")
_SOCKET_BUFFER = 4 << 20  # kernel buffers: fewer wake-ups per MiB on loopback and LANs


def as_bytes(arr: np.ndarray) -> memoryview:
    """A flat byte view of a C-contiguous array (no copy)."""
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return memoryview(flat)  # type: ignore[arg-type]


def _tune(sock: socket.socket) -> None:
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):  # the kernel may cap it; that is fine
            sock.setsockopt(socket.SOL_SOCKET, opt, _SOCKET_BUFFER)


class TcpComm(Comm):
    """All-to-all over TCP sockets."""

    def __init__(self, rank: int, size: int, timeout: float, address_dir: str,
                 host: str = "127.0.0.1", **kw: object) -> None:
        super().__init__(rank, size, timeout, **kw)  # type: ignore[arg-type]
        self._loop = asyncio.new_event_loop()
        self._socks: dict[int, socket.socket] = {}
        self._seq = 0
        self.enter("connect")
        self._loop.run_until_complete(self._connect(address_dir, host))

    # -- set-up --------------------------------------------------------------------------
    async def _connect(self, address_dir: str, host: str) -> None:
        loop = asyncio.get_running_loop()
        higher = set(range(self.rank + 1, self.size))
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server = socket.create_server((host, 0), family=family, backlog=max(self.size, 8))
        server.setblocking(False)

        async def accept_all() -> None:
            while not higher <= self._socks.keys():
                conn, _ = await loop.sock_accept(server)
                _tune(conn)
                hello = bytearray(_HELLO.size)
                await self._recv_into(conn, memoryview(hello), None)
                (peer,) = _HELLO.unpack(hello)
                self._socks[int(peer)] = conn

        try:
            port = server.getsockname()[1]
            rendezvous.publish(address_dir, self.rank, {"host": host, "port": port})
            deadline = time.monotonic() + self.timeout
            accepting = asyncio.ensure_future(accept_all())
            for peer in range(self.rank):
                info = await self.peer_address(address_dir, peer, deadline)
                sock = socket.socket(family, socket.SOCK_STREAM)
                _tune(sock)
                try:
                    await asyncio.wait_for(loop.sock_connect(sock, (info["host"], info["port"])),
                                           max(deadline - time.monotonic(), 0.1))
                except (OSError, TimeoutError) as exc:
                    sock.close()
                    accepting.cancel()
                    raise self.failure(peer, f"cannot connect to {{peer}} at "
                                             f"{info['host']}:{info['port']} ({exc})") from exc
                await loop.sock_sendall(sock, _HELLO.pack(self.rank))
                self._socks[peer] = sock
            try:
                await asyncio.wait_for(accepting, max(deadline - time.monotonic(), 0.1))
            except TimeoutError:
                missing = sorted(higher - self._socks.keys())
                raise self.failure(missing[0], f"timed out after {self.timeout:g} s waiting "
                                               f"for {{peer}} to connect") from None
        finally:
            server.close()

    # -- message primitives ---------------------------------------------------------------
    async def _recv_into(self, sock: socket.socket, view: memoryview, peer: int | None) -> None:
        loop = asyncio.get_running_loop()
        pos, n = 0, view.nbytes
        while pos < n:
            got = await loop.sock_recv_into(sock, view[pos:])
            if got == 0:
                raise self.failure(peer, "{peer} closed the connection")
            pos += got

    async def _header(self, peer: int, seq: int) -> int:
        head = bytearray(_HEADER.size)
        await self._recv_into(self._socks[peer], memoryview(head), peer)
        got_seq, nbytes = _HEADER.unpack(head)
        if got_seq != seq:
            raise self.failure(peer, f"got message {got_seq} from {{peer}}, expected {seq}")
        return int(nbytes)

    async def _send(self, peer: int, seq: int, bufs: Sequence[np.ndarray],
                    skip_empty: bool) -> None:
        loop = asyncio.get_running_loop()
        sock = self._socks[peer]
        for buf in bufs:
            if skip_empty and not buf.nbytes:
                continue
            await loop.sock_sendall(sock, _HEADER.pack(seq, buf.nbytes))
            if buf.nbytes:
                await loop.sock_sendall(sock, as_bytes(buf))

    async def _run(self, tasks: dict[asyncio.Future[Any], int]) -> None:
        done, pending = await asyncio.wait(tasks, timeout=self.timeout,
                                           return_when=asyncio.FIRST_EXCEPTION)
        self.raise_first_failure(tasks, done, pending)

    # -- Comm -----------------------------------------------------------------------------
    def exchange(self, send: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        self._seq += 1
        return self._loop.run_until_complete(self._exchange(send, self._seq))

    async def _exchange(self, send: Mapping[int, np.ndarray], seq: int) -> dict[int, np.ndarray]:
        got: dict[int, np.ndarray] = {}

        async def get(peer: int) -> None:
            nbytes = await self._header(peer, seq)
            if nbytes > MAX_MESSAGE_BYTES:
                raise self.failure(peer, f"{{peer}} announced a message of {nbytes} bytes")
            buf = np.empty(nbytes, dtype=np.uint8)
            await self._recv_into(self._socks[peer], memoryview(buf), peer)  # type: ignore[arg-type]
            got[peer] = buf

        tasks: dict[asyncio.Future[Any], int] = {
            asyncio.ensure_future(get(p)): p for p in self.peers}
        tasks.update({asyncio.ensure_future(self._send(p, seq, [send[p]], False)): p
                      for p in self.peers})
        await self._run(tasks)
        return got

    def _transfer(self, sends: Mapping[int, Sequence[np.ndarray]],
                  recvs: Mapping[int, Sequence[np.ndarray]]) -> None:
        self._seq += 1
        self._loop.run_until_complete(self._columns(sends, recvs, self._seq))

    async def _columns(self, sends: Mapping[int, Sequence[np.ndarray]],
                       recvs: Mapping[int, Sequence[np.ndarray]], seq: int) -> None:
        async def get(peer: int) -> None:
            for buf in recvs[peer]:
                if not buf.nbytes:
                    continue
                nbytes = await self._header(peer, seq)
                if nbytes != buf.nbytes:
                    raise self.failure(peer, f"{{peer}} sent {nbytes} bytes where its row "
                                             f"count announced {buf.nbytes}")
                await self._recv_into(self._socks[peer], as_bytes(buf), peer)

        tasks: dict[asyncio.Future[Any], int] = {
            asyncio.ensure_future(get(p)): p for p in self.peers}
        tasks.update({asyncio.ensure_future(self._send(p, seq, sends[p], True)): p
                      for p in self.peers})
        await self._run(tasks)

    def close(self) -> None:
        for sock in self._socks.values():
            with contextlib.suppress(OSError):
                sock.close()
        self._socks.clear()
        self._loop.close()
        super().close()
