"""The DDP launcher's failures that need no training: a rendezvous port another process
holds, and a torchrun that fails before any worker starts."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import env_with_pythonpath
from tunelab.bench.ddp.launch import _last_error
from tunelab.bench.ddp.placement import NodeSlot
from tunelab.errors import WorkloadError

TORCHRUN_TAIL = """\
  File ".../torch/distributed/elastic/rendezvous/static_tcp_rendezvous.py", line 67, in next
    self._store = TCPStore(  # type: ignore[call-arg]
torch.distributed.DistNetworkError: The server socket has failed to listen on any local \
network address. port: 29555, useIpv6: false, code: -98, name: EADDRINUSE, message: address \
already in use
"""


def test_a_port_another_process_holds_is_refused_naming_it() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(WorkloadError, match=f"--port {port}: 127.0.0.1:{port} cannot be "
                                                "bound .*another process holds it"):
            NodeSlot(0, "127.0.0.1").rendezvous_port(port)
    assert NodeSlot(0, "127.0.0.1").rendezvous_port(port) == port  # free again
    # a virtual node's namespace is fresh: its port is not checked from here
    assert NodeSlot(0, "10.200.0.1", ("ip", "netns", "exec", "x")).rendezvous_port(7) == 7


def test_the_cli_refuses_a_busy_port_in_one_line() -> None:
    # field test: "ddp: the torchrun of node 0 exited with status 1", exit 4, the reason
    # (EADDRINUSE) only in ddp-failure.log
    pytest.importorskip("torch")
    env = env_with_pythonpath(Path(__file__).resolve().parents[2] / "src")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "tunelab.bench.ddp", "--model", "leopard", "-n", "2",
             "-b", "2", "--steps", "1", "--device", "cpu", "--port", str(port)],
            capture_output=True, text=True, timeout=120, env=env, cwd=tempfile.gettempdir())
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (f"ddp: error: --port {port}: 127.0.0.1:{port} cannot be "
                                   "bound (Address already in use): another process holds "
                                   "it; choose another port, or 0 for a free one")


def test_a_torchrun_that_failed_alone_is_named_with_its_error() -> None:
    assert _last_error(TORCHRUN_TAIL) == (
        "DistNetworkError: The server socket has failed to listen on any local network "
        "address. port: 29555, useIpv6: false, code: -98, name: EADDRINUSE, message: "
        "address already in use")
    assert _last_error("no error here\n") == ""
