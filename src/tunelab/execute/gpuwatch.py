"""GPU neighbours: did another process compute on a GPU the run used, while it ran?

The noise watch (:mod:`tunelab.noise`) sees what others take of a run's CPU cores; a GPU
shared with another user's training slows a run as surely and shows nowhere on the CPU. Here
``nvidia-smi --query-compute-apps`` (the processes holding a compute context, per GPU) is
read as the run starts, while it runs (after 0.25 s, then at pauses doubling up to
:data:`SAMPLE_S` seconds), and when it ends (a run that used a GPU). A process is the run's
own when it descends from tunelab (every process of a run does: tunelab is their child
subreaper) or, in a batch job's step, carries the job's id in its environment (``srun``
starts tasks under ``slurmstepd``); another's when it is alive in this machine's ``/proc`` and
is neither (a process of another user hides its environment). A run is disturbed when
another process held a compute context on a GPU the run's own processes used.

What it cannot see: a process in another PID namespace (a container shows the host's pids,
or none): such pids are not in ``/proc`` and never count, so where even the run's own
processes are not found nothing is judged. A context is counted whether it computed or sat
idle (``nvidia-smi`` gives no per-process rate here): an idle neighbour is a false flag,
which only warns. Without ``nvidia-smi`` nothing is read.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass

from tunelab.execute.procs import environ_has, stat

__all__ = ["SAMPLE_S", "GpuProcess", "GpuRun", "GpuWatch", "compute_apps", "gpu_indexes"]

SAMPLE_S = 2.0
"""Seconds between two readings of the GPUs' processes while a run runs."""
_FIRST_S = 0.25
"""The first reading after the start; the pause doubles up to :data:`SAMPLE_S`."""
_TIMEOUT_S = 5.0
_MPS_SERVER = "nvidia-cuda-mps-server"
"""CUDA MPS's server holds the contexts of its clients, listed beside them: no neighbour."""


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a compute context on a GPU (its UUID), as ``nvidia-smi`` lists it."""

    gpu: str
    pid: int
    name: str


def _nvidia_smi(query: str) -> list[list[str]] | None:
    """``nvidia-smi --query-…=… --format=csv,noheader`` as rows of fields; None when it
    cannot say."""
    try:
        res = subprocess.run(["nvidia-smi", query, "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=_TIMEOUT_S,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None
    return [[f.strip() for f in line.split(",", 2)] for line in res.stdout.splitlines()
            if line.strip()]


def compute_apps() -> list[GpuProcess] | None:
    """The processes with a compute context on a GPU now; None when ``nvidia-smi`` cannot
    say. Rows cut short or without a pid (``[N/A]`` in a container) are left out, and so is
    CUDA MPS's server (its clients, a run's own or another's, are listed themselves)."""
    rows = _nvidia_smi("--query-compute-apps=gpu_uuid,pid,process_name")
    if rows is None:
        return None
    found = []
    for row in rows:
        if (len(row) == 3 and row[0].startswith("GPU-") and row[1].isdigit()
                and not row[2].endswith(_MPS_SERVER)):
            found.append(GpuProcess(row[0], int(row[1]), row[2]))
    return found


def gpu_indexes() -> dict[str, str]:
    """GPU UUID -> its index (``0``, ``1``, …), as ``nvidia-smi`` numbers them."""
    rows = _nvidia_smi("--query-gpu=uuid,index") or []
    return {row[0]: row[1] for row in rows if len(row) == 2}


def _is_own(pid: int, root: int, own_env: bytes | None) -> bool | None:
    """Whether ``pid`` is the run's: ``root`` or one of its descendants, or a process whose
    environment holds ``own_env`` (the job's id: ``srun`` starts a job's tasks under
    ``slurmstepd``, not under the step). None when ``pid`` is not alive in this machine's
    ``/proc`` (gone, or of another PID namespace)."""
    proc = stat(pid)
    if proc is None:
        return None
    for _ in range(4096):  # a ppid chain is shorter; a loop in a crafted /proc ends here
        if proc.pid == root:
            return True
        parent = stat(proc.ppid) if proc.ppid > 1 else None
        if parent is None:
            break
        proc = parent
    return own_env is not None and environ_has(pid, own_env)


class GpuRun:
    """The GPUs' processes read over one run (see the module docstring): started by
    :meth:`GpuWatch.start`, ended by :meth:`stop`."""

    def __init__(self, read: Callable[[], list[GpuProcess] | None], root: int,
                 own_env: bytes | None, every_s: float, names: dict[str, str]) -> None:
        self._read, self._root, self._own_env, self._names = read, root, own_env, names
        self._own_gpus: set[str] = set()
        self._others: dict[tuple[str, int], str] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(every_s,), daemon=True,
                                        name="tunelab-gpu-watch")
        self._thread.start()

    def _loop(self, every_s: float) -> None:
        self._sample()  # here, not before the run starts: nvidia-smi takes up to a second
        pause = min(_FIRST_S, every_s)  # a short run is read early, a long one every_s
        while not self._stopped.wait(pause):
            self._sample()
            pause = min(2 * pause, every_s)

    def _sample(self) -> None:
        apps = self._read()
        if apps is None:
            return
        seen = [(app, _is_own(app.pid, self._root, self._own_env)) for app in apps]
        with self._lock:
            for app, own in seen:
                if own:
                    self._own_gpus.add(app.gpu)
                elif own is False:
                    self._others[(app.gpu, app.pid)] = app.name

    def stop(self) -> str | None:
        """Read once more, stop reading, and say which other processes held a context on
        a GPU the run used ("pid 4242 (python3) on GPU 0"); None when none did, or when
        nothing could be read."""
        self._stopped.set()
        self._thread.join(timeout=1.0)
        if self._own_gpus and not self._thread.is_alive():  # (a hung reading holds no run up;
            self._sample()  # a run that used no GPU waits for no reading)
        with self._lock:
            others = sorted((self._names.get(gpu, gpu), pid, name)
                            for (gpu, pid), name in self._others.items()
                            if gpu in self._own_gpus)
        if not others:
            return None
        named = ", ".join(f"pid {pid} ({name.rsplit('/', 1)[-1]}) on GPU {gpu}"
                          for gpu, pid, name in others[:2])
        more = f" and {len(others) - 2} more" if len(others) > 2 else ""
        return f"another process computed on its GPU: {named}{more}"


class GpuWatch:
    """Starts a :class:`GpuRun` per run. :meth:`here` gives None where ``nvidia-smi`` is
    not installed. The run's processes descend from ``root`` (default: this process) or
    hold ``own_env`` in their environment (``b"\\0SLURM_JOB_ID=42\\0"``: a batch job's
    step, whose ``srun`` tasks are no children of it); ``read`` is injectable for tests."""

    def __init__(self, read: Callable[[], list[GpuProcess] | None] = compute_apps, *,
                 root: int | None = None, own_env: bytes | None = None,
                 every_s: float = SAMPLE_S, names: dict[str, str] | None = None) -> None:
        self._read, self._every_s, self._own_env = read, every_s, own_env
        self._root = os.getpid() if root is None else root
        self._names = gpu_indexes() if names is None else names

    @classmethod
    def here(cls, own_env: bytes | None = None) -> GpuWatch | None:
        """A watch of this machine's GPUs, or None without ``nvidia-smi``."""
        return cls(own_env=own_env) if shutil.which("nvidia-smi") else None

    def start(self) -> GpuRun:
        """Start reading the GPUs' processes for a run starting now."""
        return GpuRun(self._read, self._root, self._own_env, self._every_s, self._names)
