"""Processes inside network and UTS namespaces, found and ended by the namespaces' inodes, so
that tearing down virtual nodes leaves no process started inside a node behind (their
``slurmd``, a run's ranks), whatever started it; and whether a process is alive (the virtual
nodes' owner, the virtual Slurm cluster's daemons)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

__all__ = ["alive", "inode", "kill_all", "pids_in"]


def inode(path: Path) -> int | None:
    """The inode of ``path`` (a namespace file: its identity), or None when it is gone."""
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def pids_in(inodes: set[int]) -> list[int]:
    """Processes whose network or UTS namespace has one of ``inodes``."""
    if not inodes:
        return []
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        for ns in ("net", "uts"):
            with contextlib.suppress(OSError):
                link = os.readlink(entry / "ns" / ns)  # "net:[4026532177]"
                if int(link[link.index("[") + 1:-1]) in inodes:
                    found.append(int(entry.name))
                    break
    return found


def kill_all(inodes: set[int], grace_s: float = 2.0) -> None:
    """SIGTERM the processes in the namespaces, SIGKILL what is left after ``grace_s``."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        pids = pids_in(inodes)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and pids_in(inodes):
            time.sleep(0.05)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
