"""Checks the runner makes at its edges, so a fault ends in one line and never in a wedge.

* :func:`check_study_dir` — before the lock is taken: the study directory, its lock file and
  its ``runs`` (and ``jobs``) directories are what they should be and writable.
* :func:`command_problem` — before a run starts: an argv or environment that no program can
  be started with (NUL characters, ``=`` in a name, a missing working directory) fails that
  run with the reason, instead of an exception that would stop the study at the same run on
  every resume.
* :func:`check_run_dir` — after a run: if its directory or output files stopped being
  writable, or the disk filled up, the run's failure may be the file system's doing, so the
  study stops (the run is not stored; resuming runs it again) instead of blaming the run.
* :func:`overridden_env` — when a run is prepared: the variables the workload sets (its
  threads: ``OMP_NUM_THREADS``) over another value in tunelab's own environment or the
  point's env set, in words, so that ``tunelab run`` says so once instead of silently
  running 2 threads where the user's shell says 1.
* :func:`read_output` — a run's output read for parsing within ``LIMITS.output_parse_bytes``.
* :func:`split_finite` — figures of merit that are NaN or infinite, or too large or too
  small for the statistics (``LIMITS.fom_magnitude``), make the run fail (``figure of merit
  'v' is not finite: nan``); they are never stored.
* :func:`write_fault` — an ``OSError`` while writing the study directory (read-only, full,
  permissions) as one :class:`~tunelab.errors.StoreError` naming the path, saying that the
  finished runs are kept and the study resumes.
"""

from __future__ import annotations

import errno
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from tunelab.errors import StoreError
from tunelab.limits import LIMITS

__all__ = ["check_run_dir", "check_study_dir", "command_problem", "read_output",
           "split_finite", "write_fault"]

_LOCK_NAME = ".tunelab.lock"
_RUNS_NAME = "runs"
_JOBS_NAME = "jobs"


def write_fault(exc: OSError, path: Path | str | None = None) -> StoreError:
    """``exc`` (raised while writing ``path``) as the one line that stops the study; when
    the study directory itself is gone (``rm -rf`` while the study ran), that is said, and
    not that the finished runs are stored: they went with it."""
    where = exc.filename or path or "the study directory"
    reason = exc.strerror or str(exc)
    gone = _deleted_study(Path(where)) if exc.errno == errno.ENOENT else None
    if gone is not None:
        return StoreError(f"cannot write {where}: the study directory {gone} was deleted "
                          "while the study ran, and the runs stored in it with it; run the "
                          "same command again to start the study over")
    if exc.errno == errno.ENOSPC:
        reason = "no space left on the device"
    return StoreError(f"cannot write {where}: {reason}; the finished runs are stored, fix "
                      "this and run the same command again to resume")


def _deleted_study(path: Path) -> Path | None:
    """The study directory that held ``path`` (in its ``runs`` or ``jobs`` directory), when
    that directory is gone; else None."""
    for folder in (path, *path.parents):
        if folder.name in (_RUNS_NAME, _JOBS_NAME):
            return None if folder.parent.exists() else folder.parent
    return None


def check_study_dir(study_dir: Path) -> None:
    """Make sure ``study_dir`` can hold a running study: a writable directory whose lock file
    and ``runs`` entry, when present, are a regular file and a directory."""
    if study_dir.exists() and not study_dir.is_dir():
        raise StoreError(f"{study_dir}: exists and is not a directory; use another --dir")
    try:
        study_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # nothing ran yet: there is nothing stored to resume
        reason = "no space left on the device" if exc.errno == errno.ENOSPC else (
            exc.strerror or str(exc))
        raise StoreError(f"cannot make the study directory {study_dir}: {reason}; use "
                         "another --dir") from None
    lock = study_dir / _LOCK_NAME
    if lock.is_symlink() or (lock.exists() and not lock.is_file()):
        raise StoreError(f"{lock}: is not a regular file (tunelab's lock file); remove it")
    runs = study_dir / _RUNS_NAME
    if runs.is_symlink() or (runs.exists() and not runs.is_dir()):
        raise StoreError(f"{runs}: is not a directory (tunelab keeps each run's files "
                         "there); remove or rename it")
    jobs = study_dir / _JOBS_NAME
    if jobs.is_symlink() or (jobs.exists() and not jobs.is_dir()):
        raise StoreError(f"{jobs}: is not a directory (tunelab keeps batch job scripts "
                         "there); remove or rename it")
    try:
        runs.mkdir(exist_ok=True)
    except OSError as exc:
        raise write_fault(exc, runs) from None
    if not os.access(study_dir, os.W_OK | os.X_OK) or not os.access(runs, os.W_OK | os.X_OK):
        bad = study_dir if not os.access(study_dir, os.W_OK | os.X_OK) else runs
        raise StoreError(f"{bad}: not writable; `tunelab run` needs to write there (the "
                         "read-only commands status, compare, best, report -o and export work)")


