"""The processes of this machine as tunelab's process hygiene sees them: ``/proc`` (a process's
parent, group and start time; its environment), cgroup v2 (a cgroup's processes, kill,
removal), signals to processes and groups, the child-subreaper flag, and waiting until
processes are gone. Primitives only: :mod:`tunelab.execute.hygiene` decides what to kill.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GONE_WAIT_S", "Proc", "cgroup_base", "cgroup_kill", "cgroup_pids", "cgroup_remove",
           "children", "die_with_parent", "environ_has", "kill", "killpg", "marked", "pids", "reap",
           "exited",
           "stat", "subreaper", "using", "wait_gone"]

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
GONE_WAIT_S = 5.0
"""How long :func:`wait_gone` waits for killed processes to end."""


# --- /proc ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    start: int  # clock ticks after boot (field 22 of /proc/PID/stat)


def stat(pid: int) -> Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()  # after "pid (comm) "
    if fields[0] == b"Z":  # a zombie is dead already; only its parent can reap it
        return None
    return Proc(pid, int(fields[1]), int(fields[2]), int(fields[19]))


def environ_has(pid: int, needle: bytes) -> bool:
    """Whether ``needle`` is in the environment of ``pid``. A process inside ``execve``
    shows an empty environment for a moment (its new memory exists before the kernel has
    copied the environment into it), so an empty one is read again a few times."""
    for pause in (0.0, 0.001, 0.005, 0.02):
        time.sleep(pause)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                raw = f.read()
        except OSError:
            return False
        if raw:
            return needle in b"\0" + raw
    return False


def pids() -> list[int]:
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


def marked(needle: bytes) -> list[Proc]:
    """Live processes (not this one) whose environment holds ``needle``."""
    me = os.getpid()
    found = []
    for pid in pids():
        if pid != me and environ_has(pid, needle):
            proc = stat(pid)
            if proc is not None:
                found.append(proc)
    return found


def using(directory: Path) -> list[int]:
    """Live processes that map a file under ``directory`` or hold one open (``/proc/PID/maps``
    and ``/proc/PID/fd``). A process whose entries this one may not read is another user's:
    it cannot enter a directory of mode 0700 that this user made."""
    inside = str(directory).rstrip("/") + "/"
    found = []
    for pid in pids():
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
                if any(inside in line for line in f):
                    found.append(pid)
                    continue
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # ended meanwhile, or another user's
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(inside):
                    found.append(pid)
                    break
    return found


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, sig)


def killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pgid, sig)


def exited(pid: int) -> bool:
    """Whether ``pid``, a child of this process, has ended: it waits to be reaped (and is
    left so: ``WNOWAIT``) or was reaped already."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # reaped already
    except OSError:
        return False


def reap(pid: int) -> None:
    """Reap ``pid`` if it is a child of this process that has ended."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


# --- cgroup v2 --------------------------------------------------------------------------


def cgroup_base() -> Path | None:
    """This process's own cgroup directory in a writable cgroup v2 hierarchy, or None."""
    try:
        own = next((line.split("::", 1)[1].strip() for line in
                    Path("/proc/self/cgroup").read_text().splitlines()
                    if line.startswith("0::")), None)
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    if own is None:
        return None
    for line in mounts:
        left, _, right = line.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            base = Path(left.split()[4]) / own.lstrip("/")
            if base.is_dir() and os.access(base, os.W_OK):
                return base
    return None


def cgroup_pids(cgroup: Path) -> list[int]:
    try:
        return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def cgroup_kill(cgroup: Path) -> None:
    """SIGKILL every process in ``cgroup`` (``cgroup.kill``, or one by one when frozen)."""
    try:
        (cgroup / "cgroup.kill").write_text("1")
        return
    except OSError:
        pass
    with contextlib.suppress(OSError):
        (cgroup / "cgroup.freeze").write_text("1")
    for pid in cgroup_pids(cgroup):
        kill(pid)
    with contextlib.suppress(OSError):
        (cgroup / "cgroup.freeze").write_text("0")


def cgroup_remove(cgroup: Path) -> None:
    deadline = time.monotonic() + GONE_WAIT_S
    while cgroup_pids(cgroup) and time.monotonic() < deadline:
        cgroup_kill(cgroup)
        for pid in cgroup_pids(cgroup):
            reap(pid)
        time.sleep(0.01)
    with contextlib.suppress(OSError):
        cgroup.rmdir()


def subreaper(on: bool) -> None:
    """Make this process a child subreaper (or stop being one)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


def die_with_parent(sig: int) -> Callable[[], None]:
    """A function to call in a child between ``fork`` and ``exec`` (``preexec_fn``): the
    kernel sends the child ``sig`` when the thread that forked it ends (``PR_SET_PDEATHSIG``,
    kept across ``exec``), so a ``kill -9`` of tunelab takes the run's leader with it. A
    parent already gone by then ends the child at once. libc is looked up here, before the
    fork, so the child only makes the call."""
    parent = os.getpid()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return lambda: None

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(128 + sig)

    return arm


def wait_gone(procs: list[Proc]) -> None:
    """Wait until every process of ``procs`` has ended (or a few seconds have passed)."""
    deadline = time.monotonic() + GONE_WAIT_S
    every = list(procs)
    while procs and time.monotonic() < deadline:
        for proc in procs:
            reap(proc.pid)
        procs = [p for p in procs if (now := stat(p.pid)) is not None and
                 (p.start == 0 or now.start == p.start)]
        if procs:
            time.sleep(0.01)
    for proc in every:  # an adopted orphan that died meanwhile is a zombie until reaped
        reap(proc.pid)


def children() -> list[Proc]:
    """Live children of this process (adopted orphans included)."""
    me = os.getpid()
    found = []
    for pid in pids():
        proc = stat(pid)
        if proc is not None and proc.ppid == me:
            found.append(proc)
    return found
