"""Disk I/O around a run: what the machine's disks moved, what of it was the run's own, and
how long the run's tasks waited for I/O — the noise watch's evidence (:mod:`tunelab.noise`)
that other processes' I/O slowed a run.

* **the disks**: the whole physical disks, each counted once — the entries of
  ``/sys/block`` whose device is not virtual (loop, ram, zram, device-mapper and md devices
  live under ``/sys/devices/virtual`` and only pass I/O on to a disk, or none); partitions
  are not entries of ``/sys/block`` but parts of their disk's count. Bytes moved: sectors
  read and written (``stat`` fields 3 and 7, 512 bytes each; discards are not data moved);
* **the run's own bytes**: read and written by its cgroup on those disks (``io.stat``
  ``rbytes``/``wbytes``, where the io controller is on), else by the finished children
  (``getrusage`` ``ru_inblock``/``ru_oublock``: reads as they reach a disk, writes as
  pages are dirtied or written directly); tunelab's own I/O (``RUSAGE_SELF``) is not
  others' either;
* **carried-over writes**: writeback of pages written before the run — by the study's
  earlier runs, or by tunelab — lands on the disks during it and is no one else's. The
  writes of tunelab and its runs over the last ``2 × (dirty_expire + dirty_writeback)``
  (``/proc/sys/vm``, 70 s by default: a dirty page is written within about
  ``dirty_expire + dirty_writeback`` of its first write) are counted, up to what
  ``/proc/meminfo`` says was dirty or under writeback as the run started (``Dirty`` +
  ``Writeback``); while the watch is younger than that window, what an earlier process left
  is unknown and all of ``Dirty`` + ``Writeback`` counts;
* **its waiting**: the share of its wall time in which some task of its cgroup waited for
  I/O (``some`` of the cgroup's ``io.pressure``; the machine's says nothing of the run).

``others`` = disks − own − tunelab's − carried, at least 0; ``others_share`` = others / what
the disks moved. Where something is missing its figures are None (no physical disk or no
``/proc/meminfo``: the bytes; no cgroup or no PSI: the waiting); nothing here raises.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DiskIO", "DiskSnapshot", "DiskWatch", "bytes_text", "physical_disks"]

_SYS_BLOCK = Path("/sys/block")
_PROC = Path("/proc")
_SECTOR = 512
_DEFAULT_WINDOW_S = 70.0
"""Carried-over writes are looked for this far back where ``/proc/sys/vm`` does not say."""


def physical_disks(sys_block: Path | None = None) -> dict[str, str]:
    """The whole physical disks, name -> ``major:minor`` (``{"vda": "254:0"}``): the entries
    of ``/sys/block`` whose device is not under ``devices/virtual``; empty where none."""
    root = sys_block if sys_block is not None else _SYS_BLOCK
    disks: dict[str, str] = {}
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return disks
    for entry in entries:
        try:
            if "/devices/virtual/" in f"{entry.resolve().as_posix()}/":
                continue
            disks[entry.name] = (entry / "dev").read_text().strip()
        except OSError:
            continue
    return disks


def _disk_bytes(disks: Mapping[str, str]) -> dict[str, int] | None:
    """Bytes each disk read and wrote since boot; None when none can be read."""
    moved: dict[str, int] = {}
    for name in disks:
        try:
            fields = (_SYS_BLOCK / name / "stat").read_text().split()
            moved[name] = (int(fields[2]) + int(fields[6])) * _SECTOR
        except (OSError, ValueError, IndexError):
            continue
    return moved or None


def _cgroup_bytes(cgroup: Path | None, devices: set[str]) -> tuple[int, int] | None:
    """(read, written) bytes the cgroup's tasks moved on ``devices`` (``io.stat``); None
    where the io controller is off (no ``io.stat``)."""
    if cgroup is None:
        return None
    read = written = 0
    try:
        for line in (cgroup / "io.stat").read_text().splitlines():
            device, *pairs = line.split()
            if device not in devices:
                continue
            counts = dict(pair.split("=", 1) for pair in pairs if "=" in pair)
            read += int(counts.get("rbytes", 0))
            written += int(counts.get("wbytes", 0))
    except (OSError, ValueError):
        return None
    return read, written


def _rusage_bytes(who: int) -> tuple[int, int]:
    """(read, written) bytes of ``who`` (``RUSAGE_SELF`` or ``RUSAGE_CHILDREN``)."""
    usage = resource.getrusage(who)
    return usage.ru_inblock * _SECTOR, usage.ru_oublock * _SECTOR


def _backlog() -> int | None:
    """Bytes dirty or under writeback now (``/proc/meminfo`` Dirty + Writeback)."""
    wanted = {"Dirty:", "Writeback:"}
    total, found = 0, 0
    try:
        for line in (_PROC / "meminfo").read_text().splitlines():
            fields = line.split()
            if fields and fields[0] in wanted:
                total += int(fields[1]) * 1024
                found += 1
    except (OSError, ValueError, IndexError):
        return None
    return total if found == len(wanted) else None


def _io_waited(cgroup: Path | None) -> float | None:
    """Seconds some task of the cgroup waited for I/O (``io.pressure`` some total)."""
    if cgroup is None:
        return None
    try:
        for line in (cgroup / "io.pressure").read_text().splitlines():
            if line.startswith("some "):
                return int(line.rsplit("total=", 1)[1]) / 1e6
    except (OSError, ValueError, IndexError):
        return None
    return None


def _writeback_window() -> float:
    """How far back writes may still be written back now: twice (``dirty_expire`` +
    ``dirty_writeback``)."""
    try:
        centis = sum(int((_PROC / "sys" / "vm" / name).read_text())
                     for name in ("dirty_expire_centisecs", "dirty_writeback_centisecs"))
    except (OSError, ValueError):
        return _DEFAULT_WINDOW_S
    return 2 * centis / 100 if centis > 0 else _DEFAULT_WINDOW_S


def bytes_text(n: float) -> str:
    """Bytes as people read them: ``1.4 GB``, ``802 MB``, ``12 kB``, ``512 B``."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}" if unit == "GB" else f"{n / size:.0f} {unit}"
    return f"{n:.0f} B"


