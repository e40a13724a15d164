"""MPI launch lines shared by the workloads that run under ``mpirun``.

``mpirun_argv`` is the one place that knows Open MPI's flags for running as root and for
oversubscribing cores; workloads prepend its result to their own argv.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence

from tunelab.errors import WorkloadError

__all__ = ["MPI_PACKAGE_HINT", "mpirun_argv", "mpirun_env", "require_executable"]

MPI_PACKAGE_HINT = "openmpi-bin"


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
) -> list[str]:
    """The argv prefix ``mpirun -np N …`` for Open MPI.

    Adds ``--allow-run-as-root`` when running as root, and ``--oversubscribe`` when ``np``
    exceeds ``cores`` (or when ``oversubscribe`` is True). Other launchers (``srun``, Intel
    MPI's ``mpiexec.hydra``) are used by naming them in ``mpirun`` and passing their own
    flags in ``extra_args``; the Open MPI flags are then left out.
    """
    if np < 1:
        raise WorkloadError(f"the number of MPI ranks must be at least 1, got {np}")
    launcher = os.path.basename(mpirun)
    if launcher == "srun":
        return [mpirun, "-n", str(np), *extra_args]
    argv = [mpirun, "-np", str(np)]
    if launcher in ("mpirun", "mpiexec", "orterun"):
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        cores = cores if cores is not None else (os.cpu_count() or 1)
        if oversubscribe or (oversubscribe is None and np > cores):
            argv.append("--oversubscribe")
    argv.extend(extra_args)
    return argv


def mpirun_env(np: int, cores: int | None = None) -> dict[str, str]:
    """Environment for an Open MPI run: yield when idle if ranks outnumber cores.

    Busy-polling ranks on an oversubscribed machine slow a run by an order of magnitude;
    ``mpi_yield_when_idle`` makes waiting ranks give their core away.
    """
    cores = cores if cores is not None else (os.cpu_count() or 1)
    return {"OMPI_MCA_mpi_yield_when_idle": "1"} if np > cores else {}
