"""``--read-limit RATE``: slower storage through the kernel's own block-I/O throttle.

The limit applies to reads from the block device that holds the dataset, for the benchmark
and every process it starts (they inherit its control group):

* cgroup v2 with the ``io`` controller: a child group of the v2 root with
  ``io.max = "MAJ:MIN rbps=RATE"``;
* else cgroup v1 ``blkio``: a child group with ``blkio.throttle.read_bps_device =
  "MAJ:MIN RATE"`` (a 10 MB/s limit gave 10.4-10.5 MB/s on cold reads on these machines).

The device is the whole disk under the file system's partition (the throttle refuses
partitions). Reads served by the page cache are not throttled: pair the limit with
``--cache cold``. Where no mechanism applies (no root, a file system without a block device
such as tmpfs, no io/blkio controller) :func:`read_limit` raises a one-line
:class:`WorkloadError` saying why. The group is removed on leaving, on every exit path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tunelab.errors import WorkloadError

__all__ = ["BlockDevice", "Throttle", "block_device", "find_mechanism", "read_limit",
           "remove_group"]

SYS_DEV_BLOCK = Path("/sys/dev/block")
MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True)
class BlockDevice:
    """A whole disk: ``major:minor`` and its kernel name."""

    major: int
    minor: int
    name: str

    @property
    def id(self) -> str:
        """``MAJ:MIN``."""
        return f"{self.major}:{self.minor}"


@dataclass(frozen=True)
class Throttle:
    """A mechanism that can throttle reads: ``kind`` v2 or v1 and the hierarchy's root."""

    kind: str
    root: Path


def _mount_of(path: str, mountinfo: Path = MOUNTINFO) -> tuple[str, str]:
    """(file system type, source) of the mount holding ``path``."""
    best = ("", "?", "?")
    real = os.path.realpath(path)
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return "?", "?"
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        point = fields[4].replace("\\040", " ")
        if (real == point or real.startswith(point.rstrip("/") + "/")) and \
                len(point) >= len(best[0]):
            fstype, source = (right.split() + ["?", "?"])[:2]
            best = (point, fstype, source)
    return best[1], best[2]


def block_device(path: str, sys_root: Path = SYS_DEV_BLOCK) -> BlockDevice:
    """The whole disk under ``path``'s file system, or a :class:`WorkloadError` why none."""
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    node = sys_root / f"{major}:{minor}"
    if not node.exists():
        fstype, source = _mount_of(path)
        raise WorkloadError(f"{path} is on a {fstype} file system ({source}, device "
                            f"{major}:{minor}) that has no block device to throttle")
    real = node.resolve()
    if (real / "partition").exists():  # a partition: the throttle wants its disk
        real = real.parent
    try:
        maj, mnr = (real / "dev").read_text().strip().split(":")
    except (OSError, ValueError):
        raise WorkloadError(f"cannot read the device number of {real}") from None
    return BlockDevice(int(maj), int(mnr), real.name)


def find_mechanism(mountinfo: Path = MOUNTINFO) -> Throttle:
    """cgroup v2 with ``io``, else cgroup v1 ``blkio``, else a :class:`WorkloadError`."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError as exc:
        raise WorkloadError(f"cannot read {mountinfo}: {exc.strerror}") from None
    v2: list[Path] = []
    v1: list[Path] = []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        rfields = right.split()
        if len(fields) < 5 or not rfields:
            continue
        if rfields[0] == "cgroup2":
            v2.append(Path(fields[4]))
        elif rfields[0] == "cgroup" and len(rfields) > 2 and "blkio" in rfields[2].split(","):
            v1.append(Path(fields[4]))
    for root in v2:
        try:
            if "io" in (root / "cgroup.controllers").read_text().split():
                return Throttle("v2", root)
        except OSError:
            continue
    for root in v1:
        if (root / "blkio.throttle.read_bps_device").exists():
            return Throttle("v1", root)
    why = []
    if v2:
        why.append(f"cgroup v2 at {', '.join(map(str, v2))} offers no io controller")
    else:
        why.append("no cgroup v2 hierarchy")
    why.append("no cgroup v1 blkio hierarchy with blkio.throttle" if not v1 else
               "cgroup v1 blkio lacks blkio.throttle.read_bps_device")
    raise WorkloadError("; ".join(why))


def _own_group(kind: str) -> str:
    """This process's group in the v1 blkio or the v2 hierarchy (from /proc/self/cgroup)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        num, controllers, path = line.split(":", 2)
        if kind == "v2" and num == "0":
            return path
        if kind == "v1" and "blkio" in controllers.split(","):
            return path
    return "/"


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


@contextlib.contextmanager
def read_limit(rate_bps: float, dataset: str) -> Iterator[str]:
    """Throttle reads of this process and its children from ``dataset``'s disk to
    ``rate_bps`` bytes/s for the block; yields a line saying what was set."""
    try:
        device = block_device(dataset)
        mech = find_mechanism()
    except (WorkloadError, OSError) as exc:
        raise WorkloadError(f"--read-limit cannot be applied: {exc}") from None
    rate = int(rate_bps)
    group = mech.root / f"tunelab-readlimit-{os.getpid()}"
    home = mech.root / _own_group(mech.kind).lstrip("/")
    try:
        group.mkdir()
        if mech.kind == "v2":
            with contextlib.suppress(OSError):
                _write(mech.root / "cgroup.subtree_control", "+io")
            _write(group / "io.max", f"{device.id} rbps={rate}")
            setting = f"io.max = {device.id} rbps={rate}"
        else:
            _write(group / "blkio.throttle.read_bps_device", f"{device.id} {rate}")
            setting = f"blkio.throttle.read_bps_device = {device.id} {rate}"
        _write(group / "cgroup.procs", str(os.getpid()))
    except OSError as exc:
        with contextlib.suppress(OSError):
            group.rmdir()
        why = "needs root" if exc.errno in (1, 13) else exc.strerror
        raise WorkloadError(f"--read-limit cannot be applied: {group}: {why}") from None
    try:
        yield (f"reads from {device.name} ({device.id}) limited to {rate_bps / 1e6:g} MB/s "
               f"by cgroup {mech.kind}: {setting}")
    finally:
        with contextlib.suppress(OSError):
            _write(home / "cgroup.procs", str(os.getpid()))
        remove_group(group)


def remove_group(group: Path, wait_s: float = 5.0) -> bool:
    """Remove a cgroup directory; while processes killed a moment ago are still leaving it
    (EBUSY) try again, for at most ``wait_s`` seconds. Whether it is gone."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            group.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                return False
        time.sleep(0.05)
