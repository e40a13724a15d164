"""The ``qe`` workload: tune Quantum ESPRESSO's pw.x (ranks, pools, diagonalisation groups,
task groups, OpenMP threads) on the user's own input, and check that the physics is unchanged.

What the workload learns from the input is worked out once (:class:`Setup`): the
pseudopotentials (:mod:`.pseudo_search`), the preparation steps and seed files of multi-step
workflows (:mod:`.prepare`), the number of k-points pw.x distributes (:class:`NkInfo`) and
the energy tolerance of the physics check (:class:`Tolerance`). ``space``, ``run`` and
``run --dry-run`` all go through it; only a real run starts programs (pw.x to count k-points,
ld1.x to generate a pseudopotential, the preparation steps).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunelab.errors import WorkloadError

if TYPE_CHECKING:
    import pandas as pd
from tunelab.cluster.mpi import (
    MPI_PACKAGE_HINT,
    mpi_launch_argv,
    mpirun_env,
    require_executable,
)
from tunelab.workload import (
    Command,
    Needs,
    Objective,
    RunContext,
    Workload,
    WorkloadOptions,
)
from tunelab.workloads.qe.kpoints import is_hybrid_dft
from tunelab.workloads.qe.options import QEOptions
from tunelab.workloads.qe.parser import parse_pw_output
from tunelab.workloads.qe.prepare import (
    Launch,
    Step,
    copy_outdir,
    prepared_outdir,
    steps_digest,
)
from tunelab.workloads.qe.pseudo_search import Resolved, resolve_pseudos
from tunelab.workloads.qe.pwcount import cached_count, count_with_pw
from tunelab.workloads.qe.pwinput import STAGED_OUTDIR, PwInput, read_pw_input, stage_input

__all__ = [
    "QE_PACKAGE", "USED", "NkInfo", "QEWorkload", "Tolerance", "pw_rules", "used_differs",
]

QE_PACKAGE = "quantum-espresso"
PARAMETERS = ("np", "npool", "ndiag", "ntg", "omp")
CONV_THR_FACTOR = 10.0
"""The energy tolerance is this many times the input's ``conv_thr``…"""
PRINTED_FLOOR = 5e-8
"""…but at least five units of the last digit pw.x prints of the total energy (1e-8 Ry)."""
HYBRID_FLOOR = 1e-4
"""Hybrid-functional (EXX) runs: at least this (Ry). Their nested loops stop on an estimate
of the exchange error, and energies of one input were seen to differ by 2.4e-5 Ry between
np=1 and np=2 with both runs reported converged."""


@dataclass(frozen=True)
class NkInfo:
    """The number of k-points the rules use, and where it came from."""

    count: int
    source: str


@dataclass(frozen=True)
class Tolerance:
    """The physics check's energy tolerance (Ry), and why it has that value."""

    value: float
    source: str


@dataclass(frozen=True)
class Setup:
    """What the workload worked out from its input and options (see the module docstring)."""

    input: PwInput
    pseudos: Resolved
    steps: tuple[Step, ...]
    seeds: tuple[Path, ...]
    nk: NkInfo
    tolerance: Tolerance


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
        ("npool <= nk", "pools beyond the number of k-points (nk, spin-k-points for LSDA) "
         "of the input get no k-points: their ranks sit idle"),
    ]
    if not oversubscribe:
        rules += [
            ("np * omp <= cores", "ranks × OpenMP threads must not exceed the cores "
             "(set the option oversubscribe: true to allow it)"),
            ("np <= cores", "more MPI ranks than cores (set the option oversubscribe: true "
             "to allow it)"),
        ]
    return rules


def energy_tolerance(inp: PwInput, option: float | None) -> Tolerance:
    """The tolerance of the total-energy check: the option's, else one that follows the
    input's ``conv_thr`` (see :data:`CONV_THR_FACTOR`, :data:`HYBRID_FLOOR`)."""
    if option is not None:
        return Tolerance(option, "the study's option energy_tolerance")
    conv = inp.conv_thr
    value = max(CONV_THR_FACTOR * conv, PRINTED_FLOOR)
    source = f"{CONV_THR_FACTOR:g} × conv_thr {conv:g}"
    if value == PRINTED_FLOOR:
        source = f"conv_thr {conv:g} is below what pw.x prints; 5 units of its last digit"
    if is_hybrid_dft(inp.namelists.get("system", {})) and value < HYBRID_FLOOR:
        value = HYBRID_FLOOR
        source = f"the default for hybrid functionals (conv_thr {conv:g})"
    return Tolerance(value, source)


