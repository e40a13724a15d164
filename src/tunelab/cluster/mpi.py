"""Launch lines for parallel programs: ``mpirun`` / ``srun`` flags, and where ranks go.

The one place that knows Open MPI's and Slurm's flags. Workloads and the benchmark programs
use it without importing the runner's package. A :class:`Placement` says where a run
executes:

* ``local`` — this machine: ``mpirun -np N`` plus ``--allow-run-as-root`` (as root) and
  ``--oversubscribe`` when ranks outnumber cores;
* ``job`` — inside a batch allocation: ``srun --mpi=PMI -N nodes -n ranks -c threads`` (the
  site's PMI plugin) or
  ``mpirun -np N --hostfile HOSTFILE --bind-to none`` (the hostfile is written by the job step
  from the allocation's node list before the run starts; ``--bind-to none`` because Open MPI
  binds rank 0 of every node to the same core otherwise);
* ``script`` — a job script for a user's cluster (``tunelab script``): the same lines without
  the root and hostfile flags (the site's MPI reads the allocation itself).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tunelab.errors import WorkloadError

__all__ = [
    "MPI_PACKAGE_HINT",
    "Placement",
    "mpi_launch_argv",
    "mpirun_argv",
    "mpirun_env",
    "portable_argv",
    "require_executable",
]

MPI_PACKAGE_HINT = "openmpi-bin"

Where = Literal["local", "job", "script"]
Starter = Literal["mpirun", "srun"]


@dataclass(frozen=True)
class Placement:
    """Where a run's processes go.

    ``where`` is ``local``, ``job`` (inside a batch allocation) or ``script`` (a job script
    for another machine). In a job, ``starter`` picks ``srun`` or ``mpirun``; ``nodes`` is
    the number of nodes the run spans, ``cores_per_node`` the cores of each, ``hostfile``
    the file the job step writes with ``nodes`` hosts (for ``mpirun``), ``mpi`` the PMI
    plugin ``srun`` starts ranks with (the site's: ``pmix``, ``pmi2`` or ``none``).
    """

    where: Where = "local"
    starter: Starter = "mpirun"
    nodes: int = 1
    cores_per_node: int | None = None
    hostfile: Path | None = None
    mpi: Literal["pmix", "pmi2", "none"] = "pmix"

    @property
    def in_allocation(self) -> bool:
        """True in a batch job or a job script (a scheduler placed the nodes)."""
        return self.where != "local"


def require_executable(name: str, package: str) -> str:
    """Absolute path of ``name`` on PATH, or a one-line error naming the package to install."""
    path = shutil.which(name)
    if path is None:
        raise WorkloadError(
            f"{name!r} is not installed or not on PATH; install the Debian package {package!r} "
            f"(apt-get install -y {package}) or set the path in the study's workload options"
        )
    return path


def mpirun_argv(
    np: int,
    *,
    mpirun: str = "mpirun",
    extra_args: Sequence[str] = (),
    cores: int | None = None,
    oversubscribe: bool | None = None,
    threads: int = 1,
) -> list[str]:
    """The argv prefix ``mpirun -np N …`` for Open MPI on this machine.

    Adds ``--allow-run-as-root`` when running as root, ``--oversubscribe`` when ``np``
    exceeds ``cores`` (or when ``oversubscribe`` is True), and ``--bind-to none`` for ranks
    of more than one thread unless ``extra_args`` bind or map them (Open MPI binds each rank
    of a run of two or fewer to one core, where all its OpenMP threads would share it);
    ``srun -n N`` gets ``--cpus-per-task`` for such ranks. Other launchers (``srun``, Intel
    MPI's ``mpiexec.hydra``) are used by naming them in ``mpirun`` and passing their own
    flags in ``extra_args``; the Open MPI flags are then left out.
    """
    if np < 1:
        raise WorkloadError(f"the number of MPI ranks must be at least 1, got {np}")
    launcher = os.path.basename(mpirun)
    if launcher == "srun":
        cpus = any(a == "-c" or a.split("=")[0] == "--cpus-per-task" for a in extra_args)
        per_task = [f"--cpus-per-task={threads}"] if threads > 1 and not cpus else []
        return [mpirun, "-n", str(np), *per_task, *extra_args]
    argv = [mpirun, "-np", str(np)]
    if launcher in ("mpirun", "mpiexec", "orterun"):
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        cores = cores if cores is not None else (os.cpu_count() or 1)
        if oversubscribe or (oversubscribe is None and np > cores):
            argv.append("--oversubscribe")
        placed = any(a.split("=")[0] in ("--bind-to", "--map-by", "--cpus-per-proc",
                                          "--cpus-per-rank", "--rankfile")
                     for a in extra_args)
        if threads > 1 and not placed:
            argv += ["--bind-to", "none"]
    argv.extend(extra_args)
    return argv


def mpi_launch_argv(
    ranks: int,
    placement: Placement,
    *,
    threads: int = 1,
    mpirun: str = "mpirun",
    extra_args: Sequence[str] = (),
    cores: int | None = None,
) -> list[str]:
    """The starter argv for ``ranks`` MPI ranks of ``threads`` threads at ``placement``.

    Locally this is :func:`mpirun_argv`. In a job or job script, the placement's starter:
    ``srun --mpi=PMI --nodes=N --ntasks=R --cpus-per-task=T`` or ``mpirun -np R
    --bind-to none`` (plus ``--hostfile`` in a job, ``--allow-run-as-root`` as root there).
    A workload option naming another launcher (``mpiexec.hydra``) is kept as it is.
    """
    if not placement.in_allocation:
        return mpirun_argv(ranks, mpirun=mpirun, extra_args=extra_args, cores=cores,
                           threads=threads)
    if ranks < 1:
        raise WorkloadError(f"the number of MPI ranks must be at least 1, got {ranks}")
    name = os.path.basename(mpirun)
    if name not in ("mpirun", "mpiexec", "orterun", "srun"):
        return [mpirun, "-np", str(ranks), *extra_args]
    if placement.starter == "srun" or name == "srun":
        return ["srun", f"--mpi={placement.mpi}", f"--nodes={placement.nodes}", f"--ntasks={ranks}",
                f"--cpus-per-task={threads}", *extra_args]
    argv = [mpirun, "-np", str(ranks)]
    if placement.where == "job":
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        if placement.hostfile is not None:
            argv += ["--hostfile", str(placement.hostfile)]
        per_node = -(-ranks // placement.nodes)
        if placement.cores_per_node is not None and per_node * threads > placement.cores_per_node:
            argv.append("--oversubscribe")
    argv += ["--bind-to", "none", *extra_args]
    return argv


def mpirun_env(np: int, cores: int | None = None) -> dict[str, str]:
    """Environment for an Open MPI run: yield when idle if ranks outnumber cores.

    Busy-polling ranks on an oversubscribed machine slow a run by an order of magnitude;
    ``mpi_yield_when_idle`` makes waiting ranks give their core away. In an allocation pass
    the ranks and cores of one node.
    """
    cores = cores if cores is not None else (os.cpu_count() or 1)
    return {"OMPI_MCA_mpi_yield_when_idle": "1"} if np > cores else {}


def portable_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with absolute paths of programs on PATH shortened to their names (for job
    scripts that run on another machine after ``module load``)."""
    out = []
    for arg in argv:
        found = shutil.which(os.path.basename(arg)) if os.path.isabs(arg) else None
        try:
            same = found is not None and os.path.samefile(found, arg)
        except OSError:
            same = False
        out.append(os.path.basename(arg) if same else arg)
    return out
