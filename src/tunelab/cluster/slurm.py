"""A real Slurm cluster on virtual nodes: munge, ``slurmctld`` and one ``slurmd`` per node.

The controller runs in the root network namespace on the bridge address; each ``slurmd``
runs inside its node's namespaces (see :mod:`tunelab.cluster.vnodes`), so jobs that span two
nodes really cross a veth. Every client (``sbatch``, ``squeue``, ``qsub``) finds the cluster
through ``SLURM_CONF`` (:attr:`VirtualSlurm.env`). Needs root and the Debian packages
``slurm-wlm`` and ``munge`` (``slurm-wlm-torque`` for the PBS-style wrappers)::

    from tunelab.cluster.slurm import VirtualCluster

    with VirtualCluster.start(2) as cluster:            # nodes up, daemons up, nodes idle
        cluster.env                                     # {"SLURM_CONF": ...}
        cluster.slurm.run(["sbatch", "--wrap", "hostname"])
        cluster.slurm.kill_slurmd(2)                    # a node failure
        cluster.slurm.restart_slurmd(2)                 # and back
    # every daemon, job process, namespace and link is gone here

State lives in ``/run/tunelab/slurm/<prefix>/`` (config, munge key and socket, pid files,
logs, spool); ``VirtualCluster.attach(prefix)`` finds a cluster another process started
(``scripts/virtual-cluster.sh``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunelab.cluster.nsprocs import alive
from tunelab.cluster.vnodes import VirtualNodes, VirtualNodesError, allocate, unavailable_reason

__all__ = ["SLURM_ROOT", "VirtualCluster", "VirtualSlurm", "slurm_unavailable_reason"]

SLURM_ROOT = Path("/run/tunelab/slurm")
_DAEMONS = ("munged", "slurmctld", "slurmd")
_CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")


def slurm_unavailable_reason() -> str | None:
    """Why a virtual Slurm cluster cannot start here, or None when it can."""
    reason = unavailable_reason()
    if reason is not None:
        return reason
    missing = [t for t in (*_DAEMONS, *_CLIENTS, "mungekey") if shutil.which(t) is None]
    if missing:
        return (f"a virtual Slurm cluster needs {', '.join(missing)} (Debian packages slurm-wlm "
                "and munge; scripts/setup.sh installs them)")
    return None


@dataclass(frozen=True)
class PartitionLimits:
    """The partitions' time limit; with ``allow_accounts`` a second partition
    ``restricted`` that only those accounts may use (Slurm without accounting refuses every
    account there with "Invalid account or account/partition combination specified")."""

    max_time: str = "1:00:00"
    allow_accounts: tuple[str, ...] = ()


class VirtualSlurm:
    """The Slurm daemons of a set of virtual nodes (``cpus`` and ``memory_mb`` per node)."""

    def __init__(self, nodes: VirtualNodes, *, cpus: int = 2, memory_mb: int = 2000,
                 partition: str = "debug", limits: PartitionLimits | None = None,
                 slurmd_timeout_s: int = 20) -> None:
        self.nodes = nodes
        self.cpus = cpus
        self.memory_mb = memory_mb
        self.partition = partition
        self.limits = limits or PartitionLimits()
        self.slurmd_timeout_s = slurmd_timeout_s
        self.root = SLURM_ROOT / nodes.prefix
        self.conf = self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client needs to find this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def client_env(self) -> dict[str, str]:
        """This process's environment plus :attr:`env` (for subprocess calls)."""
        return {**os.environ, **self.env}

    def run(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client (``sbatch``, ``squeue``…) against this cluster."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 60)
        return subprocess.run(list(argv), env=self.client_env(), **kwargs)

    # ----------------------------------------------------------------------- life cycle

    def up(self, timeout_s: float = 60.0) -> VirtualSlurm:
        """Write the configuration, start munged, slurmctld and every slurmd; wait until
        every node is idle."""
        reason = slurm_unavailable_reason()
        if reason is not None:
            raise VirtualNodesError(reason)
        try:
            self._start(timeout_s)
        except BaseException:
            self.down()
            raise
        return self

    def _start(self, timeout_s: float) -> None:
        for sub in ("log", "run", "state", "spool", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        key = self.root / "munge.key"
        if not key.exists():
            _check(["mungekey", "-c", "-k", str(key)])
        _check(["munged", "--force", f"--socket={self.root / 'munge.socket'}",
                f"--key-file={key}", f"--pid-file={self.root / 'run' / 'munged.pid'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
                f"--seed-file={self.root / 'munge.seed'}"])
        self.conf.write_text(self.render_conf(_free_port()))
        _check(["slurmctld", "-f", str(self.conf)], env=self.client_env())
        self._wait(lambda: self.run(["scontrol", "ping"]).stdout.count("UP") > 0,
                   timeout_s, "slurmctld did not answer")
        for node in self.nodes.nodes:
            self._start_slurmd(node.index)
        self.wait_idle(timeout_s)

    def _start_slurmd(self, k: int) -> None:
        node = self.nodes.node(k)
        tmp = self.root / "tmp" / node.name
        tmp.mkdir(parents=True, exist_ok=True)
        tmp.chmod(0o1777)
        (self.root / "spool" / node.name).mkdir(parents=True, exist_ok=True)
        _check(self.nodes.argv(k, ["slurmd", "-f", str(self.conf), "-N", node.name]),
               env=self.client_env())

    def wait_idle(self, timeout_s: float = 60.0) -> None:
        """Wait until every node reports idle (or mixed/allocated: up and usable)."""
        want = {n.name for n in self.nodes.nodes}

        def ready() -> bool:
            out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout
            states = dict(line.split() for line in out.splitlines() if line.strip())
            return all(states.get(n, "").rstrip("*") in ("idle", "mix", "alloc")
                       for n in want)

        self._wait(ready, timeout_s, "the nodes did not become idle")

    def _wait(self, ok: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(subprocess.SubprocessError, ValueError):
                if ok():
                    return
            time.sleep(0.2)
        log = self.root / "log" / "slurmctld.log"
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
        raise VirtualNodesError(f"virtual Slurm: {what} within {timeout_s:g} s"
                                + (f" (slurmctld.log: {tail[0]})" if tail else ""))

    def down(self) -> None:
        """Stop every slurmd, slurmctld and munged (by pid file); safe to run twice."""
        pids = [self.root / "run" / f"slurmd-{n.name}.pid" for n in self.nodes.nodes]
        pids += [self.root / "run" / "slurmctld.pid", self.root / "run" / "munged.pid"]
        stopped = [pid for path in pids if (pid := _signal_pidfile(path, signal.SIGTERM))]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(alive(p) for p in stopped):
            time.sleep(0.05)
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    # ---------------------------------------------------------------------- faults

    def slurmd_pid(self, k: int) -> int | None:
        """The pid of node ``k``'s slurmd, if it runs."""
        return _pid_of(self.root / "run" / f"slurmd-{self.nodes.node(k).name}.pid", "slurmd")

    def kill_slurmd(self, k: int) -> None:
        """SIGKILL node ``k``'s slurmd (a node failure; its jobs' steps keep running)."""
        _signal_pidfile(self.root / "run" / f"slurmd-{self.nodes.node(k).name}.pid",
                        signal.SIGKILL)

    def kill_slurmctld(self) -> None:
        """SIGKILL the controller (its jobs and steps keep running on the nodes)."""
        _signal_pidfile(self.root / "run" / "slurmctld.pid", signal.SIGKILL)

    def restart_slurmctld(self, timeout_s: float = 60.0) -> None:
        """Start the controller again (it recovers its jobs from its state directory)."""
        pid = _pid_of(self.root / "run" / "slurmctld.pid")
        if pid is None or _zombie(pid):  # a killed daemon's parent may not have reaped it
            _check(["slurmctld", "-f", str(self.conf)], env=self.client_env())
        self._wait(lambda: self.run(["scontrol", "ping"]).stdout.count("UP") > 0,
                   timeout_s, "slurmctld did not answer")

    def restart_slurmd(self, k: int, timeout_s: float = 60.0) -> None:
        """Start node ``k``'s slurmd again and return the node to service."""
        if self.slurmd_pid(k) is None:
            self._start_slurmd(k)
        name = self.nodes.node(k).name
        self.run(["scontrol", "update", f"nodename={name}", "state=resume"])
        self.wait_idle(timeout_s)

    # ---------------------------------------------------------------------- config

    def render_conf(self, ctld_port: int) -> str:
        """The ``slurm.conf`` of this cluster (see the machine recipes for why each line)."""
        r = self.root
        lines = [
            f"ClusterName={self.nodes.prefix}",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}({self.nodes.bridge_address})",
            f"SlurmctldPort={ctld_port}",
            "SlurmdPort=6818",
            "SlurmUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={r / 'munge.socket'}",
            "CredType=cred/munge",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}/%n",
            f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'run'}/slurmd-%n.pid",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log'}/slurmd-%n.log",
            f"TmpFS={r / 'tmp'}/%n",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "ReturnToService=2",
            "EnforcePartLimits=ALL",
            "SlurmdParameters=config_overrides",
            "SchedulerParameters=batch_sched_delay=0",
            "MinJobAge=300",
            f"SlurmdTimeout={self.slurmd_timeout_s}",
            "KillWait=5",
            "InactiveLimit=0",
        ]
        for node in self.nodes.nodes:
            lines.append(f"NodeName={node.name} NodeAddr={node.address} CPUs={self.cpus} "
                         f"RealMemory={self.memory_mb} State=UNKNOWN")
        lines.append(f"PartitionName={self.partition} Nodes=ALL Default=YES "
                     f"MaxTime={self.limits.max_time} State=UP")
        if self.limits.allow_accounts:  # without accounting, any other account is invalid
            lines.append(f"PartitionName=restricted Nodes=ALL MaxTime={self.limits.max_time} "
                         f"State=UP AllowAccounts={','.join(self.limits.allow_accounts)}")
        return "\n".join(lines) + "\n"


