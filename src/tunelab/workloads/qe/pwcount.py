"""Ask pw.x itself how many k-points it distributes, and remember the answer.

:func:`count_with_pw` starts a serial pw.x on a staged copy of the input and reads its output
as it comes: pw.x prints "number of k points=" in its summary, before the expensive set-up of
wavefunctions and potentials, so the process is stopped (its whole process group killed) as
soon as that line appears — about a second even for inputs whose SCF would take hours. For
spin-polarised collinear runs pw.x prints the count of one spin; the count returned is that
of both, the number pw.x divides among pools.

Answers are cached per input text and pw.x executable (path, size, modification time) in
:func:`kpoint_cache_dir`, with the version pw.x printed; ``space`` and ``--dry-run`` read the
cache but never start pw.x. An input that reads an earlier run's data is counted once that
data exists: by the first run after the preparation, on a copy of the outdir it left.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tunelab.errors import WorkloadError
from tunelab.workloads.qe.pwinput import STAGED_OUTDIR, PwInput, stage_input

__all__ = ["PwCount", "cached_count", "count_with_pw", "kpoint_cache_dir"]

PROBE_TIMEOUT_S = 60.0
_NK = re.compile(r"number of k points=\s*(\d+)")
_VERSION = re.compile(r"Program PWSCF v\.(\S+)")
_MAX_LINES = 100_000


@dataclass(frozen=True)
class PwCount:
    """pw.x's answer: the k-points it distributes (``count``), what it printed
    (``printed``, per spin for LSDA) and its version."""

    count: int
    printed: int
    version: str


def kpoint_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/tunelab/qe-kpoints`` (else ``~/.cache/tunelab/qe-kpoints``)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "tunelab" / "qe-kpoints"


def _key(inp: PwInput, exe: str, context: str = "") -> str:
    st = os.stat(exe)
    ident = f"{os.path.realpath(exe)}\0{st.st_size}\0{st.st_mtime_ns}\0"
    return hashlib.sha256(ident.encode() + inp.text.encode() + context.encode()
                          ).hexdigest()[:32]


def cached_count(inp: PwInput, pw: str, context: str = "") -> PwCount | None:
    """The cached answer of this pw.x for this input (and ``context``: what the outdir it
    was counted on came from), None when there is none."""
    exe = shutil.which(pw)
    if exe is None:
        return None
    path = kpoint_cache_dir() / f"{_key(inp, exe, context)}.json"
    try:
        data = json.loads(path.read_text())
        return PwCount(int(data["count"]), int(data["printed"]), str(data["version"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _store(inp: PwInput, exe: str, answer: PwCount, context: str) -> None:
    directory = kpoint_cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{_key(inp, exe, context)}.json"
        part = path.with_name(f"{path.name}.part{os.getpid()}")
        part.write_text(json.dumps({"count": answer.count, "printed": answer.printed,
                                    "version": answer.version, "input": str(inp.path)}))
        os.replace(part, path)
    except OSError:
        pass  # a cache that cannot be written only costs a second next time


def count_with_pw(inp: PwInput, pseudos: Mapping[str, Path], pw: str = "pw.x",
                  timeout_s: float = PROBE_TIMEOUT_S, *, outdir: Path | None = None,
                  context: str = "") -> PwCount | None:
    """pw.x's own count for ``inp`` (cached); None when pw.x is missing, fails before it
    counts, or takes longer than ``timeout_s`` to get there.

    An input that reads an earlier run's data (nscf, bands, a restart) is counted on a copy
    of ``outdir``, the data the preparation left; ``context`` names that preparation in the
    cache (see :func:`cached_count`)."""
    exe = shutil.which(pw)
    if exe is None:
        return None
    cached = cached_count(inp, pw, context)
    if cached is not None:
        return cached
    with tempfile.TemporaryDirectory(prefix="tunelab-qe-nk-") as tmp:
        try:
            if outdir is not None:
                shutil.copytree(outdir, Path(tmp) / STAGED_OUTDIR)
            staged = stage_input(inp, Path(tmp), pseudos, "probe.in")
        except (WorkloadError, OSError):
            return None
        answer = _run_until_counted(exe, staged, Path(tmp), timeout_s)
    if answer is None:
        return None
    printed, version = answer
    result = PwCount(printed * (2 if inp.lsda else 1), printed, version)
    _store(inp, exe, result, context)
    return result


def _run_until_counted(exe: str, staged: Path, cwd: Path, timeout_s: float
                       ) -> tuple[int, str] | None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        proc = subprocess.Popen(
            [exe, "-inp", staged.name], cwd=cwd, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
            start_new_session=True,
        )
    except OSError:
        return None
    watchdog = threading.Timer(timeout_s, _kill_group, (proc,))  # a silent, hung pw.x
    watchdog.start()
    version = "?"
    found: int | None = None
    try:
        assert proc.stdout is not None
        for n, line in enumerate(proc.stdout):
            if m := _VERSION.search(line):
                version = m.group(1)
            if m := _NK.search(line):
                found = int(m.group(1))
                break
            if n > _MAX_LINES:
                break
    finally:
        watchdog.cancel()
        _kill_group(proc)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    return (found, version) if found is not None else None


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