class QEWorkload(Workload):
    """Quantum ESPRESSO pw.x under mpirun: ``np``, ``npool``, ``ndiag``, ``ntg``, ``omp``."""

    name = "qe"
    description = "Quantum ESPRESSO pw.x: MPI ranks, pools, ndiag, task groups, OpenMP threads"
    Options = QEOptions
    reads = frozenset((*PARAMETERS, "nodes", "ppn"))  # all counts (check_parameter)

    def __init__(self, options: WorkloadOptions | Mapping[str, Any],
                 study_file: Path | None = None) -> None:
        if isinstance(options, Mapping):
            options = QEOptions.model_validate(dict(options))
        elif not isinstance(options, QEOptions):
            options = QEOptions.model_validate(options.model_dump())
        super().__init__(options, study_file)
        self.opts: QEOptions = options
        self._counted = False
        """Whether pw.x was asked to count the k-points on the prepared data (see
        :meth:`command`)."""

    # -- the input -------------------------------------------------------------------------
    def _path(self, name: str) -> Path:
        path = Path(os.path.expanduser(name))
        if not path.is_absolute():
            base = self.study_file.parent if self.study_file is not None else Path.cwd()
            path = base / path
        return path

    @property
    def input_path(self) -> Path:
        """The pw.x input, relative paths taken from the study file's directory."""
        return self._path(self.opts.input)

    @cached_property
    def pw_input(self) -> PwInput:
        """The parsed input (raises WorkloadError for a missing or non-pw.x file)."""
        return read_pw_input(self.input_path)

    @cached_property
    def setup(self) -> Setup:
        """Pseudopotentials, preparation steps, seeds, k-points and tolerance, worked out
        once; raises :class:`WorkloadError` (one line) for anything missing."""
        inp = self.pw_input
        option_dir = self._path(self.opts.pseudo_dir) if self.opts.pseudo_dir else None
        generate = not self.dry_run
        pseudos = resolve_pseudos(inp, option_dir, generate=generate)
        steps = tuple(
            Step(step_inp, resolve_pseudos(step_inp, option_dir, generate=generate).files,
                 o.np, o.npool, o.per_point, o.timeout)
            for o in self.opts.prepare
            for step_inp in (read_pw_input(self._path(o.input)),)
        )
        seeds = tuple(self._path(s) for s in self.opts.seed)
        for seed in seeds:
            if not seed.exists():
                raise WorkloadError(f"seed {str(seed)!r} (option seed) does not exist")
        _check_previous_run(inp, steps, seeds)
        return Setup(inp, pseudos, steps, seeds,
                     self._count_kpoints(inp, pseudos, _prepared_from(inp, steps, seeds)),
                     energy_tolerance(inp, self.opts.energy_tolerance))

    def _count_kpoints(self, inp: PwInput, pseudos: Resolved, prepared: str) -> NkInfo:
        if self.opts.nk is not None:
            return NkInfo(self.opts.nk, "the option nk")
        probe_ok = inp.reads_previous_run is None and not pseudos.generated
        if inp.reads_previous_run is not None and not pseudos.generated:
            counted = cached_count(inp, self.opts.pw, prepared)  # by a run, after preparing
            if counted is not None:
                return NkInfo(counted.count, f"{_per_spin(inp, counted.printed)}counted by "
                              f"pw.x {counted.version} on the prepared data")
        if probe_ok:
            cached = cached_count(inp, self.opts.pw)
            if cached is None and not self.dry_run:
                cached = count_with_pw(inp, pseudos.files, self.opts.pw)
            if cached is not None:
                return NkInfo(cached.count, f"{_per_spin(inp, cached.printed)}counted by pw.x "
                              f"{cached.version}")
        rules = inp.count_kpoints()
        if rules is not None:
            why = "pw.x was not run" if probe_ok else \
                "pw.x counts them once the preparation ran, at the first run"
            if probe_ok and not self.dry_run:
                why = "pw.x did not count them"
            return NkInfo(rules.count, f"{_per_spin(inp, rules.per_spin)}computed with pw.x "
                          f"6.7's symmetry rules, {rules.how}; an estimate: {why}")
        return NkInfo(inp.nk_bound, "an upper bound from the K_POINTS card: the input uses "
                      "something the symmetry rules do not model and pw.x was not run")

    @property
    def nk(self) -> int:
        """k-points pw.x distributes over pools (see :meth:`facts` for the source)."""
        return self.setup.nk.count
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
        """``nk``: the k-points pw.x distributes (spin-k-points for LSDA)."""
        return {"nk": self.nk}

    def rules(self) -> list[tuple[str, str]]:
        """pw.x's parallelisation rules (see :func:`pw_rules`)."""
        return pw_rules(self.opts.oversubscribe)

    def invariants(self) -> dict[str, float]:
        """The total energy must agree across configurations within the tolerance."""
        return {"total_energy_ry": self.setup.tolerance.value}

    def configuration_problem(self, values: Mapping[str, Any],
                              foms: Mapping[str, float]) -> str | None:
        """What pw.x reports having used (:data:`USED`) where it differs from the point's
        values: an OpenMP thread count a build without OpenMP ignores, a layout pw.x
        changed. None when it ran what was asked."""
        return used_differs(values, foms)

    def facts(self) -> list[str]:
        """k-points, energy tolerance, pseudopotentials and workflow, with their sources."""
        setup = self.setup
        lines = [f"k-points (nk): {setup.nk.count}, {setup.nk.source}",
                 f"energy tolerance: {setup.tolerance.value:g} Ry ({setup.tolerance.source})"]
        where: dict[Path, list[str]] = {}
        for name, path in setup.pseudos.files.items():
            where.setdefault(path.parent, []).append(name)
        lines.append("pseudopotentials: " + "; ".join(
            f"{', '.join(names)} in {folder}" for folder, names in where.items()))
        if setup.pseudos.generated:
            lines.append(f"generated by ld1.x when the study runs: "
                         f"{', '.join(setup.pseudos.generated)}")
        if setup.steps:
            lines.append("prepared before the runs, not timed: " + "; ".join(
                s.describe() for s in setup.steps))
        if setup.seeds:
            lines.append("copied into every run's outdir: " + ", ".join(map(str, setup.seeds)))
        return lines

    def tool_versions(self) -> dict[str, list[str]]:
        """The MPI launcher's version line and pw.x's banner (pw.x with no input)."""
        return {"mpirun": [self.opts.mpirun, "--version"], "pw.x": [self.opts.pw]}

    def check(self) -> None:
        """Refuse to start without pw.x and the launcher, a pw.x input, its
        pseudopotentials (generated ones are made here) or the data it reads."""
        require_executable(self.opts.pw, QE_PACKAGE)
        require_executable(self.opts.mpirun, MPI_PACKAGE_HINT)
        self.setup  # noqa: B018 - resolves (and generates) everything, or raises

    def check_parameter(self, name: str, value: Any) -> None:
        """A count (``np``, ``npool``, ``ndiag``, ``ntg``, ``omp``, ``nodes``, ``ppn``) that
        is no whole number of at least 1 (``np: -2``, ``omp: 1.5``): no launcher or pw.x
        takes it."""
        whole = (isinstance(value, int) and not isinstance(value, bool)) or \
            (isinstance(value, float) and value.is_integer())
        if name in (self.reads or ()) and (not whole or value < 1):
            raise WorkloadError("a count of ranks, pools, groups, threads or nodes must be a "
                                "whole number of at least 1")

    def needs(self, values: Mapping[str, Any]) -> Needs:
        """``np`` ranks of ``omp`` threads, over ``nodes`` nodes (or ``ppn`` per node)."""
        return Needs.from_values(values, ranks=values.get("np", 1), threads=values.get("omp", 1))

    def command(self, ctx: RunContext) -> Command:
        """``mpirun -np N … pw.x -npool P -ndiag D [-ntg T] -inp pw.in`` in ``ctx.run_dir``,
        on a private copy of the input, its pseudopotentials and outdir (which starts from
        the prepared data and seed files, when the study has any: not in a dry run; in a job
        script for another machine: the input by its own name and ``pseudo/``, staged beside
        the script with relative paths)."""
        values = ctx.values
        needs = self.needs(values)
        setup = self.setup
        if ctx.placement.where == "script":
            input_name = stage_input(setup.input, ctx.run_dir, setup.pseudos.files,
                                     self.input_path.name, relative=True).name
            pw = self.opts.pw
        else:
            if not self.dry_run and (setup.steps or setup.seeds):
                launch = Launch(self.opts.pw, self.opts.mpirun, self.opts.mpi_args)
                source = (prepared_outdir(setup.steps, ctx.study_dir, launch, values, ctx.env,
                                          ctx.cores) if setup.steps else None)
                out = copy_outdir(source, setup.seeds, ctx.run_dir)
                why = setup.input.reads_previous_run
                save = f"{setup.input.prefix}.save"
                if why is not None and not (out / save).is_dir():
                    raise WorkloadError(
                        f"{setup.input.path.name} reads {save} from outdir ({why}), but the "
                        f"preparation steps and seed files left none there")
                if why is not None and not self._counted and self.opts.nk is None \
                        and not setup.pseudos.generated:
                    self._counted = True  # once per study, whatever pw.x answers
                    count_with_pw(setup.input, setup.pseudos.files, self.opts.pw, outdir=out,
                                  context=_prepared_from(setup.input, setup.steps, setup.seeds))
            input_name = stage_input(setup.input, ctx.run_dir, setup.pseudos.files).name
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

    def scratch(self, run_dir: Path) -> tuple[Path, ...]:
        """The run's private outdir (wavefunctions and charge density, one copy per run),
        unless the option ``keep_outdir`` keeps it."""
        return () if self.opts.keep_outdir else (run_dir / STAGED_OUTDIR,)

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


