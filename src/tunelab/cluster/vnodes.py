"""Virtual nodes on one machine: network + UTS namespaces joined by veth pairs to a bridge.

Each node ``K`` (1-based) is a network namespace ``<prefix>nK`` with its own host name (a
persistent UTS namespace), a veth pair whose host end ``<prefix>hK`` is enslaved to the bridge
``<prefix>br``, and the address ``<subnet>.K/24`` (the bridge itself has ``<subnet>.254``, so
the root namespace — a Slurm controller, a test — reaches every node). An optional ``tc tbf``
rate limit shapes both ends of a node's link. Everything runs on this machine's file system
(no mount namespace), so a node sees the same files as the host. Needs root.

API summary (stable; the virtual Slurm cluster and the scale-out study build on it)::

    from tunelab.cluster.vnodes import VirtualNodes, allocate, unavailable_reason

    reason = unavailable_reason()            # None, or why virtual nodes cannot run here
    with allocate(2, rate="1gbit") as vn:    # free prefix/subnet (tl0/10.200.0, tl1/…); up()
        node = vn.node(1)                    # VNode: index, name (hostname), netns, address,
                                             #        host_link, netns_path, uts_path
        vn.argv(1, ["hostname"])             # ['nsenter', '--net=…', '--uts=…', '--', …]
        vn.run(1, ["ip", "-br", "addr"])     # subprocess.run inside node 1 (kwargs passed on)
        proc = vn.popen(2, [...])            # subprocess.Popen inside node 2
        vn.set_rate(2, "500mbit")            # or None to remove the limit
        vn.pids()                            # pids living in the nodes' namespaces
    # leaving the block (or vn.down()): processes left in the namespaces are killed, then the
    # namespaces, veths and bridge are deleted.

    VirtualNodes(n, prefix="tl0", subnet="10.200.0", hostnames=("node1", …), rate=None,
                 owner_pid=os.getpid(), origin=os.getcwd()).up()
    VirtualNodes.attach("tl0")               # the set a prefix made (another process)
    teardown("tl0")                          # remove whatever prefix tl0 left; safe to repeat
    reap_stale("tl")                         # tear down sets whose owner process has died

State (names, namespace inodes, owner pid) lives in ``/run/tunelab/vnodes/<prefix>/state.json``
so any process can tear a set down. Teardown order: SIGTERM then SIGKILL every process whose
network or UTS namespace is one of the set's (deleting a namespace does not kill what runs in
it), unmount the UTS namespace files, ``ip netns del``, delete the host veths and the bridge.
Every step ignores what is already gone, so teardown is safe to run twice.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunelab.cluster.nsprocs import alive, inode, kill_all, pids_in
from tunelab.errors import TunelabError

__all__ = [
    "MAX_NODES",
    "STATE_ROOT",
    "VNode",
    "VirtualNodes",
    "VirtualNodesError",
    "allocate",
    "iter_prefixes",
    "load_state",
    "reap_stale",
    "teardown",
    "unavailable_reason",
]

#: Where every set of virtual nodes records its state (tmpfs: gone after a reboot, as are
#: the namespaces themselves).
STATE_ROOT = Path("/run/tunelab/vnodes")
MAX_NODES = 64
_PREFIX = re.compile(r"[a-z][a-z0-9]{0,7}")  # interface names are at most 15 characters
_HOSTNAME = re.compile(r"[a-z][a-z0-9-]{0,30}")
_RATE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)")
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_NETNS_DIR = Path("/run/netns")
_TOOLS = ("ip", "nsenter", "unshare", "tc")


class VirtualNodesError(TunelabError):
    """Virtual nodes cannot be made or used here (not root, a tool missing, a name in use)."""


@dataclass(frozen=True)
class VNode:
    """One virtual node: its 1-based index, host name, namespace, address and host link."""

    index: int
    name: str
    netns: str
    address: str
    host_link: str
    uts_path: Path

    @property
    def netns_path(self) -> Path:
        """The bind-mounted network namespace (``/run/netns/<netns>``)."""
        return _NETNS_DIR / self.netns


def unavailable_reason() -> str | None:
    """Why virtual nodes cannot be made on this machine, or None when they can."""
    if os.geteuid() != 0:
        return "virtual nodes need root (network namespaces, veth pairs, a bridge)"
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        return (f"virtual nodes need {', '.join(missing)} (Debian packages iproute2, "
                "util-linux)")
    probe = subprocess.run(["unshare", "--net", "--uts", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["unknown reason"])[-1]
        return f"cannot create namespaces here: {why}"
    return None


def tbf_burst_bytes(bits_per_s: int) -> int:
    """The token bucket a link limit of ``bits_per_s`` allows at once: at least one 4 ms
    tick at HZ 250, so a full bucket passes that many bytes faster than the rate."""
    return max(256 * 1024, bits_per_s // 8 // 250)


def parse_rate(rate: str) -> int:
    """Bits per second of a tc rate such as ``1gbit`` or ``500mbit``."""
    match = _RATE.fullmatch(rate.strip().lower())
    if match is None:
        raise VirtualNodesError(f"rate {rate!r} is not a tc rate such as 100mbit or 1gbit")
    bits = float(match.group(1)) * _RATE_UNITS[match.group(2)]
    if bits < 8_000:
        raise VirtualNodesError(f"rate {rate!r} is below 8kbit")
    return int(bits)


class VirtualNodes:
    """A set of ``n`` virtual nodes named by ``prefix`` on the subnet ``<subnet>.0/24``.

    ``up()`` makes them (refusing a prefix or subnet already in use); ``down()`` removes
    them and everything still running inside. As a context manager it brings the set up on
    entry and down on every exit path. ``owner_pid`` (default: none) marks the set as
    belonging to a live process, so :func:`reap_stale` removes it once that process died;
    ``origin`` (default: the working directory) records who made it, so that tools remove
    only their own sets.
    """

    def __init__(self, n: int, *, prefix: str = "tl0", subnet: str = "10.200.0",
                 hostnames: Sequence[str] | None = None, rate: str | None = None,
                 owner_pid: int | None = None, origin: str | None = None) -> None:
        if not 1 <= n <= MAX_NODES:
            raise VirtualNodesError(f"number of virtual nodes must be 1 to {MAX_NODES}, got {n}")
        if not _PREFIX.fullmatch(prefix):
            raise VirtualNodesError(
                f"prefix {prefix!r} must be a lower-case letter then up to 7 letters or digits")
        _check_subnet(subnet)
        names = list(hostnames) if hostnames is not None else [f"node{k}" for k in
                                                                  range(1, n + 1)]
        if len(names) != n or len(set(names)) != n:
            raise VirtualNodesError(f"need {n} distinct host names, got {names}")
        for name in names:
            if not _HOSTNAME.fullmatch(name):
                raise VirtualNodesError(f"host name {name!r} is not a simple lower-case name")
        if rate is not None:
            parse_rate(rate)
        self.prefix = prefix
        self.subnet = subnet
        self.rate = rate
        self.owner_pid = owner_pid
        self.origin = origin if origin is not None else os.getcwd()
        self.is_up = False
        self.state_dir = STATE_ROOT / prefix
        self.bridge = f"{prefix}br"
        self.bridge_address = f"{subnet}.254"
        self.nodes = [
            VNode(k, names[k - 1], f"{prefix}n{k}", f"{subnet}.{k}", f"{prefix}h{k}",
                  self.state_dir / "uts" / names[k - 1])
            for k in range(1, n + 1)
        ]

    # ----------------------------------------------------------------------- life cycle

    def __enter__(self) -> VirtualNodes:
        if not self.is_up:
            self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> VirtualNodes:
        """Create the bridge, the nodes, their links and host names (all or nothing)."""
        reason = unavailable_reason()
        if reason is not None:
            raise VirtualNodesError(reason)
        if _link_exists(self.bridge) or (self.state_dir / "state.json").exists():
            raise VirtualNodesError(
                f"virtual nodes with prefix {self.prefix!r} exist already; remove them with "
                f"scripts/virtual-cluster.sh down --prefix {self.prefix}, or use another prefix")
        if _subnet_in_use(self.subnet):
            raise VirtualNodesError(f"subnet {self.subnet}.0/24 is in use on this machine; "
                                    "choose another subnet")
        self._claim()  # not inside the try: a set another session claimed is not ours to remove
        try:
            self._make()
        except BaseException:
            self.down()
            raise
        self.is_up = True
        return self

    def _claim(self) -> None:
        """Make the state directory with its ``state.json`` in one step: built under a
        temporary name, then renamed. A concurrent :func:`reap_stale` never sees the
        directory without the state (which it would take for a dead set and tear down),
        and of two sessions claiming one prefix exactly one wins."""
        STATE_ROOT.mkdir(parents=True, exist_ok=True)
        tmp = STATE_ROOT / f".{self.prefix}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "uts").mkdir(parents=True)
        self._save_state(tmp)
        try:
            os.rename(tmp, self.state_dir)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise VirtualNodesError(f"virtual nodes with prefix {self.prefix!r} exist already "
                                    "(another session claimed them)") from None

    def _make(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for node in self.nodes:
            _ip("netns", "add", node.netns)
            _ip("link", "add", node.host_link, "type", "veth", "peer", "name", "eth0",
                "netns", node.netns)
            _ip("link", "set", node.host_link, "master", self.bridge)
            _ip("link", "set", node.host_link, "up")
            _ip("-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
            _ip("-n", node.netns, "link", "set", "eth0", "up")
            _ip("-n", node.netns, "link", "set", "lo", "up")
            node.uts_path.touch()
            _run(["unshare", f"--uts={node.uts_path}", "hostname", node.name])
            if self.rate is not None:
                self.set_rate(node.index, self.rate)
        self._save_state()

    def _save_state(self, directory: Path | None = None) -> None:
        directory = directory or self.state_dir
        state = {
            "prefix": self.prefix, "subnet": self.subnet, "rate": self.rate,
            "owner_pid": self.owner_pid, "origin": self.origin, "bridge": self.bridge,
            "nodes": [{"index": n.index, "name": n.name, "netns": n.netns,
                       "host_link": n.host_link, "address": n.address,
                       "netns_inode": inode(n.netns_path), "uts_inode": inode(n.uts_path)}
                      for n in self.nodes],
        }
        tmp = directory / "state.json.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(directory / "state.json")

    def down(self) -> None:
        """Kill what runs inside the nodes, then delete namespaces, links and the bridge."""
        teardown(self.prefix)
        self.is_up = False

    @classmethod
    def attach(cls, prefix: str) -> VirtualNodes:
        """The set of virtual nodes that ``prefix`` names (made by any process)."""
        state = load_state(prefix)
        if state is None:
            raise VirtualNodesError(f"no virtual nodes with prefix {prefix!r} on this machine")
        nodes = state["nodes"]
        vn = cls(len(nodes), prefix=prefix, subnet=state["subnet"],
                 hostnames=[n["name"] for n in nodes], rate=state.get("rate"),
                 owner_pid=state.get("owner_pid"), origin=state.get("origin", ""))
        vn.is_up = True
        return vn

    # -------------------------------------------------------------------------- use

    def node(self, k: int) -> VNode:
        """Node ``k`` (1-based)."""
        if not 1 <= k <= len(self.nodes):
            raise VirtualNodesError(f"no virtual node {k}; nodes are 1 to {len(self.nodes)}")
        return self.nodes[k - 1]

    def argv(self, k: int, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed so that it runs inside node ``k``'s network and UTS namespaces
        (``nsenter``, not ``ip netns exec``: no new mount namespace, so daemons that need
        ``/sys/fs/cgroup`` such as slurmd start)."""
        node = self.node(k)
        return ["nsenter", f"--net={node.netns_path}", f"--uts={node.uts_path}", "--",
                *argv]

    def run(self, k: int, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run`` of ``argv`` inside node ``k``."""
        return subprocess.run(self.argv(k, argv), **kwargs)

    def popen(self, k: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen`` of ``argv`` inside node ``k``."""
        return subprocess.Popen(self.argv(k, argv), **kwargs)

    def set_rate(self, k: int, rate: str | None) -> None:
        """Limit node ``k``'s link to ``rate`` in both directions (``tc tbf``), or remove
        the limit with None."""
        node = self.node(k)
        if rate is None:
            for prefix in ([], ["-n", node.netns]):
                dev = node.host_link if not prefix else "eth0"
                subprocess.run(["tc", *prefix, "qdisc", "del", "dev", dev, "root"],
                               capture_output=True)
            return
        bits = parse_rate(rate)
        burst = tbf_burst_bytes(bits)
        for prefix, dev in (([], node.host_link), (["-n", node.netns], "eth0")):
            _run(["tc", *prefix, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                  f"{bits}bit", "burst", str(burst), "latency", "10ms"])

    def pids(self) -> list[int]:
        """Processes running inside the nodes' network or UTS namespaces."""
        state = load_state(self.prefix)
        return pids_in(_namespace_inodes(state)) if state else []


def allocate(n: int, *, base: str = "tl", rate: str | None = None,
             hostnames: Sequence[str] | None = None, owner: bool = True) -> VirtualNodes:
    """A set of ``n`` virtual nodes on the first free prefix ``<base>I`` and subnet
    ``10.<200+I>.0`` (I = 0…49), brought up. Sets of the same base whose owner process died
    are torn down first. With ``owner`` the set belongs to this process."""
    reap_stale(base)
    last: VirtualNodesError | None = None
    for i in range(50):
        prefix, subnet = f"{base}{i}", f"10.{200 + i}.0"
        if _link_exists(f"{prefix}br") or (STATE_ROOT / prefix).exists() or \
                _subnet_in_use(subnet):
            continue
        vn = VirtualNodes(n, prefix=prefix, subnet=subnet, rate=rate, hostnames=hostnames,
                          owner_pid=os.getpid() if owner else None)
        try:
            return vn.up()
        except VirtualNodesError as exc:  # lost a race with another session: try the next
            last = exc
    raise VirtualNodesError(f"no free prefix/subnet for virtual nodes ({last or 'all in use'})")


def teardown(prefix: str) -> None:
    """Remove everything the virtual nodes of ``prefix`` left; safe to run twice."""
    if not _PREFIX.fullmatch(prefix):
        raise VirtualNodesError(f"prefix {prefix!r} is not a virtual-node prefix")
    state = load_state(prefix)
    inodes = _namespace_inodes(state) if state else set()
    netns = {f"{prefix}n{k}" for k in range(1, MAX_NODES + 1)}
    present = [ns for ns in _netns_list() if ns in netns]
    inodes |= {i for ns in present if (i := inode(_NETNS_DIR / ns))}
    kill_all(inodes)
    state_dir = STATE_ROOT / prefix
    uts_dir = state_dir / "uts"
    if uts_dir.is_dir():
        for path in uts_dir.iterdir():
            subprocess.run(["umount", str(path)], capture_output=True)
    for ns in present:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    for link in _links():
        if re.fullmatch(rf"{prefix}h\d+", link):
            subprocess.run(["ip", "link", "del", link], capture_output=True)
    if _link_exists(f"{prefix}br"):
        subprocess.run(["ip", "link", "del", f"{prefix}br"], capture_output=True)
    shutil.rmtree(state_dir, ignore_errors=True)


def reap_stale(base: str = "tl") -> list[str]:
    """Tear down the sets named ``<base>I`` whose owner process has died; their prefixes."""
    reaped: list[str] = []
    if not STATE_ROOT.is_dir():
        return reaped
    for path in sorted(STATE_ROOT.iterdir()):
        if not re.fullmatch(rf"{re.escape(base)}\d+", path.name):
            continue
        state = load_state(path.name)
        owner = state.get("owner_pid") if state else None
        if state is None or (owner is not None and not alive(int(owner))):
            teardown(path.name)
            reaped.append(path.name)
    return reaped


# --------------------------------------------------------------------------- helpers


def _check_subnet(subnet: str) -> None:
    try:
        net = ipaddress.ip_network(f"{subnet}.0/24")
    except ValueError:
        raise VirtualNodesError(f"subnet {subnet!r} must be three octets such as 10.200.0") \
            from None
    if not net.is_private:
        raise VirtualNodesError(f"subnet {subnet}.0/24 is not a private network")


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise VirtualNodesError(f"{' '.join(argv)}: {why}")


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()
            if line.count(":") >= 2]


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def _subnet_in_use(subnet: str) -> bool:
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True,
                         text=True).stdout
    net = ipaddress.ip_network(f"{subnet}.0/24")
    for match in re.finditer(r"inet (\S+)", out):
        if ipaddress.ip_interface(match.group(1)).network.overlaps(net):
            return True
    return False


def _netns_list() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def load_state(prefix: str) -> dict[str, Any] | None:
    """The recorded state of the set ``prefix`` (names, inodes, owner pid), or None."""
    try:
        data = json.loads((STATE_ROOT / prefix / "state.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _namespace_inodes(state: Mapping[str, Any]) -> set[int]:
    inodes = set()
    for node in state.get("nodes", []):
        for key in ("netns_inode", "uts_inode"):
            if isinstance(node.get(key), int):
                inodes.add(node[key])
    return inodes


def iter_prefixes() -> Iterator[str]:
    """Prefixes of every set of virtual nodes with state on this machine."""
    if STATE_ROOT.is_dir():
        for path in sorted(STATE_ROOT.iterdir()):
            if (path / "state.json").exists():
                yield path.name
