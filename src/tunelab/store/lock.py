"""The study directory's lock: one ``tunelab run`` at a time works in a study directory."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from tunelab.errors import StoreError

__all__ = ["StudyLock"]


class StudyLock:
    """An exclusive lock on a study directory, held while one ``tunelab run`` works in it.

    Uses ``flock`` on ``DIR/.tunelab.lock``: the kernel releases it when the process dies,
    so a ``kill -9`` never leaves a stale lock.
    """

    def __init__(self, study_dir: Path) -> None:
        self.path = Path(study_dir) / ".tunelab.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`StoreError` naming the holder."""
        try:
            holder = self.try_acquire()
        except OSError as exc:
            raise StoreError(f"cannot open the lock file {self.path}: "
                             f"{exc.strerror or exc}") from None
        if holder is not None:
            raise StoreError(
                f"{self.path.parent}: another tunelab run (pid {holder}) is working in this "
                "study directory; wait for it or use another --dir"
            )

    def try_acquire(self) -> str | None:
        """Take the lock if it is free and return None; else return the holder's pid as
        its lock file says (``unknown`` where it says none), without waiting. Raises
        :class:`OSError` when the lock file cannot be opened (e.g. a read-only directory)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            finally:
                os.close(fd)
        except OSError:
            os.close(fd)
            raise
        with suppress(OSError):  # a lock file that cannot hold the pid still locks
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return None

    def release(self) -> None:
        """Release the lock."""
        if self._fd is not None:
            with suppress(OSError):
                os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lock for the duration of a ``with`` block."""
        self.acquire()
        try:
            yield
        finally:
            self.release()