USED = (
    ("np", "par_mpi_procs", "MPI processes"),
    ("npool", "par_pools", "k-point pools"),
    ("ndiag", "par_ndiag", "ranks in the diagonalisation group"),
    ("ntg", "par_ntg", "FFT task groups"),
    ("omp", "par_threads", "OpenMP threads per process"),
)
"""Parameter, the FOM of what pw.x printed it used (see :mod:`.parser`), and its words."""


def used_differs(values: Mapping[str, Any], foms: Mapping[str, float]) -> str | None:
    """One line naming each parameter whose value pw.x did not use, with what it used;
    None when every parameter present in ``values`` matches pw.x's own report."""
    diffs = []
    for param, fom, what in USED:
        if param not in values or fom not in foms:
            continue
        try:
            asked, used = int(values[param]), int(foms[fom])
        except (TypeError, ValueError):
            continue
        if asked != used:
            why = (" (this pw.x is built without OpenMP, or ignored OMP_NUM_THREADS)"
                   if param == "omp" and used == 1 else "")
            diffs.append(f"{used} {what}, not {param}={asked}{why}")
    if not diffs:
        return None
    return ("pw.x ran with " + "; ".join(diffs) + ", as it prints: the run measured "
            "another configuration than its point")


def pw_flags(values: Mapping[str, Any]) -> list[str]:
    """pw.x's command-line flags for the parameters present in ``values``."""
    flags: list[str] = []
    for key in ("npool", "ndiag", "ntg"):
        if key in values:
            flags += [f"-{key}", str(int(values[key]))]
    return flags


