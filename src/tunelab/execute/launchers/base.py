"""The launcher contract: submit, poll, collect, cancel.

A launcher runs :class:`Job` objects — one run (``per-run`` mode) or many runs one after
another in one allocation (``pack`` mode) — somewhere, and reports how they went. Rules:

* **Only the controller writes the store.** A job leaves its results in each run's
  directory: ``stdout.txt``, ``stderr.txt``, ``started.json`` when the run began and
  ``exit.json`` (status, exit code, wall time measured inside the job, host) when it ended,
  written atomically. :meth:`Launcher.collect` reads them; a run that has a ``started.json``
  but no ``exit.json`` after its job ended was cut off (walltime, ``scancel``, node failure)
  and the scheduler's word for the job's end (``TIMEOUT``, ``CANCELLED``, ``NODE_FAIL``)
  becomes its reason.
* :meth:`Launcher.submit` returns the scheduler's job id; the controller stores it, so a
  controller killed with ``kill -9`` re-attaches to its jobs when started again. Jobs are
  named ``tunelab-<token>``, and :meth:`Launcher.find` finds a job by that name when the
  controller died between submitting and storing the id.
* :meth:`Launcher.poll` never raises for a job the scheduler forgot: it reports
  ``unknown``, and the exit-status files decide.
* Launcher objects are not shared between threads.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from tunelab.cluster.mpi import Placement
from tunelab.errors import LaunchError
from tunelab.execute.launchers.config import LauncherConfig
from tunelab.workload import Needs

__all__ = [
    "EXIT_FILE",
    "STARTED_FILE",
    "Job",
    "JobStatus",
    "Launcher",
    "Outcome",
    "RunRequest",
    "local_cores",
    "read_exit_status",
    "write_json_atomic",
]

EXIT_FILE = "exit.json"
STARTED_FILE = "started.json"
JOB_PREFIX = "tunelab-"

Status = Literal["ok", "failed", "timeout", "stopped", "lost"]
Phase = Literal["queued", "running", "ended", "unknown"]

#: Scheduler states that end a job, and what a run cut off by them is recorded as.
ENDED_STATES = {
    "COMPLETED": "failed", "FAILED": "failed", "CANCELLED": "failed", "TIMEOUT": "timeout",
    "NODE_FAIL": "failed", "OUT_OF_MEMORY": "failed", "PREEMPTED": "failed",
    "BOOT_FAIL": "failed", "DEADLINE": "timeout", "SPECIAL_EXIT": "failed",
}


@dataclass(frozen=True)
class Outcome:
    """How a run ended: status, exit code (None after a timeout), wall time, and — when it
    ran inside a job — where and when."""

    status: Status
    rc: int | None
    wall_s: float
    host: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    reason: str | None = None
    noise: Mapping[str, float | str | None] | None = None
    """How busy the machine was around the run (:mod:`tunelab.noise`), when watched."""


@dataclass(frozen=True)
class RunRequest:
    """One run as a launcher sees it: what to execute, where, and what it needs."""

    point_key: str
    repeat: int
    run_dir: Path
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path
    timeout_s: float
    needs: Needs = field(default_factory=Needs)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the job step reads it on the compute node)."""
        return {"point_key": self.point_key, "repeat": self.repeat,
                "run_dir": str(self.run_dir), "argv": list(self.argv), "env": dict(self.env),
                "cwd": str(self.cwd), "timeout_s": self.timeout_s,
                "needs": {"ranks": self.needs.ranks, "nodes": self.needs.nodes,
                          "threads": self.needs.threads, "memory": self.needs.memory}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunRequest:
        """The inverse of :meth:`to_json`."""
        return cls(str(data["point_key"]), int(data["repeat"]), Path(data["run_dir"]),
                   tuple(str(a) for a in data["argv"]),
                   {str(k): str(v) for k, v in data["env"].items()}, Path(data["cwd"]),
                   float(data["timeout_s"]), Needs(**data["needs"]))


@dataclass(frozen=True)
class Job:
    """A batch job: a token (unique in the study) and the runs it executes in order."""

    token: str
    runs: tuple[RunRequest, ...]
    jobs_dir: Path

    @property
    def name(self) -> str:
        """The scheduler's job name."""
        return f"{JOB_PREFIX}{self.token}"

    @property
    def spec_path(self) -> Path:
        """The job's description, read by the job step (``python -m
        tunelab.execute.launchers.step``)."""
        return self.jobs_dir / f"{self.token}.json"

    @property
    def output_path(self) -> Path:
        """Where the scheduler writes the job's own stdout and stderr."""
        return self.jobs_dir / f"{self.token}.out"

    @property
    def script_path(self) -> Path:
        """The submitted job script."""
        return self.jobs_dir / f"{self.token}.sh"

    def needs(self) -> Needs:
        """The allocation that fits every run: the largest nodes, ranks per node, threads."""
        nodes = max(r.needs.nodes for r in self.runs)
        per_node = max(r.needs.ranks_per_node for r in self.runs)
        threads = max(r.needs.threads for r in self.runs)
        memory = next((r.needs.memory for r in self.runs if r.needs.memory), None)
        return Needs(max(nodes * per_node, nodes), nodes, threads, memory)

    def write_spec(self, python: str) -> None:
        """Write the job description the job step reads."""
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.spec_path, {
            "token": self.token, "python": python,
            "runs": [r.to_json() for r in self.runs]})


