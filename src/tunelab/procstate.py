"""Whether a run's processes were stopped while it ran: sampled from ``/proc``.

A process stopped by a signal (``SIGSTOP``, ``SIGTSTP``: ``cpulimit``, a scheduler that
suspends jobs to share nodes, Ctrl-Z) or by a tracer takes no CPU and waits for none, so
neither the cores' busy time nor CPU pressure shows it; only its state does (``T`` or ``t``
in ``/proc/<pid>/stat``), and Linux keeps no count of the time spent so. A
:class:`StopSampler` reads the state of every process in the run's cgroup (and the cgroups
below it) every :data:`EVERY_S` seconds on a thread of its own, from just before the run
until :meth:`StopSampler.end`; the share of readings in which some process of the run was
stopped estimates the share of its wall time it was held so (a run of 1 s read 20 times:
about ±10 %; a stop shorter than a reading may fall between two).
"""

from __future__ import annotations

import threading
from pathlib import Path

__all__ = ["EVERY_S", "StopSampler", "stopped_now"]

EVERY_S = 0.05
"""Seconds between two readings."""

_GIVE_UP_S = 3600.0
"""A sampler whose run never started and that nobody ended (the controller was interrupted)
stops after this long; one whose run has ended stops at once."""


def _pids(cgroup: Path) -> list[int]:
    """The processes of ``cgroup`` and of every cgroup below it."""
    pids: list[int] = []
    try:
        files = [cgroup / "cgroup.procs", *cgroup.rglob("cgroup.procs")]
    except OSError:
        return pids
    for path in dict.fromkeys(files):
        try:
            pids += [int(p) for p in path.read_text().split()]
        except (OSError, ValueError):
            continue
    return pids


def stopped_now(pids: list[int], proc: Path = Path("/proc")) -> bool:
    """Whether one of ``pids`` is stopped now (state ``T``: by a signal; ``t``: by a
    tracer); a process that is gone counts as not."""
    for pid in pids:
        try:
            stat = (proc / str(pid) / "stat").read_text()
        except OSError:
            continue
        state = stat.rpartition(")")[2].split()[:1]  # the name may hold spaces and ')'
        if state and state[0] in ("T", "t"):
            return True
    return False


class StopSampler:
    """Reads, every ``every_s`` seconds until :meth:`end`, whether a process of ``cgroup``
    (or of a cgroup below it) is stopped."""

    def __init__(self, cgroup: Path, every_s: float = EVERY_S) -> None:
        self.cgroup = cgroup
        self.readings = 0
        self.stopped = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(every_s,), daemon=True,
                                        name="tunelab-stop-sampler")
        self._thread.start()

    def _loop(self, every_s: float) -> None:
        left = int(_GIVE_UP_S / every_s)
        while left > 0 and not self._done.wait(every_s):
            left -= 1
            pids = _pids(self.cgroup)
            if not pids:
                if self.readings:
                    return  # the run has ended
                continue  # it has not started yet
            self.readings += 1
            self.stopped += stopped_now(pids)

    @property
    def reading(self) -> bool:
        """Whether it still reads (False once :meth:`end` was called or its run ended)."""
        return self._thread.is_alive()

    def end(self) -> float | None:
        """Stop reading; the share of readings in which some process of the run was
        stopped (None when no reading found a process of it)."""
        self._done.set()
        self._thread.join(timeout=1.0)
        return self.stopped / self.readings if self.readings else None
