"""``python -m tunelab.cluster.nodeenv -- PROGRAM …``: run PROGRAM with this node's network
identity in its environment, for multi-node ``torchrun`` started by ``srun`` (one task per
node).

From ``TUNELAB_HEAD_ADDR`` (set by the job step: the address of the run's first node) it
finds the address and interface this node reaches the head through (a UDP socket's route,
no packet sent) and exports, unless already set:

* ``PET_RDZV_ENDPOINT=<head>:<port>`` — torchrun's c10d rendezvous on the first node;
* ``PET_LOCAL_ADDR=<this node's address>`` and ``PET_RDZV_CONF=is_host=1|0`` — so that nodes
  without DNS names (virtual nodes) still find each other;
* ``GLOO_SOCKET_IFNAME=<interface>`` — gloo's collectives on the same network.

Then it replaces itself with PROGRAM (``os.execvp``).
"""

from __future__ import annotations

import os
import socket
import sys

__all__ = ["main", "node_identity"]

RDZV_PORT = 29500


def node_identity(head: str) -> tuple[str, str | None]:
    """(this node's address towards ``head``, the interface that has it, or None)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((head, RDZV_PORT))  # picks the route; sends nothing
        address = str(s.getsockname()[0])
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addrs):
            return address, name
    return address, None


def main(argv: list[str] | None = None) -> int:
    """Set the variables and exec the program after ``--``."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m tunelab.cluster.nodeenv -- PROGRAM [ARGS…]", file=sys.stderr)
        return 2
    head = os.environ.get("TUNELAB_HEAD_ADDR")
    if head:
        address, interface = node_identity(head)
        os.environ.setdefault("PET_RDZV_ENDPOINT", f"{head}:{RDZV_PORT}")
        os.environ.setdefault("PET_LOCAL_ADDR", address)
        os.environ.setdefault("PET_RDZV_CONF", f"is_host={int(address == head)}")
        if interface is not None:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    os.execvp(args[0], args)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
