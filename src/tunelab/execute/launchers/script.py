"""One job-script renderer (jinja2 templates per scheduler) for submission and ``tunelab
script``.

A :class:`JobScript` holds what a job asks for (nodes, tasks per node, cpus per task,
memory, walltime, account, partition, modules, extra directives, environment, whole nodes or
not) and the shell lines it runs; :func:`render` turns it into a Slurm (``#SBATCH``) or PBS
(``#PBS``) script. The dialect comes from the site (:mod:`tunelab.execute.launchers.sites`)
as plain fields: for PBS, ``pbs_resources`` picks the resource syntax — ``ncpus`` (Gadi:
total cores, as in the seed's ``#PBS -l ncpus=40``), ``select`` (PBS Pro chunks, with
``place=scatter`` over several nodes and ``excl`` for whole nodes) or ``nodes`` (Torque) —
and ``workdir_mode`` how the job gets into its directory (``cd``, Gadi's ``-l wd``, or ``cd
"$PBS_O_WORKDIR"``).

The body runs under ``set -euo pipefail``; a ``module load`` that fails (or a shell without
``module``) stops the job with one line naming the module and the host.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

import jinja2

from tunelab.errors import LaunchError

__all__ = ["SCHEDULERS", "JobScript", "format_walltime", "render", "suggest_walltime"]

SCHEDULERS = ("slurm", "pbs")


@dataclass(frozen=True)
class JobScript:
    """Everything a job script says. ``body`` lines are shell, already quoted."""

    scheduler: str
    name: str
    walltime_s: float
    body: tuple[str, ...]
    nodes: int = 1
    tasks_per_node: int = 1
    cpus_per_task: int = 1
    memory: str | None = None
    account: str | None = None
    partition: str | None = None
    modules: tuple[str, ...] = ()
    directives: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    output: str | None = None
    no_requeue: bool = False
    pbs_resources: Literal["ncpus", "select", "nodes"] = "ncpus"
    workdir_mode: Literal["cd", "wd", "pbs_o_workdir"] = "wd"
    account_flag: str = "-P"
    exclusive: bool = False
    """Ask for whole nodes (nobody else's jobs on them)."""
    cores_per_node: int | None = None
    """The nodes' cores: an exclusive ``ncpus`` request asks for whole nodes' worth."""

    @property
    def place(self) -> str:
        """PBS Pro's ``place`` value: ``scatter`` over several nodes, ``excl`` for whole
        nodes (empty: no ``place`` line)."""
        return ":".join([*(["scatter"] if self.nodes > 1 else []),
                         *(["excl"] if self.exclusive else [])])

    @property
    def ncpus(self) -> int:
        """Gadi's ``ncpus``: the cores asked for, whole nodes' worth when exclusive."""
        cores = self.nodes * self.tasks_per_node * self.cpus_per_task
        if self.exclusive and self.cores_per_node:
            cores = max(cores, self.nodes * self.cores_per_node)
        return cores


def format_walltime(seconds: float) -> str:
    """``HH:MM:SS`` for a number of seconds, rounded up to the next whole second."""
    if not math.isfinite(seconds) or seconds <= 0:
        raise LaunchError(f"walltime must be a positive number of seconds, got {seconds}")
    total = math.ceil(seconds)
    return f"{total // 3600:02d}:{total % 3600 // 60:02d}:{total % 60:02d}"


def suggest_walltime(measured_s: float, factor: float = 3.0, minimum_s: float = 600.0) -> float:
    """A walltime request for a run measured at ``measured_s``: ``factor`` times that,
    rounded up to whole minutes, and at least ``minimum_s``."""
    return max(minimum_s, math.ceil(measured_s * factor / 60.0) * 60.0)


def _slurm_memory(value: str) -> str:
    """``190GB`` → ``190G`` (Slurm's units have no B)."""
    text = value.strip().replace(" ", "")
    return re.sub(r"(?i)i?b$", "", text) if re.search(r"[A-Za-z]", text) else text


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("tunelab.execute.launchers", "templates"),
        autoescape=False,  # shell, not HTML: values are quoted with the quote filter
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["quote"] = lambda v: shlex.quote(str(v))
    env.filters["in_dquotes"] = lambda v: re.sub(r'([\\"$`])', r"\\\1", str(v))
    env.filters["slurm_memory"] = _slurm_memory
    return env


def render(job: JobScript) -> str:
    """The job script text for ``job.scheduler`` (``slurm`` or ``pbs``)."""
    if job.scheduler not in SCHEDULERS:
        raise LaunchError(f"unknown scheduler {job.scheduler!r}; choose one of: "
                          f"{', '.join(SCHEDULERS)}")
    for line in (*job.modules, *job.directives, job.name, job.account or "",
                 job.partition or "", job.memory or ""):
        if "\n" in line or "\r" in line:
            raise LaunchError(f"job script value {line!r} spans lines")
    template = _environment().get_template(f"{job.scheduler}.sh.j2")
    context: dict[str, Any] = {"job": job, "walltime": format_walltime(job.walltime_s)}
    return template.render(context)
