"""Noise watch: how busy the machine was around every run, and waiting for a quiet one.

Before and after each run the watch reads the 1-minute load average and the CPU frequency
(mean over cores, from ``/sys/.../cpufreq/scaling_cur_freq`` or ``/proc/cpuinfo``), and it
counts, from ``/proc/stat``, the CPU time the whole machine spent during the run. Subtracting
the CPU time of the run's own processes (``getrusage`` of the finished children, and of
tunelab itself) leaves ``others_cpu``: the share of the machine (0..1) that *other* processes
used while the run ran; ``steal`` is the share the hypervisor took. A run is **disturbed**
when others used at least :data:`DISTURB_MARGIN` more of the machine than in the reference
window taken when the study started, or the hypervisor stole :data:`STEAL_MARGIN` more.

Everything is read from Linux's ``/proc`` and ``/sys``; on a system without them each figure
is None and no run is flagged. The load average lags (it is a 1-minute mean) and counts the
run's own processes, which is why the flag rests on ``others_cpu``.
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "DISTURB_MARGIN",
    "MAX_QUIET_WAIT_S",
    "QUIET_LEVEL",
    "NoiseSample",
    "NoiseWatch",
]

DISTURB_MARGIN = 0.25
"""Extra share of the machine used by others (vs the start) that flags a run as disturbed."""

STEAL_MARGIN = 0.10
"""Extra share of CPU time stolen by the hypervisor that flags a run as disturbed."""

QUIET_LEVEL = 0.15
"""``--wait-quiet`` waits until others use at most this share of the machine."""

MAX_QUIET_WAIT_S = 600.0
"""``--wait-quiet`` gives up waiting after this long and runs anyway (the run is flagged)."""

_REFERENCE_S = 0.3
_PROC = Path("/proc")
_SYS_CPU = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class NoiseSample:
    """What the machine did around one run (None: not readable here)."""

    load_before: float | None
    load_after: float | None
    others_cpu: float | None
    steal: float | None
    mhz_before: float | None
    mhz_after: float | None
    disturbed: bool

    def as_dict(self) -> dict[str, float | None]:
        """Column name -> value, as the store keeps them (``disturbed`` as 0/1)."""
        out: dict[str, float | None] = dict(asdict(self))
        out["disturbed"] = 1.0 if self.disturbed else 0.0
        return out


@dataclass(frozen=True)
class _Snapshot:
    wall: float
    busy: float | None
    steal: float | None
    own: float
    load: float | None
    mhz: float | None


def _cpu_seconds() -> tuple[float, float] | None:
    """(busy, steal) CPU seconds of the whole machine since boot, from /proc/stat."""
    try:
        first = (_PROC / "stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    ticks = [float(x) for x in first[1:]]
    hz = float(os.sysconf("SC_CLK_TCK"))
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0.0)  # idle + iowait
    steal = ticks[7] if len(ticks) > 7 else 0.0
    guest = sum(ticks[8:10]) if len(ticks) > 9 else 0.0  # already counted in user/nice
    busy = sum(ticks) - idle - steal - guest
    return busy / hz, steal / hz


def _own_seconds() -> float:
    """CPU seconds of tunelab and of its finished (waited-for) children."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _mhz() -> float | None:
    """Mean current frequency over the CPUs, in MHz."""
    values = []
    for path in sorted(_SYS_CPU.glob("cpu[0-9]*/cpufreq/scaling_cur_freq")):
        try:
            values.append(float(path.read_text()) / 1000.0)
        except (OSError, ValueError):
            continue
    if not values:
        try:
            for line in (_PROC / "cpuinfo").read_text().splitlines():
                if line.startswith("cpu MHz"):
                    values.append(float(line.split(":", 1)[1]))
        except (OSError, ValueError):
            return None
    return sum(values) / len(values) if values else None


class NoiseWatch:
    """Samples the machine around runs of one study (see the module docstring).

    The reference — what others used when the study started — is measured over the first
    :data:`_REFERENCE_S` seconds after the watch is made (it waits out the rest at the first
    run, if need be). ``clock`` and ``sleep`` are injectable for tests.
    """

    def __init__(self, cores: int | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.cores = cores or os.cpu_count() or 1
        self._clock, self._sleep = clock, sleep
        self._origin = self._snapshot()
        self.reference: tuple[float | None, float | None] | None = None

    def _snapshot(self) -> _Snapshot:
        cpu = _cpu_seconds()
        return _Snapshot(self._clock(), cpu[0] if cpu else None, cpu[1] if cpu else None,
                         _own_seconds(), _load(), _mhz())

    def _shares(self, a: _Snapshot, b: _Snapshot) -> tuple[float | None, float | None]:
        """(others' share, steal share) of the machine between two snapshots."""
        span = (b.wall - a.wall) * self.cores
        if span <= 0 or a.busy is None or b.busy is None or a.steal is None or b.steal is None:
            return None, None
        others = (b.busy - a.busy - (b.own - a.own)) / span
        steal = (b.steal - a.steal) / span
        return min(max(others, 0.0), 1.0), min(max(steal, 0.0), 1.0)

    def _ensure_reference(self) -> tuple[float | None, float | None]:
        if self.reference is None:
            left = _REFERENCE_S - (self._clock() - self._origin.wall)
            if left > 0:
                self._sleep(left)
            self.reference = self._shares(self._origin, self._snapshot())
        return self.reference

    def start(self) -> _Snapshot:
        """Sample just before a run."""
        self._ensure_reference()
        return self._snapshot()

    def stop(self, before: _Snapshot) -> NoiseSample:
        """Sample just after the run started at ``before``; flag it if disturbed."""
        after = self._snapshot()
        others, steal = self._shares(before, after)
        ref_others, ref_steal = self._ensure_reference()
        disturbed = False
        if others is not None and ref_others is not None:
            disturbed = others >= ref_others + DISTURB_MARGIN
        if steal is not None and ref_steal is not None:
            disturbed = disturbed or steal >= ref_steal + STEAL_MARGIN
        return NoiseSample(before.load, after.load, others, steal, before.mhz, after.mhz,
                           disturbed)

    def others_now(self, window_s: float = 1.0) -> float | None:
        """Share of the machine used by other processes over the next ``window_s``."""
        a = self._snapshot()
        self._sleep(window_s)
        return self._shares(a, self._snapshot())[0]

    def wait_quiet(self, level: float = QUIET_LEVEL, max_wait_s: float = MAX_QUIET_WAIT_S,
                   window_s: float = 1.0) -> float:
        """Wait until others use at most ``level`` of the machine (or ``max_wait_s`` passed);
        returns the seconds waited. Returns at once where nothing can be read."""
        started = self._clock()
        while self._clock() - started < max_wait_s:
            share = self.others_now(window_s)
            if share is None or math.isnan(share) or share <= level:
                break
        return self._clock() - started
