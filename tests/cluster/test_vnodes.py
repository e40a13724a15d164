"""Virtual nodes: real network + UTS namespaces, veth pairs, a bridge, tc rate limits."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tunelab.cluster.vnodes import (
    STATE_ROOT,
    VirtualNodes,
    VirtualNodesError,
    allocate,
    parse_rate,
    teardown,
)

# A one-shot TCP echo: a server in one node, a client in another, bytes timed on the client.
SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5599)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0
while (b := c.recv(1 << 20)):
    n += len(b)
c.sendall(str(n).encode()); c.close()
"""
CLIENT = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], 5599)); n = int(sys.argv[2]); t = time.perf_counter()
buf = b"x" * (1 << 20)
for _ in range(n // len(buf)):
    c.sendall(buf)
c.shutdown(socket.SHUT_WR); got = int(c.recv(64)); dt = time.perf_counter() - t
print(got, got * 8 / dt)
"""


def _transfer(vn: VirtualNodes, nbytes: int) -> tuple[int, float]:
    server = vn.popen(2, [sys.executable, "-c", SERVER, vn.node(2).address],
                      stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        out = vn.run(1, [sys.executable, "-c", CLIENT, vn.node(2).address, str(nbytes)],
                     capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        got, bps = out.stdout.split()
        return int(got), float(bps)
    finally:
        server.kill()
        server.wait()


def test_nodes_have_own_names_addresses_and_reach_each_other(vnodes_factory):
    vn = vnodes_factory(2)
    for node in vn.nodes:
        name = vn.run(node.index, ["hostname"], capture_output=True, text=True).stdout.strip()
        assert name == node.name
        addrs = vn.run(node.index, ["ip", "-br", "-4", "addr"], capture_output=True,
                       text=True).stdout
        assert f"{node.address}/24" in addrs
    assert subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip() != "node1"
    got, _ = _transfer(vn, 8 << 20)
    assert got == 8 << 20  # every byte crossed from node 1 to node 2


def test_rate_limit_shapes_the_link(vnodes_factory):
    vn = vnodes_factory(2, rate="200mbit")
    _, limited = _transfer(vn, 12 << 20)
    assert limited < 200e6 * 1.3  # never faster than the limit allows (plus the burst)
    vn.set_rate(1, None)
    vn.set_rate(2, None)
    qdiscs = subprocess.run(["tc", "qdisc", "show", "dev", vn.node(1).host_link],
                            capture_output=True, text=True).stdout
    assert "tbf" not in qdiscs


def test_teardown_kills_processes_and_removes_everything_twice(vnodes_factory):
    vn = vnodes_factory(2)
    sleeper = vn.popen(1, ["sleep", "300"])
    orphan = vn.run(2, ["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 & echo $!"],
                    capture_output=True, text=True).stdout.strip()
    time.sleep(0.2)
    assert sleeper.pid in vn.pids() and int(orphan) in vn.pids()
    vn.down()
    assert sleeper.wait(timeout=10) is not None
    stat = Path(f"/proc/{orphan}/stat")
    assert not stat.exists() or ") Z" in stat.read_text()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert vn.node(1).netns not in netns
    assert subprocess.run(["ip", "link", "show", vn.bridge], capture_output=True).returncode
    assert not (STATE_ROOT / vn.prefix).exists()
    teardown(vn.prefix)  # safe to run again


def test_two_sets_get_distinct_prefixes_and_subnets(vnodes_factory):
    a, b = vnodes_factory(1), vnodes_factory(1)
    assert a.prefix != b.prefix and a.subnet != b.subnet
    with pytest.raises(VirtualNodesError, match="exist already"):
        VirtualNodes(1, prefix=a.prefix, subnet="10.250.0").up()
    with pytest.raises(VirtualNodesError, match="in use"):
        VirtualNodes(1, prefix="tlx", subnet=a.subnet).up()


def test_a_dead_owner_s_nodes_are_reaped(vnodes_factory):
    code = ("from tunelab.cluster.vnodes import allocate\n"
            "vn = allocate(1, base='tlr')\nprint(vn.prefix, flush=True)\n"
            "import os; os._exit(0)\n")  # dies without tearing down
    prefix = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert (STATE_ROOT / prefix).exists()
    vn = allocate(1, base="tlr")  # reaps the dead owner's set first
    try:
        assert vn.prefix == prefix
    finally:
        vn.down()


def test_a_set_being_made_is_never_reaped_and_one_claim_wins(vnodes_factory):
    """The state directory appears with its state.json in one rename: a concurrent
    reap_stale (another session's allocate) sees a live owner, never a stateless directory
    it would take for a dead set; of two claims on one prefix the second fails and leaves
    the first's state alone."""
    from tunelab.cluster.vnodes import load_state, reap_stale

    vn = VirtualNodes(1, prefix="tlc0", subnet="10.249.0", owner_pid=os.getpid())
    try:
        vn._claim()  # what up() does before making any link
        state = load_state("tlc0")
        assert state is not None and state["owner_pid"] == os.getpid()
        assert reap_stale("tlc") == [] and (STATE_ROOT / "tlc0" / "state.json").exists()
        with pytest.raises(VirtualNodesError, match="another session claimed them"):
            VirtualNodes(1, prefix="tlc0", subnet="10.248.0")._claim()
        assert load_state("tlc0") == state
        assert not list(STATE_ROOT.glob(".tlc0.*"))
    finally:
        teardown("tlc0")
    assert not (STATE_ROOT / "tlc0").exists()


@pytest.mark.parametrize("bad", [dict(n=0), dict(n=1, prefix="Bad-Prefix"),
                                 dict(n=1, subnet="8.8.8"), dict(n=1, rate="fast"),
                                 dict(n=2, hostnames=["a", "a"])])
def test_bad_arguments_are_one_line_errors(bad):
    n = bad.pop("n")
    with pytest.raises(VirtualNodesError) as info:
        VirtualNodes(n, **bad)
    assert "\n" not in str(info.value)


def test_rates_parse():
    assert parse_rate("1gbit") == 10**9 and parse_rate("2.5mbit") == 2_500_000


def test_not_root_gives_the_reason():
    if os.geteuid() != 0:
        pytest.skip("already not root")
    code = "from tunelab.cluster.vnodes import unavailable_reason; print(unavailable_reason())"
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                          sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    if out.returncode != 0:
        pytest.skip(f"cannot run Python as nobody here: {out.stderr.strip()[-200:]}")
    assert "need root" in out.stdout
