"""A run's private shared-memory directory: where its MPI and UCX programs keep the files that
back their shared memory, removed with everything in it once the run has ended.

Open MPI's shared-memory transport keeps one backing file per rank in ``/dev/shm`` (Open MPI
4.1: ``vader_segment.<host>.<job>.<rank>``, 4 MiB each) and unlinks them only when
``mpirun`` ends normally; a run killed on its timeout or by Ctrl-C leaves them there, in RAM,
counted against every later run. So each run gets a directory of its own,
``/dev/shm/tunelab-<study>-<run>`` (mode 0700, made just before the run starts), and its
environment points the backing files there (:data:`VARIABLES`) — except a variable the user
set, in the environment or in Open MPI's or UCX's configuration files, which always wins.

Open MPI 4's ``mpirun`` also keeps a session directory, ``ompi.<node>.<uid>/pid.<its pid>``
under ``orte_tmpdir_base`` (``$TMPDIR`` or ``/tmp``: RAM where ``/tmp`` is a tmpfs), with its
PMIx shared-memory store (8 MB apparent), and removes it only when it ends normally: a run
killed on its timeout left it (90 here, 731 MB). :func:`launchers` names a run's MPI launchers
while they live; :func:`remove_sessions` removes their session directories once they are gone.

Nothing is removed on a guess: a directory is removed only when it is one of this study's or
attempt's own (its name holds their token), after its run's processes are gone, and only when
no live process maps or holds open a file in it (:func:`tunelab.execute.procs.using`).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from tunelab.execute import procs

__all__ = ["LAUNCHERS", "ROOT", "SESSION_VARIABLES", "VARIABLES", "backing_env", "launchers",
           "leftovers", "make", "remove", "remove_sessions", "session_dirs"]

ROOT = Path("/dev/shm")
"""Where the private directories go (the tmpfs where Open MPI and UCX put theirs)."""
_PREFIX = "tunelab-"

VARIABLES: dict[str, str] = {
    # Open MPI 4: the shared-memory BTL; one-sided windows (sm, rdma)
    "OMPI_MCA_btl_vader_backing_directory": "btl_vader_backing_directory",
    # Open MPI 5: the BTL renamed sm
    "OMPI_MCA_btl_sm_backing_directory": "btl_sm_backing_directory",
    "OMPI_MCA_osc_sm_backing_directory": "osc_sm_backing_directory",
    "OMPI_MCA_osc_rdma_backing_directory": "osc_rdma_backing_directory",
    # UCX's POSIX shared-memory transport
    "UCX_POSIX_DIR": "UCX_POSIX_DIR",
}
"""Variable -> the name under which Open MPI's or UCX's configuration files set it."""


def make(token: str, run: str) -> Path | None:
    """Make the private directory of run ``run`` of the study or attempt ``token``; None
    where ``/dev/shm`` is missing or not writable (the run then goes on without one). A
    directory of that name left by an earlier attempt is removed first when no process uses
    it; else None."""
    path = ROOT / f"{_PREFIX}{token}-{run}"
    for _ in range(2):
        try:
            path.mkdir(mode=0o700)
            return path
        except FileExistsError:
            if not remove(path):
                return None
        except OSError:
            return None
    return None


def backing_env(directory: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The variables that point backing files into ``directory``: each of :data:`VARIABLES`
    that the user has not set — in ``env`` (the run's environment) or in an Open MPI or UCX
    configuration file that ``env`` names or that sits where they read one."""
    configured = set(_configured(env))
    return {var: str(directory) for var, key in VARIABLES.items()
            if var not in env and key not in configured}


def remove(directory: Path) -> bool:
    """Remove ``directory`` and everything in it, unless a live process maps or holds open a
    file in it (then nothing is removed). True when it is gone."""
    try:
        empty = not any(directory.iterdir())
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if not empty and procs.using(directory):
        return False
    shutil.rmtree(directory, ignore_errors=True)
    return not directory.exists()


def leftovers(token: str) -> list[Path]:
    """The private directories of the study or attempt ``token`` (of any of its runs)."""
    try:
        return sorted(ROOT.glob(f"{_PREFIX}{token}-*"))
    except OSError:
        return []


SESSION_VARIABLES = ("OMPI_MCA_orte_tmpdir_base", "TMPDIR")
"""The variables that say where an Open MPI launcher keeps its session directory."""

LAUNCHERS = frozenset({"mpirun", "mpiexec", "orterun"})
"""Names (``/proc/PID/comm``) of the Open MPI launchers whose session directories
:func:`remove_sessions` removes."""


def launchers(pids: Iterable[int]) -> list[int]:
    """Those of ``pids`` that are Open MPI launchers (:data:`LAUNCHERS`) now."""
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
                if f.read().strip() in LAUNCHERS:
                    found.append(pid)
        except OSError:
            continue
    return found


def session_dirs(pids: Iterable[int], env: Mapping[str, str]) -> list[Path]:
    """The session directories the Open MPI launchers ``pids`` (run with environment ``env``)
    keep: ``<orte_tmpdir_base>/ompi.<node>.<uid>/pid.<pid>``."""
    base = env.get("OMPI_MCA_orte_tmpdir_base") or env.get("TMPDIR") or "/tmp"
    top = Path(base) / f"ompi.{os.uname().nodename}.{os.getuid()}"
    return [top / f"pid.{pid}" for pid in pids]


def remove_sessions(pids: Iterable[int], env: Mapping[str, str]) -> list[Path]:
    """Remove the session directories of the Open MPI launchers ``pids`` once each launcher is
    gone, where no live process uses a file in it; those removed."""
    pids = list(pids)
    removed = []
    for pid, directory in zip(pids, session_dirs(pids, env), strict=True):
        if procs.stat(pid) is not None or not directory.is_dir() or directory.is_symlink():
            continue  # the launcher lives (or its pid was taken again), or nothing is left
        if procs.using(directory):
            continue
        shutil.rmtree(directory, ignore_errors=True)
        if not directory.exists():
            removed.append(directory)
    return removed


# --- the user's own settings ----------------------------------------------------------------

_SETTING = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=")
_MAX_CONFIG_BYTES = 1 << 20


def _configured(env: Mapping[str, str]) -> Iterator[str]:
    """Names set in the configuration files Open MPI and UCX read (env overrides them, so
    tunelab's variables would override the user's setting there)."""
    for path in _config_files(env):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read(_MAX_CONFIG_BYTES)
        except OSError:
            continue
        for line in text.splitlines():
            match = _SETTING.match(line)
            if match:
                yield match.group(1)


def _config_files(env: Mapping[str, str]) -> list[Path]:
    files = [Path("/etc/openmpi/openmpi-mca-params.conf"), Path("/etc/openmpi-mca-params.conf"),
             Path("/etc/ucx/ucx.conf")]
    if env.get("HOME"):
        files.append(Path(env["HOME"]) / ".openmpi" / "mca-params.conf")
    for prefix in (env.get("OPAL_PREFIX"), env.get("UCX_HOME")):
        if prefix:
            files += [Path(prefix) / "etc" / "openmpi-mca-params.conf",
                      Path(prefix) / "etc" / "ucx" / "ucx.conf"]
    for name in ("OMPI_MCA_mca_base_param_files", "UCX_CONFIG_FILE"):
        files += [Path(p) for p in env.get(name, "").split(os.pathsep) if p]
    return files