class VirtualCluster:
    """Virtual nodes plus the Slurm daemons on them; a context manager that tears both down
    (daemons first, then the nodes and anything left running inside them)."""

    def __init__(self, nodes: VirtualNodes, slurm: VirtualSlurm) -> None:
        self.nodes = nodes
        self.slurm = slurm

    @classmethod
    def start(cls, n: int, *, rate: str | None = None, cpus: int = 2, memory_mb: int = 2000,
              limits: PartitionLimits | None = None, slurmd_timeout_s: int = 20,
              base: str = "tl", owner: bool = True) -> VirtualCluster:
        """``n`` virtual nodes on a free prefix, with Slurm running on them."""
        reason = slurm_unavailable_reason()
        if reason is not None:
            raise VirtualNodesError(reason)
        _reap_stale_slurm(base)
        nodes = allocate(n, base=base, rate=rate, owner=owner)
        slurm = VirtualSlurm(nodes, cpus=cpus, memory_mb=memory_mb, limits=limits,
                             slurmd_timeout_s=slurmd_timeout_s)
        try:
            slurm.up()
        except BaseException:
            nodes.down()
            raise
        return cls(nodes, slurm)

    @classmethod
    def attach(cls, prefix: str) -> VirtualCluster:
        """The cluster another process started on the virtual nodes of ``prefix``."""
        nodes = VirtualNodes.attach(prefix)
        return cls(nodes, VirtualSlurm(nodes))

    @property
    def env(self) -> dict[str, str]:
        """``SLURM_CONF`` of the cluster."""
        return self.slurm.env

    def __enter__(self) -> VirtualCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def down(self) -> None:
        """Stop the daemons, kill what is left in the nodes, remove nodes and state."""
        try:
            self.slurm.down()
        finally:
            self.nodes.down()
            shutil.rmtree(self.slurm.root, ignore_errors=True)