@dataclass(frozen=True)
class DiskSnapshot:
    """The disk counters just before (or after) a run."""

    disks: dict[str, int] | None
    """Bytes each physical disk moved since boot (None: none readable)."""
    cgroup: tuple[int, int] | None
    """(read, written) bytes of the run's cgroup on those disks (None: no ``io.stat``)."""
    children: tuple[int, int]
    self_io: tuple[int, int]
    carried: int | None
    """Bytes written before this moment that may still be written back (None: unknown)."""
    waited: float | None
    """Seconds the cgroup's tasks waited for I/O (None: no cgroup or no PSI)."""


@dataclass(frozen=True)
class DiskIO:
    """Disk I/O over one run (None: not readable here)."""

    disks: str
    """The physical disks that moved bytes during the run (``vda,vdb``; "" when none)."""
    own_bytes: float | None
    """Bytes the run itself read and wrote."""
    others_bytes: float | None
    """Bytes the disks moved beyond the run's, tunelab's and the carried-over writes."""
    others_share: float | None
    """``others_bytes`` / the bytes the disks moved (0 when they moved none)."""
    carried_bytes: float | None
    """Writes made before the run that were not counted as others' (see the module)."""
    waited: float | None
    """Share of the run's wall time some task of its cgroup waited for I/O."""
    moved_bytes: float | None = None
    """Bytes the physical disks moved over the run, whoever's."""


class DiskWatch:
    """Reads the disk counters around runs; remembers what tunelab and its runs wrote
    (see the module docstring). ``clock`` is injectable for tests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.disks = physical_disks()
        self._clock = clock
        self._born = clock()
        self._window = _writeback_window()
        self._written: list[tuple[float, int]] = []
        self._total_written = self._our_written()

    @staticmethod
    def _our_written() -> int:
        return (_rusage_bytes(resource.RUSAGE_SELF)[1]
                + _rusage_bytes(resource.RUSAGE_CHILDREN)[1])

    def _carried(self) -> int | None:
        """Notes what tunelab and its finished runs wrote since the last look; the bytes of
        it (and of earlier processes, while unknown) that may still be written back."""
        now, total = self._clock(), self._our_written()
        if total > self._total_written:
            self._written.append((now, total - self._total_written))
        self._total_written = total
        self._written = [(t, n) for t, n in self._written if now - t <= self._window]
        backlog = _backlog()
        if backlog is None:
            return None
        if now - self._born < self._window:  # an earlier process's writes are unknown
            return backlog
        return min(backlog, sum(n for _, n in self._written))

    def snapshot(self, cgroup: Path | None) -> DiskSnapshot:
        """The counters now, for a run whose processes live in ``cgroup`` (None: none)."""
        return DiskSnapshot(
            _disk_bytes(self.disks), _cgroup_bytes(cgroup, set(self.disks.values())),
            _rusage_bytes(resource.RUSAGE_CHILDREN), _rusage_bytes(resource.RUSAGE_SELF),
            self._carried(), _io_waited(cgroup))

    def over(self, before: DiskSnapshot, after: DiskSnapshot, wall: float) -> DiskIO:
        """The run's disk I/O between ``before`` and ``after``, ``wall`` seconds apart."""
        waited = None
        if wall > 0 and before.waited is not None and after.waited is not None:
            waited = min(max((after.waited - before.waited) / wall, 0.0), 1.0)
        if before.disks is None or after.disks is None or before.carried is None:
            return DiskIO("", None, None, None, None, waited)
        moved = {name: max(after.disks[name] - before.disks.get(name, after.disks[name]), 0)
                 for name in after.disks}
        total = sum(moved.values())
        if before.cgroup is not None and after.cgroup is not None:
            own = sum(after.cgroup) - sum(before.cgroup)
        else:
            own = sum(after.children) - sum(before.children)
        ours = sum(after.self_io) - sum(before.self_io)
        others = max(total - max(own, 0) - max(ours, 0) - before.carried, 0)
        return DiskIO(",".join(name for name, n in moved.items() if n > 0), float(max(own, 0)),
                      float(others), others / total if total > 0 else 0.0,
                      float(before.carried), waited, float(total))
