"""Where the nodes of a layout run: ``local`` (this host) or ``vnodes`` (virtual nodes).

A placement is a context manager yielding one :class:`NodeSlot` per node: the address its
processes use, an argv prefix that runs a command inside the node, and environment variables
for it (``GLOO_SOCKET_IFNAME``). Leaving the context removes whatever it created, on every
exit path.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field

from tunelab.bench.ddp.config import DDPConfig
from tunelab.errors import WorkloadError

__all__ = ["NodeSlot", "open_placement"]


@dataclass(frozen=True)
class NodeSlot:
    """One node of a layout."""

    index: int
    address: str
    prefix: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def free_port(self) -> int:
        """A TCP port free on this node's address (for the rendezvous on node 0)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((self.address, 0))
            return int(s.getsockname()[1])


@contextlib.contextmanager
def open_placement(cfg: DDPConfig) -> Iterator[list[NodeSlot]]:
    """The nodes of ``cfg``'s layout, created for the block and removed after it."""
    if cfg.placement == "local":
        yield [NodeSlot(i, "127.0.0.1") for i in range(cfg.nodes)]
        return
    raise WorkloadError("--placement vnodes: virtual nodes are not available in this build")
