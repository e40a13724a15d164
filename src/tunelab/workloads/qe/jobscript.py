"""Batch job scripts (PBS Pro, Slurm) for one pw.x configuration.

The rendering follows the PBS script of the APAC HPC-AI 2022 QE campaign::

    #!/bin/bash
    #PBS -l walltime=00:10:00
    #PBS -l ncpus=40
    #PBS -l mem=190GB
    #PBS -l software=qe
    #PBS -l wd
    #PBS -P jx00
    #PBS -N QE-single

    module load qe
    export OMP_NUM_THREADS=1
    mpirun -np 40 pw.x -npool 20 -ndiag 4 -inp CeO2.in

:func:`render_job_script` is pure (a point and resources in, text out); submitting is not
done here.
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tunelab.errors import WorkloadError

__all__ = [
    "SCHEDULERS",
    "JobResources",
    "format_walltime",
    "render_for_workload",
    "render_job_script",
    "suggest_walltime",
]

SCHEDULERS = ("pbs", "slurm")


@dataclass(frozen=True)
class JobResources:
    """What a job asks the scheduler for, besides the cores (taken from the point).

    ``mem`` is written as given for PBS (``190GB``) and with a trailing ``B`` dropped for
    Slurm (``190G``). ``cores_per_node`` (when known) sets Slurm's ``--nodes``; PBS Pro asks
    for total ``ncpus`` as in the seed script. ``directives`` are extra lines' bodies
    (for PBS e.g. ``-l software=qe``, ``-l storage=gdata/ab12``; for Slurm e.g.
    ``--exclusive``).
    """

    walltime_s: float = 600.0
    mem: str | None = None
    project: str | None = None
    queue: str | None = None
    job_name: str = "tunelab-qe"
    modules: tuple[str, ...] = ("qe",)
    cores_per_node: int | None = None
    directives: tuple[str, ...] = field(default=())


def format_walltime(seconds: float) -> str:
    """``HH:MM:SS`` for a number of seconds, rounded up to the next whole second."""
    if seconds <= 0 or not math.isfinite(seconds):
        raise WorkloadError(f"walltime must be a positive number of seconds, got {seconds}")
    total = math.ceil(seconds)
    return f"{total // 3600:02d}:{total % 3600 // 60:02d}:{total % 60:02d}"


def suggest_walltime(measured_s: float, factor: float = 3.0, minimum_s: float = 600.0) -> float:
    """A walltime request for a run measured at ``measured_s``: ``factor`` times that,
    rounded up to whole minutes, and at least ``minimum_s``."""
    return max(minimum_s, math.ceil(measured_s * factor / 60.0) * 60.0)


def _launch_line(np_: int, launcher: str, launcher_args: Sequence[str], pw: str,
                 flags: Sequence[str], input_file: str) -> str:
    if os.path.basename(launcher) == "srun":
        argv = [launcher, "-n", str(np_), *launcher_args]
    else:
        argv = [launcher, "-np", str(np_), *launcher_args]
    return shlex.join([*argv, pw, *flags, "-inp", input_file])


def render_job_script(
    point: Mapping[str, Any],
    *,
    scheduler: str = "pbs",
    input_file: str = "pw.in",
    resources: JobResources | None = None,
    env: Mapping[str, str] | None = None,
    launcher: str = "mpirun",
    launcher_args: Sequence[str] = (),
    pw: str = "pw.x",
) -> str:
    """The job script that runs pw.x at ``point`` (``np``, ``npool``, ``ndiag``, ``ntg``,
    ``omp``; absent ones are left to pw.x's defaults) on ``input_file``.

    ``env`` (for example the point's environment-variable set) is exported after
    ``OMP_NUM_THREADS``. Raises :class:`WorkloadError` for an unknown scheduler.
    """
    if scheduler not in SCHEDULERS:
        raise WorkloadError(
            f"unknown scheduler {scheduler!r}; choose one of: {', '.join(SCHEDULERS)}"
        )
    res = resources or JobResources()
    np_ = int(point.get("np", 1))
    omp = int(point.get("omp", 1))
    ncpus = np_ * omp
    flags: list[str] = []
    for key in ("npool", "ndiag", "ntg"):
        if key in point:
            flags += [f"-{key}", str(int(point[key]))]
    walltime = format_walltime(res.walltime_s)
    lines = ["#!/bin/bash"]
    if scheduler == "pbs":
        lines.append(f"#PBS -l walltime={walltime}")
        lines.append(f"#PBS -l ncpus={ncpus}")
        if res.mem:
            lines.append(f"#PBS -l mem={res.mem}")
        lines += [f"#PBS {d}" for d in res.directives]
        lines.append("#PBS -l wd")
        if res.queue:
            lines.append(f"#PBS -q {res.queue}")
        if res.project:
            lines.append(f"#PBS -P {res.project}")
        lines.append(f"#PBS -N {res.job_name}")
    else:
        lines.append(f"#SBATCH --job-name={res.job_name}")
        lines.append(f"#SBATCH --time={walltime}")
        if res.cores_per_node:
            lines.append(f"#SBATCH --nodes={math.ceil(ncpus / res.cores_per_node)}")
        lines.append(f"#SBATCH --ntasks={np_}")
        lines.append(f"#SBATCH --cpus-per-task={omp}")
        if res.mem:
            mem = res.mem[:-1] if res.mem.upper().endswith("B") else res.mem
            lines.append(f"#SBATCH --mem={mem}")
        if res.queue:
            lines.append(f"#SBATCH --partition={res.queue}")
        if res.project:
            lines.append(f"#SBATCH --account={res.project}")
        lines += [f"#SBATCH {d}" for d in res.directives]
    lines.append("")
    lines += [f"module load {shlex.quote(m)}" for m in res.modules]
    lines.append(f"export OMP_NUM_THREADS={omp}")
    for key, value in (env or {}).items():
        if key != "OMP_NUM_THREADS":
            lines.append(f"export {key}={shlex.quote(str(value))}")
    lines.append(_launch_line(np_, launcher, launcher_args, pw, flags, input_file))
    return "\n".join(lines) + "\n"


def render_for_workload(workload: Any, point: Mapping[str, Any], *, scheduler: str = "pbs",
                        resources: JobResources | None = None,
                        env: Mapping[str, str] | None = None) -> str:
    """:func:`render_job_script` with the launcher, its arguments, pw.x and the input file
    name taken from a :class:`~tunelab.workloads.qe.QEWorkload`'s options. The script is meant
    to sit next to the input (``#PBS -l wd`` / Slurm's default working directory)."""
    opts = workload.opts
    return render_job_script(
        point,
        scheduler=scheduler,
        input_file=os.path.basename(opts.input),
        resources=resources,
        env=env,
        launcher=opts.mpirun,
        launcher_args=opts.mpi_args,
        pw=opts.pw,
    )
