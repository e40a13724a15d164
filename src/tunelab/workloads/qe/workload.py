"""The ``qe`` workload: tune Quantum ESPRESSO's pw.x (ranks, pools, diagonalisation groups,
task groups, OpenMP threads) on the user's own input, and check that the physics is unchanged.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from tunelab.errors import WorkloadError

if TYPE_CHECKING:
    import pandas as pd
from tunelab.cluster.mpi import (
    MPI_PACKAGE_HINT,
    mpi_launch_argv,
    mpirun_env,
    require_executable,
)
from tunelab.workloads.base import (
    Command,
    Needs,
    Objective,
    RunContext,
    Workload,
    WorkloadOptions,
)
from tunelab.workloads.qe.parser import parse_pw_output
from tunelab.workloads.qe.pseudo import GENERATED, ensure_pseudo, pseudo_cache_dir
from tunelab.workloads.qe.pwinput import (
    PwInput,
    count_kpoints_with_pw,
    read_pw_input,
    stage_input,
)

__all__ = ["QE_PACKAGE", "QEOptions", "QEWorkload", "pw_rules"]

QE_PACKAGE = "quantum-espresso"
PARAMETERS = ("np", "npool", "ndiag", "ntg", "omp")


class QEOptions(WorkloadOptions):
    """Fixed options of a pw.x study (the study file's ``workload.options``)."""

    input: str = Field(description="pw.x input file, relative to the study file's directory")
    pw: str = Field("pw.x", description="pw.x executable (name on PATH or path)")
    mpirun: str = Field("mpirun", description="MPI launcher: mpirun, mpiexec, srun, …")
    mpi_args: tuple[str, ...] = Field((), description="extra launcher arguments")
    oversubscribe: bool = Field(
        False, description="allow more ranks × threads than cores (adds --oversubscribe)"
    )
    energy_tolerance: float = Field(
        1e-5, gt=0, description="largest total-energy difference (Ry) between configurations"
    )
    pseudo_dir: str | None = Field(
        None, description="pseudopotential directory overriding the input's pseudo_dir"
    )
    nk: int | None = Field(
        None, ge=1, description="number of k-points (default: read from the input)"
    )

    @field_validator("input")
    @classmethod
    def _non_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("input must name a pw.x input file")
        return value


def pw_rules(oversubscribe: bool = False) -> list[tuple[str, str]]:
    """pw.x's parallelisation rules as ``(expression, why)`` constraints."""
    rules = [
        ("np % npool == 0", "pw.x needs -npool to divide the number of MPI ranks np"),
        (
            "is_square(ndiag)",
            "pw.x's linear-algebra group is a square grid; for a non-square -ndiag it silently "
            "falls back to serial diagonalisation, the same run as ndiag=1",
        ),
        (
            "ndiag <= np // npool",
            "an -ndiag larger than the ranks per pool makes pw.x silently use serial "
            "diagonalisation, the same run as ndiag=1",
        ),
        ("(np // npool) % ntg == 0", "pw.x needs -ntg task groups to divide the ranks per pool"),
        ("npool <= nk", "pools beyond the number of k-points (nk) of the input get no "
         "k-points: their ranks sit idle"),
    ]
    if not oversubscribe:
        rules += [
            ("np * omp <= cores", "ranks × OpenMP threads must not exceed the cores "
             "(set the option oversubscribe: true to allow it)"),
            ("np <= cores", "more MPI ranks than cores (set the option oversubscribe: true "
             "to allow it)"),
        ]
    return rules


class QEWorkload(Workload):
    """Quantum ESPRESSO pw.x under mpirun: ``np``, ``npool``, ``ndiag``, ``ntg``, ``omp``."""

    name = "qe"
    description = "Quantum ESPRESSO pw.x: MPI ranks, pools, ndiag, task groups, OpenMP threads"
    Options = QEOptions

    def __init__(self, options: WorkloadOptions | Mapping[str, Any],
                 study_file: Path | None = None) -> None:
        if isinstance(options, Mapping):
            options = QEOptions.model_validate(dict(options))
        elif not isinstance(options, QEOptions):
            options = QEOptions.model_validate(options.model_dump())
        super().__init__(options, study_file)
        self.opts: QEOptions = options

    # -- the input -------------------------------------------------------------------------
    @property
    def input_path(self) -> Path:
        """The pw.x input, relative paths taken from the study file's directory."""
        path = Path(os.path.expanduser(self.opts.input))
        if not path.is_absolute():
            base = self.study_file.parent if self.study_file is not None else Path.cwd()
            path = base / path
        return path

    @cached_property
    def pw_input(self) -> PwInput:
        """The parsed input (raises WorkloadError for a missing or non-pw.x file)."""
        pseudo_dir = None
        if self.opts.pseudo_dir:
            pseudo_dir = Path(os.path.expanduser(self.opts.pseudo_dir))
            if not pseudo_dir.is_absolute():
                base = self.study_file.parent if self.study_file is not None else Path.cwd()
                pseudo_dir = base / pseudo_dir
        return read_pw_input(self.input_path, pseudo_dir, fallback_dirs=[pseudo_cache_dir()])

    @cached_property
    def nk(self) -> int:
        """k-points pw.x distributes over pools: the ``nk`` option, else pw.x's own count
        (a quick serial pw.x run stopped before the SCF), else the count the input implies
        (an upper bound for automatic grids)."""
        if self.opts.nk is not None:
            return self.opts.nk
        inp = self.pw_input
        if inp.kpoints.mode == "automatic" and not inp.missing_pseudos():
            counted = count_kpoints_with_pw(inp, self.opts.pw)
            if counted is not None:
                return counted
        return inp.nk_bound

    # -- the contract ----------------------------------------------------------------------
    @property
    def objective(self) -> Objective:
        """pw.x's own wall time, minimised."""
        return Objective("pwscf_wall_s", "minimize")

    def default_space(self) -> dict[str, Any]:
        """np over powers of two up to the cores, npool up to nk, ndiag over squares."""
        cores = os.cpu_count() or 1
        nps = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= cores] or [1]
        nk = self.nk if self.opts.nk is not None or self.input_path.is_file() else 1
        npools = sorted({p for p in range(1, max(nps) + 1) if p <= nk and max(nps) % p == 0})
        ndiags = [d * d for d in range(1, 9) if d * d <= max(nps)]
        return {"np": nps, "npool": npools, "ndiag": ndiags}

    def constants(self) -> dict[str, Any]:
        """``nk``: the number of k-points of the input."""
        return {"nk": self.nk}

    def rules(self) -> list[tuple[str, str]]:
        """pw.x's parallelisation rules (see :func:`pw_rules`)."""
        return pw_rules(self.opts.oversubscribe)

    def invariants(self) -> dict[str, float]:
        """The total energy must agree across configurations within ``energy_tolerance``."""
        return {"total_energy_ry": self.opts.energy_tolerance}

    def tool_versions(self) -> dict[str, list[str]]:
        """The MPI launcher's version line."""
        return {"mpirun": [self.opts.mpirun, "--version"]}

    def check(self) -> None:
        """Refuse to start without pw.x and the launcher, a pw.x input, or its
        pseudopotentials (the project's generated Ce PAW is made on demand)."""
        require_executable(self.opts.pw, QE_PACKAGE)
        require_executable(self.opts.mpirun, MPI_PACKAGE_HINT)
        inp = self.pw_input
        for path in inp.missing_pseudos():
            if path.name in GENERATED:
                ensure_pseudo(path.name)
        missing = inp.missing_pseudos()
        if missing:
            raise WorkloadError(
                f"pseudopotential {missing[0].name!r} named in {inp.path} is not in "
                f"{inp.pseudo_dir} (set pseudo_dir in the input or the option pseudo_dir)"
            )

    def needs(self, values: Mapping[str, Any]) -> Needs:
        """``np`` ranks of ``omp`` threads, over ``nodes`` nodes (or ``ppn`` per node)."""
        return Needs.from_values(values, ranks=values.get("np", 1), threads=values.get("omp", 1))

    def command(self, ctx: RunContext) -> Command:
        """``mpirun -np N … pw.x -npool P -ndiag D [-ntg T] -inp pw.in`` in ``ctx.run_dir``,
        on a private copy of the input, its pseudopotentials and outdir (in a job script for
        another machine: the input by its own name, next to the script)."""
        values = ctx.values
        needs = self.needs(values)
        if ctx.placement.where == "script":
            input_name, pw = self.input_path.name, self.opts.pw
        else:
            input_name = stage_input(self.pw_input, ctx.run_dir).name
            pw = shutil.which(self.opts.pw) or self.opts.pw
        argv = mpi_launch_argv(
            needs.ranks,
            ctx.placement,
            threads=needs.threads,
            mpirun=self.opts.mpirun,
            extra_args=self.opts.mpi_args,
            cores=ctx.cores,
        )
        argv.append(pw)
        argv += pw_flags(values)
        argv += ["-inp", input_name]
        per_node = needs.ranks_per_node * needs.threads
        env = {**ctx.env, **mpirun_env(per_node, ctx.cores), "OMP_NUM_THREADS": str(needs.threads)}
        return Command(tuple(argv), env, ctx.run_dir)

    def parse(self, stdout: str, stderr: str, run_dir: Path) -> dict[str, float]:
        """Figures of merit of a pw.x run (see :mod:`tunelab.workloads.qe.parser`)."""
        return parse_pw_output(stdout, run_dir)

    @classmethod
    def report_plots(
        cls, runs: pd.DataFrame, out_dir: Path, *, objective: Objective,
        best: str | None, baseline: str | None,
    ) -> list[Path]:
        """Wall time vs np (a line per npool), vs ndiag, and routine timers best vs baseline."""
        from tunelab.workloads.qe.plots import plot_qe_study

        return plot_qe_study(runs, out_dir, best=best, baseline=baseline,
                             metric=f"fom.{objective.fom}")


def pw_flags(values: Mapping[str, Any]) -> list[str]:
    """pw.x's command-line flags for the parameters present in ``values``."""
    flags: list[str] = []
    for key in ("npool", "ndiag", "ntg"):
        if key in values:
            flags += [f"-{key}", str(int(values[key]))]
    return flags
