"""The ``merge`` workload: tunelab's all-to-all dataframe-merge benchmark as a study workload.

Each run is ``python -m tunelab.bench.merge …`` (which itself starts ``mpirun`` for the
``mpi`` transport, N processes for ``tcp``/``ucxx``, or a Dask cluster). Any option can be
overridden per point by a parameter of the same name (``transport``, ``chunk_size``,
``workers``, ``mpi_pml``, …). A study's ``env`` sets (``UCX_*`` variables) reach the workers
through the environment: the engine merges them into the run's environment and Open MPI
forwards the launching environment to its local ranks. The figures of merit are read from the
benchmark's final JSON line; a run whose merge was wrong reports no numbers and fails.
See docs/workloads/merge.md.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from tunelab.errors import ParseError, RunReportedError, WorkloadError
from tunelab.workload import (
    Command,
    Needs,
    Objective,
    RunContext,
    Work,
    Workload,
    WorkloadOptions,
    last_json_object,
)

__all__ = ["FOMS", "MergeOptions", "MergeWorkload", "link_stack"]

#: Figures of merit read from the benchmark's JSON line (bytes, bytes/s, seconds, rows).
FOMS = (
    "throughput", "throughput_std", "bandwidth", "bandwidth_std", "bandwidth_min",
    "bandwidth_median", "bandwidth_max", "bandwidth_lr", "wall_iter_s", "wall_iter_s_std",
    "exchange_s", "bytes_sent", "merged_rows", "data_processed", "bandwidth_transfer", "sync_s",
)


class MergeOptions(WorkloadOptions):
    """Fixed options of the merge workload (``workload.options`` in a study file)."""

    transport: Literal["mpi", "tcp", "dask", "ucxx"] = "mpi"
    workers: int = Field(2, ge=2)
    chunk_size: int = Field(100_000, gt=0)
    iterations: int = Field(5, ge=1)
    warmup: int = Field(1, ge=0)
    frac_match: float = Field(0.3, ge=0.0, le=1.0)
    seed: int = Field(42, ge=0)
    backend: Literal["pandas", "cudf"] = "pandas"
    mpi_pml: Literal["ob1", "ucx"] = "ucx"
    mpirun: str = "mpirun"
    hostfile: str | None = None
    mpi_args: list[str] = Field(default_factory=list)
    protocol: Literal["tcp", "ucxx"] = "tcp"
    dask_shuffle: Literal["tasks", "p2p"] = "tasks"
    scheduler_file: str | None = None
    timeout: float = Field(60.0, gt=0, allow_inf_nan=False)
    verify: Literal["auto", "full", "count"] = "auto"
    python: str | None = Field(
        None, description="Python interpreter that runs the benchmark (default: tunelab's own; "
                          "name a virtual environment with UCXX for transport ucxx)")


_FLAGS = {
    "transport": "--transport", "workers": "--workers", "chunk_size": "--chunk-size",
    "iterations": "--iterations", "warmup": "--warmup", "frac_match": "--frac-match",
    "seed": "--seed", "backend": "--backend", "mpi_pml": "--mpi-pml", "mpirun": "--mpirun",
    "hostfile": "--hostfile", "protocol": "--protocol", "dask_shuffle": "--dask-shuffle",
    "scheduler_file": "--scheduler-file", "timeout": "--timeout", "verify": "--verify",
}


def link_stack(transport: str, mpi_pml: str, protocol: str = "tcp") -> str | None:
    """The link stack (a bound's ``stack``) a transport moves its bytes through."""
    if transport == "mpi":
        return f"mpi-{mpi_pml}"
    if transport == "tcp" or (transport == "dask" and protocol == "tcp"):
        return "tcp"
    return None


class MergeWorkload(Workload):
    """All-to-all dataframe merge over MPI/UCX, UCXX, TCP or Dask (``tunelab bench merge``)."""

    name: ClassVar[str] = "merge"
    description: ClassVar[str] = ("all-to-all dataframe-merge communication benchmark "
                                  "(mpi/ucx, ucxx, tcp, dask)")
    Options: ClassVar[type[WorkloadOptions]] = MergeOptions
    options_from_parameters: ClassVar[bool] = True
    #: the options a point may override (``python`` stays the study's) and the placement
    reads: ClassVar[frozenset[str] | None] = frozenset(
        {*MergeOptions.model_fields, "nodes", "ppn"} - {"python"})
    fom_units: ClassVar[Mapping[str, str]] = {
        **{name: "B/s" for name in ("throughput", "throughput_std", "bandwidth",
                                    "bandwidth_std", "bandwidth_min", "bandwidth_median",
                                    "bandwidth_max", "bandwidth_lr", "bandwidth_transfer")},
        "bytes_sent": "B", "data_processed": "B"}

    @property
    def objective(self) -> Objective:
        return Objective("throughput", "maximize")

    def declared_foms(self) -> frozenset[str]:
        """:data:`FOMS`: all that :meth:`parse` reads of the JSON line."""
        return frozenset(FOMS)

    def default_space(self) -> dict[str, Any]:
        return {"transport": ["mpi", "tcp"]}

    def tool_versions(self) -> dict[str, list[str]]:
        return {"mpirun": [self._opts.mpirun, "--version"], "ucx_info": ["ucx_info", "-v"]}

    @property
    def _opts(self) -> MergeOptions:
        assert isinstance(self.options, MergeOptions)
        return self.options

    def _python(self) -> str:
        return self._opts.python or sys.executable

    def check(self) -> None:
        opts = self._opts
        if opts.transport == "mpi":
            from tunelab.cluster.mpi import MPI_PACKAGE_HINT, require_executable

            require_executable(opts.mpirun, MPI_PACKAGE_HINT)
        module = {"mpi": "mpi4py", "ucxx": "ucxx", "dask": "distributed"}.get(opts.transport)
        if module is not None:
            probe = subprocess.run([self._python(), "-c", f"import {module}"],
                                   capture_output=True, text=True, timeout=120)
            if probe.returncode != 0:
                extra = "ucx" if module == "ucxx" else "merge"
                raise WorkloadError(
                    f"merge workload: transport {opts.transport!r} needs the Python package "
                    f"{module!r} in {self._python()}; install it with "
                    f"pip install 'tunelab[{extra}]'")

    def check_values(self, values: Mapping[str, Any]) -> None:
        """Refuse a point whose workers cannot fit in the memory this machine has available
        (:func:`~tunelab.bench.merge.config.memory_problem`) when the study is loaded, not
        at each of its runs; only for runs on this machine (:attr:`runs_here`): a batch
        launcher's runs are refused by the benchmark on their node."""
        if not self.runs_here:
            return
        from tunelab.bench.merge.config import MergeConfig, local_workers, memory_problem
        from tunelab.sysinfo import mem_available

        s = self.settings(values)
        cfg = MergeConfig(workers=s["workers"], chunk_size=s["chunk_size"],
                          hostfile=s["hostfile"], scheduler_file=s["scheduler_file"])
        problem = memory_problem(cfg, local_workers(cfg), mem_available(),
                                 chunk="chunk_size", workers="workers")
        if problem is not None:
            at_fault = "workers" if "workers" in values and "chunk_size" not in values \
                else "chunk_size"
            raise WorkloadError(problem, option=(at_fault,))

    def settings(self, values: dict[str, Any] | Any) -> dict[str, Any]:
        """The options with the point's same-named parameters applied."""
        return self.point_options(values)

    def needs(self, values: Any) -> Needs:
        """One rank per worker, over ``nodes`` nodes (or ``ppn`` workers per node)."""
        workers = int(self.settings(values)["workers"])
        return Needs.from_values({k: v for k, v in dict(values).items() if k in ("nodes", "ppn")},
                                 ranks=workers)

    def command(self, ctx: RunContext) -> Command:
        settings = self.settings(ctx.values)
        for key in ("hostfile", "scheduler_file"):  # relative to the study file's directory
            if settings[key] and not Path(settings[key]).is_absolute():
                settings[key] = str(ctx.study_dir / settings[key])
        placement = ctx.placement
        if placement.where == "job" and settings["transport"] == "mpi":
            # the allocation's nodes, written by the job step; no binding of every node's
            # rank 0 to one core
            if not settings["hostfile"] and placement.hostfile is not None:
                settings["hostfile"] = str(placement.hostfile)
            settings["mpi_args"] = [*settings["mpi_args"], "--bind-to", "none"]
        in_job_dask = placement.where == "job" and settings["transport"] == "dask" and \
            not settings["scheduler_file"]
        if in_job_dask:  # scheduler and workers inside the allocation, found through a file
            settings["scheduler_file"] = str(ctx.run_dir / "scheduler.json")
        argv = [self._python(), "-m", "tunelab.bench.merge"]
        for key, flag in _FLAGS.items():
            value = settings[key]
            if value is not None:
                argv += [flag, str(value)]
        for arg in settings["mpi_args"]:
            argv.append(f"--mpi-arg={arg}")
        if in_job_dask:
            argv = [self._python(), "-m", "tunelab.cluster.dask_allocation",
                    "--scheduler-file", settings["scheduler_file"],
                    "--workers", str(settings["workers"]), "--nodes", str(placement.nodes),
                    "--timeout", str(settings["timeout"]), "--", *argv]
        return Command(tuple(argv), {}, ctx.run_dir)

    @classmethod
    def work(cls, options: Mapping[str, Any], values: Mapping[str, Any],
             foms: Mapping[str, float]) -> list[Work]:
        """The exchange: every worker sends one column message of 8 x rows/N bytes to every
        other worker at once (two columns per peer and phase), so its bandwidth is judged
        against the all-to-all bound at that message size over the same MPI stack."""
        s = {**options, **{k: v for k, v in values.items() if k in options}}
        bandwidth = foms.get("bandwidth")
        stack = link_stack(str(s.get("transport")), str(s.get("mpi_pml")),
                           str(s.get("protocol")))
        if bandwidth is None or stack is None:
            return []
        workers = int(foms.get("workers") or s.get("workers") or 2)
        nodes = int(values.get("nodes", 1) or 1)
        message = 8.0 * float(s.get("chunk_size") or 0) / workers
        variant = {"stack": stack, "pattern": "alltoall", "ranks": workers, "nodes": nodes,
                   "message_bytes": message}
        return [Work("link", bandwidth, variant, foms.get("bytes_sent"),
                     "exchange bandwidth per worker")]

    def parse(self, stdout: str, stderr: str, run_dir: Path) -> dict[str, float]:
        """The FOMs of the JSON line; the benchmark's own one-line verdict on a failed run
        (a dead worker, UCX's refusal, a ``UCX_*`` setting UCX ignored) is raised as
        :class:`~tunelab.errors.RunReportedError`, the run's failure reason."""
        verdicts = [ln.strip() for ln in stderr.splitlines() if ln.startswith("merge:")
                    and not ln.startswith(("merge: warning:", "merge: note:"))]
        if verdicts:
            raise RunReportedError(verdicts[-1])
        record = last_json_object(stdout, lambda r: r.get("benchmark") == "merge")
        if record is None:
            raise ParseError("no merge result line in the output")
        if not record.get("verified", False):
            raise ParseError(f"merge verification failed: {record.get('error', 'no reason')}")
        foms: dict[str, float] = {}
        for name in FOMS:
            value = record.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                foms[name] = float(value)
        if "throughput" not in foms:
            raise ParseError("the merge result line has no throughput")
        return foms
