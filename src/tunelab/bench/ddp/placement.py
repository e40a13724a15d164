"""Where the nodes of a layout run: ``local`` (this host) or ``vnodes`` (virtual nodes).

``vnodes`` stands on :mod:`tunelab.cluster.vnodes`: one network + UTS namespace per node,
a veth into a bridge, and with ``--link-gbit R`` a ``tc tbf`` limit of R Gbit/s on both
ends of every node's link; workers of one node talk over its loopback (unshaped), workers
of different nodes cross two shaped links. Sets are named ``ddpI`` (subnet ``10.<200+I>.0``,
the first free one), apart from the Slurm test cluster's ``tlI``. Root only.

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

__all__ = ["RENDEZVOUS_PORT", "VNODE_BASE", "NodeSlot", "check_vnodes", "open_placement"]

#: Prefix base of this benchmark's virtual-node sets (the Slurm test cluster uses ``tl``).
VNODE_BASE = "ddp"
#: Node 0's rendezvous port inside its fresh namespace (nothing else listens there).
RENDEZVOUS_PORT = 29500


@dataclass(frozen=True)
class NodeSlot:
    """One node of a layout."""

    index: int
    address: str
    prefix: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0

    def free_port(self) -> int:
        """A TCP port free on this node's address (for the rendezvous on node 0)."""
        if self.port:
            return self.port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((self.address, 0))
            return int(s.getsockname()[1])

    def rendezvous_port(self, requested: int) -> int:
        """``requested`` (``--port``) once it is free on this node's address, else a free
        one (0); :class:`WorkloadError` naming the port when another process holds it (the
        node's torchrun would fail to listen there). A node in a namespace of its own is
        fresh: nothing listens there."""
        if not requested:
            return self.free_port()
        if self.prefix:
            return requested
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no owner
            try:
                s.bind((self.address, requested))
            except OSError as exc:
                raise WorkloadError(
                    f"--port {requested}: {self.address}:{requested} cannot be bound "
                    f"({exc.strerror or exc}): another process holds it; choose another "
                    "port, or 0 for a free one") from None
        return requested


@contextlib.contextmanager
def open_placement(cfg: DDPConfig) -> Iterator[list[NodeSlot]]:
    """The nodes of ``cfg``'s layout, created for the block and removed after it."""
    if cfg.placement == "local":
        yield [NodeSlot(i, "127.0.0.1") for i in range(cfg.nodes)]
        return
    check_vnodes()
    from tunelab.cluster.vnodes import VirtualNodesError, allocate

    rate = f"{cfg.link_gbit:g}gbit" if cfg.link_gbit else None
    try:
        vn = allocate(cfg.nodes, base=VNODE_BASE, rate=rate)
    except VirtualNodesError as exc:
        raise WorkloadError(f"--placement vnodes: {exc}") from exc
    with vn:
        yield [NodeSlot(k - 1, vn.node(k).address, tuple(vn.argv(k, [])),
                        {"GLOO_SOCKET_IFNAME": "eth0"}, port=RENDEZVOUS_PORT)
               for k in range(1, cfg.nodes + 1)]


def check_vnodes() -> None:
    """Raise :class:`WorkloadError` saying why virtual nodes cannot run here (not root, a
    tool missing), or return."""
    from tunelab.cluster.vnodes import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        raise WorkloadError(f"--placement vnodes: {reason}")
