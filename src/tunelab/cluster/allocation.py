"""The nodes of the batch allocation a process runs in (Slurm or PBS).

Read from ``PBS_NODEFILE`` (PBS; one line per slot) or ``SLURM_JOB_NODELIST`` (Slurm, and
Slurm's PBS-style wrappers, which set no ``PBS_NODEFILE``), expanded with ``scontrol show
hostnames``. Outside an allocation the list is this host alone.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from tunelab.errors import LaunchError

__all__ = ["allocation_hosts", "node_address", "write_hostfile"]

_MAX_HOSTS = 100_000


def allocation_hosts(environ: Mapping[str, str] | None = None) -> list[str]:
    """Host names of the allocation, first (batch) node first, each once."""
    env = os.environ if environ is None else environ
    nodefile = env.get("PBS_NODEFILE")
    if nodefile:
        try:
            lines = Path(nodefile).read_text().split()[:_MAX_HOSTS]
        except OSError as exc:
            raise LaunchError(f"cannot read PBS_NODEFILE {nodefile}: {exc}") from exc
        return list(dict.fromkeys(lines))
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if nodelist:
        if shutil.which("scontrol") is None:
            raise LaunchError("SLURM_JOB_NODELIST is set but scontrol is not on PATH")
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                             text=True, timeout=60)
        if out.returncode != 0:
            raise LaunchError(f"scontrol show hostnames {nodelist}: {out.stderr.strip()}")
        return list(dict.fromkeys(out.stdout.split()[:_MAX_HOSTS]))
    return [socket.gethostname()]


def write_hostfile(path: Path, hosts: Sequence[str], slots: int) -> Path:
    """An Open MPI hostfile: one ``host slots=N`` line per host."""
    path.write_text("".join(f"{h} slots={slots}\n" for h in hosts))
    return path


def node_address(host: str) -> str:
    """An address other nodes can reach ``host`` at: DNS, else Slurm's ``NodeAddr`` (virtual
    nodes have no DNS entries), else the name itself."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        pass
    if shutil.which("scontrol"):
        out = subprocess.run(["scontrol", "show", "node", host, "-o"], capture_output=True,
                             text=True, timeout=60)
        for field in out.stdout.split():
            if field.startswith("NodeAddr="):
                return field.removeprefix("NodeAddr=")
    return host
