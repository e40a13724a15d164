"""Multi-step pw.x workflows: the untimed runs that build what the tuned run reads.

An nscf or bands run reads the charge density an scf run left in ``outdir``; a run with
``restart_mode = 'restart'`` continues from the files an earlier run left there. A study of
such an input names the earlier runs as *preparation steps* (option ``prepare``) and/or the
files to copy in (option ``seed``):

* the steps run in order, in one directory of their own under the study directory
  (``prepare/<hash>/``), sharing one ``outdir``; they run once per study — or once per point
  (``per_point: true``) when what they write depends on the point's parallelisation (an scf
  restart reads wavefunction files written per MPI rank);
* every run of the tuned input then starts from a private copy of that ``outdir`` (plus the
  ``seed`` files), so that no run sees what another one wrote;
* all of this happens while the run's command is being built, before the engine starts its
  clock: only the tuned step is timed.

A step that fails is remembered (``failed.txt``) and every later run reports the same one-line
reason without running it again, so a broken preparation stops the study after one run per
point. A directory left by an interrupted preparation (no ``done`` marker) is wiped and
prepared again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunelab.cluster.mpi import mpirun_argv, mpirun_env
from tunelab.errors import LaunchError, ParseError, WorkloadError
from tunelab.execute.launchers import LocalLauncher
from tunelab.workloads.qe.parser import parse_pw_output
from tunelab.workloads.qe.pwinput import STAGED_OUTDIR, PwInput, stage_input

__all__ = ["PREPARE_DIR", "Launch", "Step", "copy_outdir", "prepared_outdir", "steps_digest"]

PREPARE_DIR = "prepare"
_DONE = "done"
_FAILED = "failed.txt"
_PARALLEL = ("np", "npool", "ndiag", "ntg", "omp")


@dataclass(frozen=True)
class Step:
    """One preparation run: its input, pseudopotentials, and how it is launched."""

    input: PwInput
    pseudos: Mapping[str, Path]
    np: int = 1
    npool: int = 1
    per_point: bool = False
    timeout_s: float = 3600.0

    def describe(self) -> str:
        """``scf.in (np 1, once per study)`` and the like."""
        how = "once per point, with the point's parallelisation" if self.per_point else (
            f"np {self.np}" + (f" npool {self.npool}" if self.npool > 1 else "")
            + ", once per study")
        return f"{self.input.path.name} ({how})"


@dataclass(frozen=True)
class Launch:
    """How pw.x is started: executable, MPI launcher and its extra arguments."""

    pw: str
    mpirun: str
    mpi_args: tuple[str, ...]


def steps_digest(steps: Sequence[Step]) -> str:
    """What the preparation is, as a short hash: its inputs and how they run."""
    h = hashlib.sha1()
    for step in steps:
        h.update(step.input.text.encode())
        h.update(json.dumps([step.np, step.npool, step.per_point,
                             sorted(step.pseudos)]).encode())
    return h.hexdigest()[:12]


def _point_key(values: Mapping[str, Any], env: Mapping[str, str]) -> str:
    parallel = {k: values[k] for k in _PARALLEL if k in values}
    text = json.dumps([parallel, sorted(env.items())], sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def prepared_outdir(steps: Sequence[Step], study_dir: Path, launch: Launch,
                    values: Mapping[str, Any], env: Mapping[str, str], cores: int) -> Path:
    """The ``outdir`` the steps leave, running them first if they have not run yet (for
    this point, when a step is ``per_point``). Raises :class:`WorkloadError` with the
    reason when a step fails, now or in an earlier call."""
    where = Path(study_dir) / PREPARE_DIR / steps_digest(steps)
    if any(s.per_point for s in steps):
        where = where / _point_key(values, env)
    failed = where / _FAILED
    if failed.is_file():
        raise WorkloadError(failed.read_text().strip())
    if (where / _DONE).is_file():
        return where / STAGED_OUTDIR
    if where.exists():  # interrupted before it finished
        shutil.rmtree(where)
    where.mkdir(parents=True)
    for index, step in enumerate(steps, start=1):
        reason = _run_step(index, step, where, launch, values, env, cores)
        if reason is not None:
            message = (f"preparation step {index} ({step.input.path.name}) failed: {reason} "
                       f"(output in {where})")
            failed.write_text(message + "\n")
            raise WorkloadError(message)
    (where / _DONE).write_text("")
    return where / STAGED_OUTDIR


def _run_step(index: int, step: Step, where: Path, launch: Launch,
              values: Mapping[str, Any], env: Mapping[str, str], cores: int) -> str | None:
    """Run one step; None when it succeeded, else why it failed."""
    staged = stage_input(step.input, where, step.pseudos, f"step{index}.in")
    if step.per_point:
        n = int(values.get("np", 1))
        omp = int(values.get("omp", 1))
        flags = [f for key in ("npool", "ndiag", "ntg") if key in values
                 for f in (f"-{key}", str(int(values[key])))]
    else:
        n, omp = step.np, 1
        flags = ["-npool", str(step.npool)] if step.npool > 1 else []
    argv = mpirun_argv(n, mpirun=launch.mpirun, extra_args=launch.mpi_args, cores=cores)
    argv += [shutil.which(launch.pw) or launch.pw, *flags, "-inp", staged.name]
    run_env = {**os.environ, **env, **mpirun_env(n * omp, cores), "OMP_NUM_THREADS": str(omp)}
    stdout, stderr = where / f"step{index}.out", where / f"step{index}.err"
    try:
        outcome = LocalLauncher().run(argv, env=run_env, cwd=where, timeout_s=step.timeout_s,
                                      stdout_path=stdout, stderr_path=stderr)
    except LaunchError as exc:
        return str(exc)
    if outcome.status == "timeout":
        return f"killed after {step.timeout_s:g} s"
    try:
        parse_pw_output(stdout.read_text(errors="replace"), where)
    except ParseError as exc:
        return str(exc)
    if outcome.rc != 0:
        return f"exit code {outcome.rc}"
    return None


def copy_outdir(source: Path | None, seeds: Sequence[Path], run_dir: Path) -> Path:
    """Fill ``run_dir/out`` with a copy of ``source`` (a prepared outdir) and of each seed
    file or directory; returns ``run_dir/out``."""
    out = Path(run_dir) / STAGED_OUTDIR
    if source is not None:
        shutil.copytree(source, out, dirs_exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        target = out / seed.name
        if seed.is_dir():
            shutil.copytree(seed, target, dirs_exist_ok=True)
        else:
            shutil.copyfile(seed, target)
    return out
