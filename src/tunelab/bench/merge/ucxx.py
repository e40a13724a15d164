"""The ``ucxx`` transport: UCXX Python bindings, one endpoint between every pair of workers.

The shape of the competition's UCX-Py merge script: every worker opens a listener, publishes
its address through the rendezvous directory, and worker ``r`` creates endpoints to every
lower rank (telling it its rank in a first message). A small exchange sends, per peer, the
payload size then the payload with tagged ``send``/``recv``; the data exchange sends each
column slice as it lies in the partitioned columns and receives it straight into the pre-sized
receive column (sizes known from the exchanged row counts, so no size message and no copy).
Every receive has a deadline. ``UCX_*``
variables (``UCX_TLS``, ``UCX_RNDV_SCHEME``, …) take effect here, as do UCXX's own
``UCXPY_*`` ones (for example ``UCXPY_PROGRESS_MODE``). Optional: ``pip install
'tunelab[ucx]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tunelab.bench.merge import rendezvous
from tunelab.bench.merge.comm import MAX_MESSAGE_BYTES, Comm
from tunelab.errors import WorkloadError

__all__ = ["UcxxComm", "import_ucxx"]


def import_ucxx() -> Any:
    """The ``ucxx`` module, or a one-line error saying how to install it."""
    try:
        import ucxx
    except ImportError as exc:
        raise WorkloadError(
            f"--transport ucxx needs the UCXX Python bindings ({exc}); install them with "
            "pip install 'tunelab[ucx]' (ucxx-cu12 and distributed-ucxx-cu12, which pin their "
            "own dask: use a separate virtual environment)"
        ) from exc
    return ucxx


class UcxxComm(Comm):
    """All-to-all over UCXX endpoints."""

    def __init__(self, rank: int, size: int, timeout: float, address_dir: str,
                 host: str = "127.0.0.1", **kw: object) -> None:
        super().__init__(rank, size, timeout, **kw)  # type: ignore[arg-type]
        self._ucxx = import_ucxx()
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._eps: dict[int, Any] = {}
        self._listener: Any = None
        self.enter("connect")
        self._loop.run_until_complete(self._connect(address_dir, host))

    async def _connect(self, address_dir: str, host: str) -> None:
        ucxx = self._ucxx
        higher = set(range(self.rank + 1, self.size))
        all_in = asyncio.Event()
        if not higher:
            all_in.set()

        async def accept(ep: Any) -> None:
            who = np.empty(1, dtype=np.int64)
            await ep.recv(who)
            self._eps[int(who[0])] = ep
            if higher <= self._eps.keys():
                all_in.set()

        self._listener = ucxx.create_listener(accept)
        rendezvous.publish(address_dir, self.rank, {"host": host, "port": self._listener.port})
        deadline = time.monotonic() + self.timeout
        for peer in range(self.rank):
            info = await self.peer_address(address_dir, peer, deadline)
            try:
                ep = await asyncio.wait_for(
                    ucxx.create_endpoint(info["host"], info["port"]),
                    max(deadline - time.monotonic(), 0.1))
            except Exception as exc:
                raise self.failure(peer, f"cannot connect to {{peer}} at "
                                         f"{info['host']}:{info['port']} ({exc})") from exc
            await ep.send(np.array([self.rank], dtype=np.int64))
            self._eps[peer] = ep
        try:
            await asyncio.wait_for(all_in.wait(), max(deadline - time.monotonic(), 0.1))
        except TimeoutError:
            missing = sorted(higher - self._eps.keys())
            raise self.failure(missing[0], f"timed out after {self.timeout:g} s waiting for "
                                           f"{{peer}} to connect") from None

    def exchange(self, send: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        return self._loop.run_until_complete(self._exchange(send))

    async def _exchange(self, send: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        async def put(peer: int, arr: np.ndarray) -> None:
            data = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            ep = self._eps[peer]
            await ep.send(np.array([data.nbytes], dtype=np.int64))
            if data.nbytes:
                await ep.send(data)

        async def get(peer: int) -> np.ndarray:
            ep = self._eps[peer]
            size = np.empty(1, dtype=np.int64)
            await ep.recv(size)
            if not 0 <= int(size[0]) <= MAX_MESSAGE_BYTES:
                raise self.failure(peer, f"{{peer}} announced a message of {int(size[0])} bytes")
            buf = np.empty(int(size[0]), dtype=np.uint8)
            if buf.nbytes:
                await ep.recv(buf)
            return buf

        gets: dict[asyncio.Future[Any], int] = {
            asyncio.ensure_future(get(p)): p for p in self.peers}
        tasks: dict[asyncio.Future[Any], int] = dict(gets)
        tasks.update({asyncio.ensure_future(put(p, send[p])): p for p in self.peers})
        done, pending = await asyncio.wait(tasks, timeout=self.timeout,
                                           return_when=asyncio.FIRST_EXCEPTION)
        self.raise_first_failure(tasks, done, pending)
        return {p: t.result() for t, p in gets.items()}

    def _transfer(self, sends: Mapping[int, Sequence[np.ndarray]],
                  recvs: Mapping[int, Sequence[np.ndarray]]) -> None:
        self._loop.run_until_complete(self._columns(sends, recvs))

    async def _columns(self, sends: Mapping[int, Sequence[np.ndarray]],
                       recvs: Mapping[int, Sequence[np.ndarray]]) -> None:
        async def put(peer: int) -> None:
            ep = self._eps[peer]
            for buf in sends[peer]:
                if buf.nbytes:
                    await ep.send(buf)

        async def get(peer: int) -> None:
            ep = self._eps[peer]
            for buf in recvs[peer]:
                if buf.nbytes:
                    await ep.recv(buf)

        tasks: dict[asyncio.Future[Any], int] = {
            asyncio.ensure_future(get(p)): p for p in self.peers}
        tasks.update({asyncio.ensure_future(put(p)): p for p in self.peers})
        done, pending = await asyncio.wait(tasks, timeout=self.timeout,
                                           return_when=asyncio.FIRST_EXCEPTION)
        self.raise_first_failure(tasks, done, pending)

    def close(self) -> None:
        async def shutdown() -> None:
            for ep in self._eps.values():
                with contextlib.suppress(Exception):
                    await ep.close()
            if self._listener is not None:
                self._listener.close()

        with contextlib.suppress(Exception):
            self._loop.run_until_complete(shutdown())
        self._eps.clear()
        self._listener = None
        self._loop.close()
        super().close()
