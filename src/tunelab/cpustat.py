"""What Linux says about a machine's CPUs, read from ``/proc`` and ``/sys``: CPU lists as it
writes them (``0-3,6``), the CPUs this process may run on and those sharing a last-level
cache with them, per-CPU busy and steal seconds, a cgroup's CPU time and CPU pressure, the
time a CPU quota held back the cgroups a run's CPU time is limited by, the CPU time of this
process and its children, the load average and the clock frequency.

The counters the noise watch (:mod:`tunelab.noise`) reads before and after each run; each
reader gives None (or the run's own CPUs) where the file is missing or unreadable.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterable
from pathlib import Path

__all__ = ["cgroup_usage", "cpu_list_text", "cpu_seconds", "llc_cpus", "load", "mhz",
           "own_cpus", "parse_cpu_list", "pressure", "quota", "quota_cgroups", "rusage",
           "throttled"]

PROC = Path("/proc")
SYS_CPU = Path("/sys/devices/system/cpu")


def cpu_list_text(cpus: Iterable[int]) -> str:
    """CPUs as Linux writes them: ``0-3,6``."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def parse_cpu_list(text: str) -> set[int]:
    """CPUs from a list as Linux writes it (``0-3,6``); empty for text that is not one."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        low, _, high = part.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            return set()
        if first < 0 or last < first or last - first > 65536:
            return set()
        cpus.update(range(first, last + 1))
    return cpus


def llc_cpus(cpus: tuple[int, ...]) -> tuple[int, ...]:
    """``cpus`` and every CPU that shares a last-level cache with one of them: per CPU the
    data or unified cache of the highest level in sysfs (``cache/index*``); just ``cpus``
    where sysfs does not say."""
    domain = set(cpus)
    for cpu in cpus:
        level, shared = -1, ""
        for index in (SYS_CPU / f"cpu{cpu}" / "cache").glob("index[0-9]*"):
            try:
                if (index / "type").read_text().strip() == "Instruction":
                    continue
                this = int((index / "level").read_text())
                if this > level:
                    level, shared = this, (index / "shared_cpu_list").read_text()
            except (OSError, ValueError):
                continue
        domain |= parse_cpu_list(shared)
    return tuple(sorted(domain))


def own_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on (its affinity; all of them where it is unknown)."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return tuple(range(os.cpu_count() or 1))


def cpu_seconds(cpus: tuple[int, ...]) -> tuple[float, float] | None:
    """(busy, steal) CPU seconds since boot of the CPUs ``cpus``, from /proc/stat."""
    wanted = {f"cpu{c}" for c in cpus}
    busy = steal = 0.0
    found = 0
    try:
        lines = (PROC / "stat").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if not fields or fields[0] not in wanted:
            continue
        ticks = [float(x) for x in fields[1:]]
        # user nice system idle iowait irq softirq steal guest guest_nice; guest time is
        # already in user and nice
        busy += sum(ticks[0:3]) + sum(ticks[5:7])
        steal += ticks[7] if len(ticks) > 7 else 0.0
        found += 1
    if found != len(wanted):
        return None
    hz = float(os.sysconf("SC_CLK_TCK"))
    return busy / hz, steal / hz


def cgroup_usage(cgroup: Path | None) -> float | None:
    """CPU seconds the cgroup's processes used (``cpu.stat`` usage_usec)."""
    if cgroup is None:
        return None
    try:
        for line in (cgroup / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
    except (OSError, ValueError):
        return None
    return None


def _mounts() -> list[tuple[str, Path, str, set[str]]]:
    """Cgroup mounts of this process: (file system type, mount point, mount root, the
    controllers of a version-1 hierarchy), from ``/proc/self/mountinfo``."""
    try:
        lines = (PROC / "self" / "mountinfo").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, kind = left.split(), right.split()
        if len(fields) > 4 and len(kind) > 2 and kind[0] in ("cgroup", "cgroup2"):
            found.append((kind[0], Path(fields[4]), fields[3], set(kind[2].split(","))))
    return found


def _chain(leaf: Path, top: Path) -> list[Path]:
    """``leaf`` and its parents up to ``top`` (both included; just ``leaf`` when it is not
    under ``top``)."""
    chain = [leaf]
    while chain[-1] != top and chain[-1].parent != chain[-1] and top in chain[-1].parents:
        chain.append(chain[-1].parent)
    return chain


def quota_cgroups(cgroup: Path | None) -> tuple[Path, ...]:
    """The cgroups whose CPU quota can hold back a run in ``cgroup`` (None: in this
    process's own), each with its ``cpu.stat``: that cgroup and its parents in the unified
    hierarchy (cgroup v2, ``cpu.max``), and this process's cgroup of the version-1 ``cpu``
    controller and its parents (``cpu.cfs_quota_us``; a run inherits it). Empty where
    nothing is readable."""
    try:
        own = (PROC / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return ()
    paths: list[Path] = []
    for kind, point, root, options in _mounts():
        for line in own:
            _, controllers, rel = (line.split(":", 2) + ["", ""])[:3]
            if kind == "cgroup2" and controllers == "":
                if cgroup is not None and point in cgroup.parents:
                    paths += _chain(cgroup, point)
                    continue
            elif not (kind == "cgroup" and "cpu" in controllers.split(",")
                      and "cpu" in options):
                continue
            rel = rel.strip()
            if root != "/" and rel != root and not rel.startswith(root + "/"):
                continue  # the cgroup is outside what this mount shows
            paths += _chain(point / rel[len(root.rstrip("/")):].lstrip("/"), point)
    paths = [p for p in paths if (p / "cpu.stat").is_file()]
    return tuple(dict.fromkeys(paths))


def throttled(cgroups: tuple[Path, ...]) -> tuple[float, ...] | None:
    """Seconds a CPU quota held back each of ``cgroups`` since it was made (``cpu.stat``:
    ``throttled_usec`` in cgroup v2, where the cpu controller is on; ``throttled_time``, in
    ns, in version 1), summed over the CPUs it was held back on; 0 for a cgroup without
    the counter; None when none has it."""
    values: list[float] = []
    found = False
    for path in cgroups:
        seconds = 0.0
        try:
            for line in (path / "cpu.stat").read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "throttled_usec":
                    seconds, found = int(value) / 1e6, True
                elif name == "throttled_time":
                    seconds, found = int(value) / 1e9, True
        except (OSError, ValueError):
            pass
        values.append(seconds)
    return tuple(values) if found else None


def quota(cgroups: tuple[Path, ...]) -> tuple[float, Path] | None:
    """The smallest CPU quota of ``cgroups``, in CPUs, and the cgroup that sets it (cgroup
    v2 ``cpu.max``, version 1 ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``); None where
    none sets one."""
    found: list[tuple[float, Path]] = []
    for path in cgroups:
        try:
            if (path / "cpu.max").is_file():
                limit, _, period = (path / "cpu.max").read_text().partition(" ")
                if limit.strip() != "max":
                    found.append((int(limit) / int(period), path))
            elif (path / "cpu.cfs_quota_us").is_file():
                limit = (path / "cpu.cfs_quota_us").read_text()
                if int(limit) > 0:
                    found.append((int(limit) / int((path / "cpu.cfs_period_us").read_text()),
                                  path))
        except (OSError, ValueError, ZeroDivisionError):
            continue
    return min(found, key=lambda f: f[0]) if found else None


def pressure(path: Path) -> float | None:
    """Seconds some task waited for a CPU (``some ... total=`` of a cpu.pressure file)."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("some "):
                return int(line.rsplit("total=", 1)[1]) / 1e6
    except (OSError, ValueError, IndexError):
        return None
    return None


def rusage(who: int) -> float:
    """User and system CPU seconds of ``who`` (``resource.RUSAGE_SELF``/``_CHILDREN``)."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def load() -> float | None:
    """The 1-minute load average (None where it is unknown)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def mhz() -> float | None:
    """Mean current frequency over the CPUs, in MHz."""
    values = []
    for path in sorted(SYS_CPU.glob("cpu[0-9]*/cpufreq/scaling_cur_freq")):
        try:
            values.append(float(path.read_text()) / 1000.0)
        except (OSError, ValueError):
            continue
    if not values:
        try:
            for line in (PROC / "cpuinfo").read_text().splitlines():
                if line.startswith("cpu MHz"):
                    values.append(float(line.split(":", 1)[1]))
        except (OSError, ValueError):
            return None
    return sum(values) / len(values) if values else None
