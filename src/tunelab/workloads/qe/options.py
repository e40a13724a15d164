"""The ``qe`` workload's options (the study file's ``workload.options``): pw.x, the MPI
launcher, the energy tolerance of the physics check, k-points, and the preparation steps and
seed files of multi-step workflows, checked by pydantic when the study is loaded.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from tunelab.limits import LIMITS
from tunelab.workload import WorkloadOptions

__all__ = ["PrepareStepOptions", "QEOptions"]

MAX_STEPS = 16
MAX_SEEDS = 64


class PrepareStepOptions(WorkloadOptions):
    """One preparation step of the option ``prepare``."""

    input: str = Field(description="pw.x input of the step, relative to the study file")
    np: int = Field(1, ge=1, le=4096, description="MPI ranks of the step")
    npool: int = Field(1, ge=1, le=4096, description="k-point pools of the step")
    per_point: bool = Field(
        False, description="run the step once per point with the point's parallelisation "
        "(for restart files written per MPI rank) instead of once per study")
    timeout: float = Field(3600.0, gt=0, le=LIMITS.duration_s,
                           description="seconds before the step is killed")


class QEOptions(WorkloadOptions):
    """Fixed options of a pw.x study (the study file's ``workload.options``)."""

    input: str = Field(description="pw.x input file, relative to the study file's directory")
    pw: str = Field("pw.x", description="pw.x executable (name on PATH or path)")
    mpirun: str = Field("mpirun", description="MPI launcher: mpirun, mpiexec, srun, …")
    mpi_args: tuple[str, ...] = Field((), description="extra launcher arguments")
    oversubscribe: bool = Field(
        False, description="allow more ranks × threads than cores (adds --oversubscribe)"
    )
    energy_tolerance: float | None = Field(
        None, gt=0, description="largest total-energy difference (Ry) between configurations "
        "(default: 10 × the input's conv_thr, at least 5e-8; at least 1e-4 for hybrids)"
    )
    pseudo_dir: str | None = Field(
        None, description="pseudopotential directory searched after the input's pseudo_dir"
    )
    nk: int | None = Field(
        None, ge=1, description="number of k-points (default: counted as pw.x counts them)"
    )
    prepare: tuple[PrepareStepOptions, ...] = Field(
        (), max_length=MAX_STEPS,
        description="untimed pw.x runs that build what the input reads (e.g. the scf of an "
        "nscf), in order, sharing one outdir that every run starts from")
    keep_outdir: bool = Field(
        False, description="keep each run's outdir (RUN/out: wavefunctions, charge density) "
        "after the run; by default it is deleted once the run is recorded")
    seed: tuple[str, ...] = Field(
        (), max_length=MAX_SEEDS,
        description="files or directories copied into every run's outdir (restart data)")

    @field_validator("input")
    @classmethod
    def _non_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("input must name a pw.x input file")
        return value
