"""The page cache, kept out of storage figures (``--cache cold``) or filled on purpose.

* ``cold``: before every epoch each worker drops the pages of the files it is about to read
  (``posix_fadvise(POSIX_FADV_DONTNEED)`` per file); before the run the launcher also
  writes ``1`` to ``/proc/sys/vm/drop_caches`` when it runs as root (the whole machine's
  clean page cache; without root that step is skipped and the result says so).
* ``warm``: the launcher reads every file once before the run, so the epochs read from
  memory (refused when the dataset is larger than 80 % of the memory available).
* ``keep``: nothing is done; the cache is as found.

Whatever was done is recorded in the result, next to what the kernel measured: the share of
the bytes read that came from the block device (``/proc/thread-self/io`` ``read_bytes``).
Where that share contradicts what a storage figure needs — ``cold`` (or ``keep``) runs whose
reads mostly came from memory: a tmpfs, pages cached again meanwhile, a dataset that fits in
the page cache — :func:`measured_note` says so in the result's notes (MLPerf Storage avoids
the page cache with a dataset 5 x the host's memory). Dirty pages are not dropped by
fadvise: make-data flushes what it writes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from tunelab.errors import WorkloadError
from tunelab.sysinfo import mem_available

__all__ = ["CachePrep", "advise_files", "drop_file_pages", "drop_page_cache", "measured_note",
           "prefill", "prepare_cache"]

DROP_CACHES = "/proc/sys/vm/drop_caches"
WARM_FRACTION = 0.8
#: below this share of the bytes read from the device, a cold or kept cache served from memory
FROM_MEMORY = 0.5


@dataclass(frozen=True)
class CachePrep:
    """What the launcher did to the page cache before the run."""

    mode: str
    actions: tuple[str, ...] = field(default=())
    files: int = 0


def advise_files(paths: Iterable[str], advice: int) -> int:
    """``posix_fadvise(advice)`` on the whole of every file; the number of files done (one
    that cannot be opened or advised is passed over)."""
    done = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, advice)
            done += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return done


def drop_file_pages(paths: Iterable[str]) -> int:
    """``posix_fadvise(DONTNEED)`` on every file; the number of files done."""
    return advise_files(paths, os.POSIX_FADV_DONTNEED)


def drop_page_cache() -> str:
    """Drop the machine's clean page cache (root); a line saying what happened."""
    if os.geteuid() != 0:
        return f"{DROP_CACHES} not written (not root)"
    try:
        os.sync()
        with open(DROP_CACHES, "w") as f:
            f.write("1\n")
    except OSError as exc:
        return f"{DROP_CACHES} not written ({exc.strerror})"
    return f"{DROP_CACHES} = 1 (the machine's clean page cache dropped)"


def prefill(paths: Iterable[str], chunk: int = 1 << 20) -> int:
    """Read every file once (fills the page cache); the bytes read."""
    total = 0
    buf = bytearray(chunk)
    view = memoryview(buf)
    for path in paths:
        try:
            with open(path, "rb", buffering=0) as f:
                while n := f.readinto(view):
                    total += n
        except OSError as exc:
            raise WorkloadError(f"--cache warm: cannot read {path}: {exc.strerror}") from None
    return total


def prepare_cache(mode: str, paths: list[str], dataset_bytes: int) -> CachePrep:
    """The launcher's part of ``mode`` for a dataset of ``paths``."""
    if mode == "cold":
        n = drop_file_pages(paths)
        return CachePrep(mode, (f"posix_fadvise(DONTNEED) on {n} files before the run and on "
                                "each worker's files before every epoch", drop_page_cache()),
                         n)
    if mode == "warm":
        avail = mem_available()
        if dataset_bytes > WARM_FRACTION * avail:
            raise WorkloadError(f"--cache warm: the dataset ({dataset_bytes / 1e9:.2f} GB) does "
                                f"not fit in the page cache ({avail / 1e9:.2f} GB available); "
                                "use --cache cold or fewer samples")
        read = prefill(paths)
        return CachePrep(mode, (f"read all {len(paths)} files ({read / 1e6:.1f} MB) once "
                                "before the run",), len(paths))
    return CachePrep(mode, ("nothing done (the page cache as found)",))


def measured_note(mode: str, device_share: float | None, dataset_bytes: int,
                  memory_bytes: int) -> str | None:
    """A note when the kernel's measured cache state contradicts a storage figure: ``cold``
    or ``keep`` runs that read less than :data:`FROM_MEMORY` of their bytes from the device
    measured memory, not storage. None otherwise (``warm`` reads memory on purpose)."""
    if mode == "warm" or device_share is None or not device_share < FROM_MEMORY:
        return None
    fits = (f"the dataset ({dataset_bytes / 1e9:.2f} GB) is "
            f"{dataset_bytes / memory_bytes:.2g} x this host's memory "
            f"({memory_bytes / 1e9:.1f} GB); MLPerf Storage asks for 5 x" if memory_bytes > 0
            else "")
    if mode == "cold":
        why = ("its pages could not be dropped (a tmpfs or another memory-backed file system, "
               "or pages cached again meanwhile)")
    else:
        why = (f"--cache keep read what the page cache held ({fits}; --cache cold drops the "
               "pages)")
    return (f"only {device_share:.0%} of the bytes read came from the device: the read figures "
            f"are memory's, not the storage's — {why}")
