"""The plain-socket baseline: asyncio streams, one connection per pair of workers.

Framing: a 16-byte header (exchange sequence number, payload bytes) then the payload.
Addresses are exchanged through :mod:`~tunelab.bench.merge.rendezvous`; worker ``r`` connects
to every lower rank and accepts connections from every higher one.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from tunelab.bench.merge import rendezvous
from tunelab.bench.merge.comm import Comm

__all__ = ["TcpComm"]

_HEADER = struct.Struct("!QQ")
_STREAM_LIMIT = 1 << 22


def as_bytes(arr: np.ndarray) -> memoryview:
    """A flat byte view of a C-contiguous array (no copy)."""
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return memoryview(flat)  # type: ignore[arg-type]


class TcpComm(Comm):
    """All-to-all over asyncio TCP streams."""

    def __init__(self, rank: int, size: int, timeout: float, address_dir: str,
                 host: str = "127.0.0.1", **kw: object) -> None:
        super().__init__(rank, size, timeout, **kw)  # type: ignore[arg-type]
        self._loop = asyncio.new_event_loop()
        self._readers: dict[int, asyncio.StreamReader] = {}
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._seq = 0
        self.enter("connect")
        self._loop.run_until_complete(self._connect(address_dir, host))

    async def _connect(self, address_dir: str, host: str) -> None:
        higher = set(range(self.rank + 1, self.size))
        all_in = asyncio.Event()
        if not higher:
            all_in.set()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            (peer,) = struct.unpack("!Q", await reader.readexactly(8))
            self._readers[peer], self._writers[peer] = reader, writer
            if higher <= self._readers.keys():
                all_in.set()

        server = await asyncio.start_server(accept, host=host, port=0, limit=_STREAM_LIMIT)
        port = server.sockets[0].getsockname()[1]
        rendezvous.publish(address_dir, self.rank, {"host": host, "port": port})
        deadline = time.monotonic() + self.timeout
        for peer in range(self.rank):
            info = await self.peer_address(address_dir, peer, deadline)
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(info["host"], info["port"], limit=_STREAM_LIMIT),
                    max(deadline - time.monotonic(), 0.1))
            except (OSError, TimeoutError) as exc:
                raise self.failure(peer, f"cannot connect to {{peer}} at "
                                         f"{info['host']}:{info['port']} ({exc})") from exc
            writer.write(struct.pack("!Q", self.rank))
            self._readers[peer], self._writers[peer] = reader, writer
        try:
            await asyncio.wait_for(all_in.wait(), max(deadline - time.monotonic(), 0.1))
        except TimeoutError:
            missing = sorted(higher - self._readers.keys())
            raise self.failure(missing[0], f"timed out after {self.timeout:g} s waiting for "
                                           f"{{peer}} to connect") from None
        finally:
            server.close()

    def exchange(self, send: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        self._seq += 1
        return self._loop.run_until_complete(self._exchange(send, self._seq))

    async def _exchange(self, send: Mapping[int, np.ndarray], seq: int) -> dict[int, np.ndarray]:
        async def put(peer: int, arr: np.ndarray) -> None:
            writer = self._writers[peer]
            data = as_bytes(arr)
            writer.write(_HEADER.pack(seq, data.nbytes))
            writer.write(data)
            await writer.drain()

        async def get(peer: int) -> np.ndarray:
            reader = self._readers[peer]
            got_seq, nbytes = _HEADER.unpack(await reader.readexactly(_HEADER.size))
            if got_seq != seq:
                raise self.failure(peer, f"got message {got_seq} from {{peer}}, expected {seq}")
            return np.frombuffer(await reader.readexactly(nbytes), dtype=np.uint8)

        tasks: dict[asyncio.Future[Any], int] = {
            asyncio.ensure_future(get(p)): p for p in self.peers}
        tasks.update({asyncio.ensure_future(put(p, send[p])): p for p in self.peers})
        done, pending = await asyncio.wait(tasks, timeout=self.timeout,
                                           return_when=asyncio.FIRST_EXCEPTION)
        self.raise_first_failure(tasks, done, pending)
        return {tasks[t]: t.result() for t in done if t.result() is not None}

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        with contextlib.suppress(Exception):
            self._loop.run_until_complete(asyncio.sleep(0))
        self._loop.close()
        super().close()
