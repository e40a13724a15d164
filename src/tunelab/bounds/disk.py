"""Storage limits: how fast the files of a directory are read, cold and warm.

Cold: every file's cached pages are dropped first (``posix_fadvise(POSIX_FADV_DONTNEED)``,
file by file; no root needed, no other file touched), then the files are read in order with
1 MiB ``readinto`` calls. Warm: the same files read again at once, from the page cache. When
the directory holds less than the bytes asked for, a scratch file makes up the difference
(written, synced, then dropped like the others, and removed afterwards). Whether the drop
worked is checked with ``mincore`` (the share of the files' pages still resident before the
cold read): a file system that keeps pages anyway (tmpfs) makes the cold rate a warm one, and
the result says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tunelab.errors import TunelabError

__all__ = ["StorageResult", "read_rates", "resident_share"]

_BLOCK = 1 << 20


@dataclass(frozen=True)
class StorageResult:
    """Cold and warm read rates (bytes/s) of ``files`` files, ``nbytes`` in all;
    ``resident`` is the share of their pages cached just before the cold read (None when
    it cannot be told)."""

    directory: str
    cold: tuple[float, ...]
    warm: tuple[float, ...]
    files: int
    nbytes: int
    resident: float | None
    scratch: int


def _files(directory: Path, budget: int) -> Iterator[Path]:
    """Regular files under ``directory`` (sorted, depth first) until ``budget`` bytes."""
    total = 0
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for name in sorted(names):
            path = Path(root) / name
            try:
                if not path.is_file() or path.is_symlink():
                    continue
                size = path.stat().st_size
            except OSError:
                continue
            if size == 0:
                continue
            yield path
            total += size
            if total >= budget:
                return


def _drop(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _read(paths: list[Path], buf: bytearray, limit: int) -> tuple[int, float]:
    """Bytes read and seconds, reading every file to its end (at most ``limit`` bytes)."""
    view = memoryview(buf)
    total = 0
    t = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as fh:
            while total < limit:
                n = fh.readinto(view)
                if not n:
                    break
                total += n
    return total, time.perf_counter() - t


def resident_share(paths: list[Path]) -> float | None:
    """The share of the pages of ``paths`` in the page cache (``mincore``), or None."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    page = mmap.PAGESIZE
    resident = pages = 0
    for path in paths:
        size = path.stat().st_size
        if not size:
            continue
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY) as m:
            n = (size + page - 1) // page
            vec = (ctypes.c_ubyte * n)()
            start = ctypes.c_char.from_buffer(m)
            rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(start)), ctypes.c_size_t(size),
                              vec)
            del start  # the mapping closes only without exported pointers
            if rc != 0:
                return None
            resident += sum(v & 1 for v in vec)
            pages += n
    return resident / pages if pages else None


@contextlib.contextmanager
def _scratch(directory: Path, nbytes: int) -> Iterator[Path | None]:
    """A file of ``nbytes`` written and synced in ``directory`` (removed afterwards)."""
    if nbytes <= 0:
        yield None
        return
    path = directory / f".tunelab-bounds-{os.getpid()}.tmp"
    chunk = os.urandom(_BLOCK)
    try:
        with open(path, "wb") as fh:
            left = nbytes
            while left > 0:
                left -= fh.write(chunk[:min(left, _BLOCK)])
            fh.flush()
            os.fsync(fh.fileno())
        yield path
    except OSError as exc:
        raise TunelabError(f"cannot write a scratch file in {directory}: "
                           f"{exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            path.unlink()


def read_rates(directory: str | Path, *, nbytes: int, repeats: int = 2) -> StorageResult:
    """Cold and warm read rates of ``directory``'s files (``nbytes`` of them, made up with a
    scratch file where the directory holds less), ``repeats`` times each."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise TunelabError(f"storage: {root} is not a directory")
    paths = list(_files(root, nbytes))
    have = sum(p.stat().st_size for p in paths)
    buf = bytearray(_BLOCK)
    with _scratch(root, nbytes - have if have < nbytes else 0) as extra:
        if extra is not None:
            paths.append(extra)
        total = min(nbytes, sum(p.stat().st_size for p in paths))
        cold: list[float] = []
        warm: list[float] = []
        resident: float | None = None
        for _ in range(max(1, repeats)):
            for p in paths:
                _drop(p)
            share = resident_share(paths)
            resident = share if resident is None or share is None else max(resident, share)
            n, s = _read(paths, buf, total)
            cold.append(n / s)
            n, s = _read(paths, buf, total)
            warm.append(n / s)
    return StorageResult(str(root.resolve()), tuple(cold), tuple(warm), len(paths), total,
                         resident, nbytes - have if have < nbytes else 0)