def _prepared_from(inp: PwInput, steps: tuple[Step, ...], seeds: tuple[Path, ...]) -> str:
    """What the outdir an input reads is made from (its preparation steps and seeds), as the
    k-point cache's context; empty for an input that reads none."""
    if inp.reads_previous_run is None:
        return ""
    return steps_digest(steps) + "\0" + "\0".join(str(seed.resolve()) for seed in seeds)


def _per_spin(inp: PwInput, per_spin: int) -> str:
    return f"{per_spin} per spin × 2 spins (LSDA), " if inp.lsda else ""


def _check_previous_run(inp: PwInput, steps: tuple[Step, ...], seeds: tuple[Path, ...]
                        ) -> None:
    """Refuse an input that reads an earlier run's data the study does not provide: the
    ``prefix.save`` directory must come from a preparation step of the same prefix or be a
    seed (the check each run makes once its outdir is filled, made here, so that ``space``
    and ``--dry-run`` refuse what every run would fail on)."""
    why = inp.reads_previous_run
    if why is None:
        return
    if not steps and not seeds:
        raise WorkloadError(
            f"{inp.path}: {why} reads the data of an earlier run ({inp.prefix}.save in "
            "outdir), and the study provides none: name the run that writes it under the qe "
            "option prepare (e.g. prepare: [{input: scf.in}]) or its files under seed"
        )
    save = f"{inp.prefix}.save"
    if any(s.input.prefix == inp.prefix for s in steps) or \
            any(seed.name == save and seed.is_dir() for seed in seeds):
        return
    if steps and not seeds:
        written = ", ".join(sorted({repr(s.input.prefix) for s in steps}))
        raise WorkloadError(
            f"{inp.path} reads prefix {inp.prefix!r} ({why}), but the preparation steps "
            f"write prefix {written}: give them the same prefix"
        )
    given = ", ".join(seed.name for seed in seeds)
    made = (" nor do the preparation steps (prefix "
            + ", ".join(sorted({repr(s.input.prefix) for s in steps})) + ")") if steps else ""
    raise WorkloadError(
        f"{inp.path}: {why} reads the directory {save} from outdir, but the seed files "
        f"({given}) hold none{made}: add the directory {save} under seed (pw.x would fail "
        "every run)")