_MIN_FREE_BYTES = 64 << 10


def check_run_dir(run_dir: Path, *files: Path) -> None:
    """Raise the write fault that stops the study when ``run_dir`` or ``files`` are no
    longer writable or their file system is (nearly) full."""
    for path in (run_dir, *files):
        if path.exists() and not os.access(path, os.W_OK):
            raise write_fault(PermissionError(errno.EPERM, "it became read-only or immutable "
                                              "during the run", str(path)))
    try:
        fs = os.statvfs(run_dir)
    except OSError as exc:
        raise write_fault(exc, run_dir) from None
    if fs.f_bavail * fs.f_frsize < _MIN_FREE_BYTES:
        raise write_fault(OSError(errno.ENOSPC, "no space left on the device", str(run_dir)))


def command_problem(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> str | None:
    """Why no program can be started with this argv, environment and working directory; or
    None when it can be tried."""
    if not argv:
        return "the command is empty"
    for index, arg in enumerate(argv):
        if "\x00" in arg:
            return f"argv[{index}] {arg!r} holds a NUL character"
    for name, value in env.items():
        if not name or "=" in name or "\x00" in name:
            return f"environment variable name {name!r} is empty or holds '=' or NUL"
        if "\x00" in value:
            return f"the value of environment variable {name} holds a NUL character"
    if not os.path.isdir(cwd):  # False, never an error, for a name too long or closed
        return f"the working directory {cwd} does not exist or is not a directory"
    return None


def overridden_env(workload_env: Mapping[str, str], env_set: Mapping[str, str],
                   inherited: Mapping[str, str]) -> list[str]:
    """Each variable the workload's command sets (``workload_env``) to another value than the
    env set gives it, or, without one there, than the environment the run would inherit
    (``inherited``: tunelab's own): ``OMP_NUM_THREADS=2 (this shell's: 1)``."""
    said = []
    for name, value in sorted(workload_env.items()):
        if name in env_set:
            if env_set[name] != value:
                said.append(f"{name}={value} (the env set's: {env_set[name]})")
        elif name in inherited and inherited[name] != value:
            said.append(f"{name}={value} (this shell's: {inherited[name]})")
    return said


def override_note(workload: str, said: Sequence[str]) -> str:
    """The note ``tunelab run`` (and ``--dry-run``) gives for :func:`overridden_env`."""
    return (f"{workload}: its runs set {', '.join(said)}: the workload sets these itself (its "
            "threads come from the cores a run may use; its threads option or parameter "
            "chooses them), and each run's record keeps what it set")


def read_output(path: Path) -> str:
    """The text of a run's output file for parsing: all of it up to
    ``LIMITS.output_parse_bytes``, else its first and last halves with a marker line between;
    empty if it cannot be read."""
    limit = LIMITS.output_parse_bytes
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size <= limit:
                blob = f.read(limit)
            else:
                head = f.read(limit // 2)
                f.seek(size - limit // 2)
                blob = (head + f"\n[... {size - limit:,} bytes not read ...]\n".encode()
                        + f.read(limit // 2))
    except OSError:
        return ""
    return blob.decode(errors="replace")


def split_finite(foms: Mapping[str, float]) -> tuple[dict[str, float], str | None]:
    """The figures of merit tunelab can compute with, and the failure reason naming the
    first it cannot (NaN, infinite, or a magnitude beyond ``LIMITS.fom_magnitude``), or
    None."""
    finite = {k: v for k, v in foms.items() if _in_range(v)}
    bad = next((k for k in foms if k not in finite), None)
    if bad is None:
        return finite, None
    value = foms[bad]
    if not math.isfinite(value):
        return finite, f"figure of merit {bad!r} is not finite: {value}"
    top = LIMITS.fom_magnitude
    return finite, (f"figure of merit {bad!r} is out of range: {value:g} (tunelab computes "
                    f"with magnitudes from {1 / top:g} to {top:g}, or 0; print it in other "
                    "units)")


def _in_range(value: float) -> bool:
    """Finite, and 0 or of a magnitude within ``LIMITS.fom_magnitude`` and its inverse."""
    size = abs(value)
    return size == 0 or 1 / LIMITS.fom_magnitude <= size <= LIMITS.fom_magnitude