def teardown_cluster(prefix: str) -> None:
    """Stop the Slurm daemons of ``prefix`` (if any) and remove its virtual nodes."""
    from tunelab.cluster.vnodes import teardown

    root = SLURM_ROOT / prefix
    if root.is_dir():
        for path in sorted((root / "run").glob("*.pid")):
            _signal_pidfile(path, signal.SIGKILL)
    teardown(prefix)
    shutil.rmtree(root, ignore_errors=True)


def _reap_stale_slurm(base: str) -> None:
    """Stop the daemons of clusters named ``<base>I`` whose virtual nodes are gone (their
    owner died)."""
    import re

    from tunelab.cluster.vnodes import STATE_ROOT, reap_stale

    reap_stale(base)
    if SLURM_ROOT.is_dir():
        for root in SLURM_ROOT.iterdir():
            if re.fullmatch(rf"{re.escape(base)}\d+", root.name) and \
                    not (STATE_ROOT / root.name).exists():
                teardown_cluster(root.name)


# --------------------------------------------------------------------------- helpers


def _check(argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
    proc = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=60)
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise VirtualNodesError(f"virtual Slurm: {argv[0]} failed: {why}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _pid_of(path: Path, comm: str | None = None) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    expected = comm or path.name.split("-")[0].split(".")[0]
    return pid if name == expected else None


def _zombie(pid: int) -> bool:
    """True when process ``pid`` has ended and waits to be reaped (state Z)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2][:1] == "Z"
    except OSError:
        return False


def _signal_pidfile(path: Path, sig: int) -> int | None:
    pid = _pid_of(path)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return pid