@dataclass(frozen=True)
class JobStatus:
    """Where a job is: ``queued``, ``running``, ``ended`` or ``unknown`` (the scheduler
    no longer knows it), with the scheduler's state word (``PENDING``, ``TIMEOUT``…)."""

    phase: Phase
    state: str = ""
    reason: str = ""
    """Why a queued job waits, in the scheduler's words (Slurm's ``%r``), when it says."""
    blocked: bool = False
    """The scheduler says the queued job cannot start on the cluster as it is now (its
    nodes are down, drained or unavailable)."""

    @property
    def ended(self) -> bool:
        """True once the job will not run anything more."""
        return self.phase in ("ended", "unknown")


class Launcher(ABC):
    """Runs jobs somewhere: this machine, a Slurm or a PBS cluster."""

    name: ClassVar[str]
    #: False for the local launcher, whose submit runs the job to its end.
    batch: ClassVar[bool] = True

    def __init__(self, config: LauncherConfig) -> None:
        self.config = config

    @property
    def cores_per_node(self) -> int:
        """Cores of one node: the configured ``cores_per_node``, else, for a launcher that
        runs here, the cores this process may use (:func:`local_cores`), else this
        machine's count (a batch node's guess)."""
        if self.config.cores_per_node:
            return self.config.cores_per_node
        return local_cores() if not self.batch else os.cpu_count() or 1

    def placement(self, needs: Needs, run_dir: Path) -> Placement:
        """Where a run with ``needs`` puts its processes (this machine, for a launcher that
        does not submit to a scheduler)."""
        if not self.batch:
            return Placement()
        site = self.config.site_profile(self.name)
        return Placement("job", self.config.starter_for(self.name), needs.nodes,
                         self.cores_per_node, run_dir / "hostfile", site.mpi)

    def check(self, shapes: Sequence[Job]) -> None:  # noqa: B027 - optional hook
        """Raise :class:`LaunchError` before anything runs when jobs like ``shapes`` would
        be refused (missing commands, an invalid account, limits of the partition)."""

    @abstractmethod
    def submit(self, job: Job) -> str:
        """Submit ``job``; return the scheduler's job id. Raise :class:`LaunchError` with
        the scheduler's message when it refuses."""

    @abstractmethod
    def poll(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """The status of each job id."""

    @abstractmethod
    def cancel(self, job_ids: Sequence[str]) -> None:
        """Cancel these jobs (ended or unknown ones are ignored)."""

    def find(self, job: Job) -> str | None:
        """The id of a queued or running job named ``job.name``, if there is one."""
        return None

    def collect(self, run: RunRequest) -> Outcome | None:
        """The outcome a job left in ``run``'s directory, or None when it has not ended."""
        return read_exit_status(run.run_dir)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that a reader sees the old file, or the whole new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def read_exit_status(run_dir: Path) -> Outcome | None:
    """The run's ``exit.json`` as an :class:`Outcome`; None when absent. A file that is
    not a complete exit status gives a ``failed`` outcome that says so."""
    path = run_dir / EXIT_FILE
    try:
        data = json.loads(path.read_text())
        status = data["status"]
        if status not in ("ok", "failed", "timeout", "lost"):
            raise ValueError(f"unknown status {status!r}")
        rc = data.get("rc")
        noise = data.get("noise")
        return Outcome(status, int(rc) if rc is not None else None, float(data["wall_s"]),
                       data.get("host"), data.get("started_at"), data.get("ended_at"),
                       data.get("reason"), noise if isinstance(noise, dict) else None)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return Outcome("failed", None, 0.0, reason=f"unreadable exit-status file {path}: {exc}")


def started_info(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``started.json`` (the job step began it), or None."""
    try:
        data = json.loads((run_dir / STARTED_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def require(name: str, package: str) -> None:
    """A one-line :class:`LaunchError` when the scheduler command ``name`` is missing."""
    import shutil

    if shutil.which(name) is None:
        raise LaunchError(f"{name!r} is not on PATH: this machine cannot submit to the "
                          f"scheduler (install {package}, or run tunelab on the login node)")


def local_cores() -> int:
    """The cores this process may run on — its affinity, as ``taskset`` or a batch job's
    cgroup sets it — not the machine's count: runs sized by ``os.cpu_count()`` under
    ``taskset -c 0`` on 2 cores ran 2 threads on one core."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
