"""The ``ddp`` workload: data-parallel training throughput (``tunelab bench ddp``) in a study.

Each run is ``python -m tunelab.bench.ddp …``, which starts one ``torchrun`` per node (on
this host, or in virtual nodes with a link limit) and prints one JSON line of figures of
merit. Any option may be overridden per point by a parameter or derived value of the same
name (``workers``, ``nodes``, ``batch_size``, ``compute``, ``link_gbit``, ``model`` …), so a
study sweeps worker counts and layouts; :mod:`tunelab.scaling` then computes speedup,
efficiency, the scale-up vs scale-out gap and the fitted all-reduce model, and ``tunelab
report`` draws them. See docs/workloads/ddp.md.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from tunelab.errors import ParseError, WorkloadError
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

__all__ = ["FOM_FLAGS", "FOMS", "DDPOptions", "DDPWorkload"]

#: Numeric figures of merit read from the benchmark's JSON line.
FOMS = (
    "throughput", "images_per_s", "windows_per_s", "throughput_per_worker", "step_s",
    "step_s_std", "compute_s", "allreduce_s", "allreduce_busy_s", "exposed_s", "other_s",
    "grad_bytes",
    "allreduce_algbw", "allreduce_busbw", "params", "workers", "nodes", "workers_per_node",
    "batch_size", "local_batch", "link_gbit", "hosts", "host_cores", "steps", "warmup",
    # the input pipeline (--data memory / files:DIR)
    "volumes_per_s", "samples", "busy_s", "data_s", "drop_s", "overhead_s", "au", "au_min",
    "comm_frac", "peer_s", "peer_frac",
    "wait_frac", "overhead_frac", "input_frac", "au_run", "au_run_min", "first_wait_s",
    "shutdown_s", "prep_s", "read_bytes", "read_Bps", "read_MBps", "read_MiBps",
    "read_MBps_per_worker", "proc_rchar_Bps", "proc_device_Bps", "io_check", "device_share",
    "corrupt_samples", "epochs", "loader_workers", "prefetch", "dataset_samples",
    "mean_sample_bytes", "read_limit_Bps", "compute_step_s", "flops_per_sample", "threads",
    "cpu_demand",
    # real compute: the training FLOP/s against the GEMM rate timed in the run
    "flops_per_step", "achieved_flops_per_s", "gemm_flops_per_s", "bound_fraction", "bound_s",
    "gemm_before_flops_per_s", "gemm_after_flops_per_s", "gemm_measurements",
    # GPU energy over the timed steps (NVML; absent without it)
    "energy_J", "energy_J_per_sample", "power_W",
)
#: Yes/no facts of the JSON line, recorded as FOMs 1.0 or 0.0 (always present).
FOM_FLAGS = ("compute_emulated", "gpu", "input_bound", "amp", "oversubscribed",
             "synthetic_data")


class DDPOptions(WorkloadOptions):
    """Fixed options of the ddp workload (``workload.options`` in a study file)."""

    model: Literal["resnet18", "resnet50", "leopard", "unet3d"] = "resnet50"
    workers: int = Field(1, ge=1, le=1024)
    nodes: int = Field(1, ge=1, le=256)
    batch_size: int = Field(64, ge=1)
    steps: int = Field(10, ge=1)
    warmup: int = Field(2, ge=0)
    compute: str = "real"
    image_size: int = Field(224, ge=32, le=1024)
    window: int = Field(2048, ge=32)
    data: str = "synthetic"
    loader_workers: int = Field(2, ge=0, le=64)
    prefetch: int = Field(2, ge=1, le=64)
    cache: Literal["cold", "warm", "keep"] = "cold"
    read_limit: str | None = None
    decode: Literal["on", "off", "gpu"] = "on"
    on_corrupt: Literal["skip", "fail"] = "skip"
    patch: int = Field(128, ge=64, le=512)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    amp: Literal["auto", "on", "off"] = "auto"
    threads: int | None = Field(None, ge=1)
    bucket_mb: float = Field(25.0, gt=0)
    allreduce: Literal["auto", "emulate", "real", "off"] = "auto"
    fabric: str = "auto"
    placement: Literal["local", "vnodes"] = "local"
    link_gbit: float = Field(0.0, ge=0)
    timeout: float = Field(120.0, gt=0)
    rendezvous_timeout: float = Field(180.0, gt=0)
    seed: int = 0
    python: str | None = Field(None, description="Interpreter that runs the benchmark "
                                                 "(default: tunelab's own)")


_FLAGS = {
    "model": "--model", "workers": "--workers", "nodes": "--nodes",
    "batch_size": "--batch-size", "steps": "--steps", "warmup": "--warmup",
    "compute": "--compute", "image_size": "--image-size", "window": "--window",
    "data": "--data", "loader_workers": "--loader-workers", "prefetch": "--prefetch",
    "cache": "--cache", "read_limit": "--read-limit", "decode": "--decode",
    "on_corrupt": "--on-corrupt", "patch": "--patch", "device": "--device",
    "backend": "--backend", "amp": "--amp",
    "threads": "--threads", "bucket_mb": "--bucket-mb", "allreduce": "--allreduce",
    "fabric": "--fabric", "placement": "--placement",
    "link_gbit": "--link-gbit", "timeout": "--timeout",
    "rendezvous_timeout": "--rendezvous-timeout", "seed": "--seed",
}


class DDPWorkload(Workload):
    """Data-parallel training throughput of ResNet-18/50 or the Leopard U-Net (PyTorch DDP)."""

    name: ClassVar[str] = "ddp"
    description: ClassVar[str] = ("data-parallel training throughput (PyTorch DDP; ResNet, "
                                  "Leopard; real or emulated compute; virtual nodes)")
    Options: ClassVar[type[WorkloadOptions]] = DDPOptions
    report_figures: ClassVar[tuple[str, ...]] = ("scaling", "storage")
    options_from_parameters: ClassVar[bool] = True
    fom_units: ClassVar[Mapping[str, str]] = {
        "throughput": "samples/s", "throughput_per_worker": "samples/s",
        "allreduce_algbw": "B/s", "allreduce_busbw": "B/s", "grad_bytes": "B",
        "flops_per_step": "FLOP", "achieved_flops_per_s": "FLOP/s",
        "gemm_flops_per_s": "FLOP/s", "bound_s": "s", "gemm_before_flops_per_s": "FLOP/s",
        "gemm_after_flops_per_s": "FLOP/s"}

    @property
    def objective(self) -> Objective:
        """Samples per second, maximised."""
        return Objective("throughput", "maximize")

    def declared_foms(self) -> frozenset[str]:
        """:data:`FOMS` and :data:`FOM_FLAGS`: all that :meth:`parse` reads of the JSON line."""
        return frozenset(FOMS) | frozenset(FOM_FLAGS)

    def default_space(self) -> dict[str, Any]:
        """Worker counts 1, 2 on one node."""
        return {"workers": [1, 2]}

    def rules(self) -> list[tuple[str, str]]:
        """Layouts and batches that divide evenly."""
        return [
            ("workers % nodes == 0", "every node runs the same number of workers"),
            ("batch_size % workers == 0", "each worker trains on an equal share of the batch"),
        ]

    def tool_versions(self) -> dict[str, list[str]]:
        """torch and torchvision versions go into the machine snapshot."""
        code = ("import torch, importlib.util as u; v = torch.__version__; "
                "print(v, 'torchvision', __import__('importlib.metadata').metadata.version("
                "'torchvision') if u.find_spec('torchvision') else 'none')")
        return {"torch": [self._python(), "-c", code]}

    @property
    def _opts(self) -> DDPOptions:
        assert isinstance(self.options, DDPOptions)
        return self.options

    def _python(self) -> str:
        return self._opts.python or sys.executable

    def check(self) -> None:
        """torch (and torchvision for the ResNets) importable."""
        for mod in ("torch",) + (("torchvision",) if self._opts.model != "leopard" else ()):
            if importlib.util.find_spec(mod) is None:
                raise WorkloadError(f"ddp workload: model {self._opts.model!r} needs the Python "
                                    f"package {mod!r}: pip install 'tunelab[ddp]'")
        if self._opts.placement == "vnodes":
            from tunelab.bench.ddp.placement import check_vnodes

            check_vnodes()
        from tunelab.bench.ddp.config import parse_data

        data = parse_data(self._resolve_data(self._opts.data))
        if data.path:
            from tunelab.bench.ddp.dataset import index_dataset

            index_dataset(data.path)

    def _resolve_data(self, text: str) -> str:
        """``files:DIR``/``memory:DIR`` with a relative DIR taken from the study file's
        directory (runs start in their own run directories)."""
        kind, sep, path = text.partition(":")
        if not sep or not path or Path(path).expanduser().is_absolute():
            return text
        base = self.study_file.parent if self.study_file is not None else Path.cwd()
        return f"{kind}:{(base / path).resolve()}"

    def settings(self, values: Any) -> dict[str, Any]:
        """The options with the point's same-named parameters (and derived values) applied."""
        def resolve(settings: dict[str, Any]) -> None:
            settings["data"] = self._resolve_data(str(settings["data"]))

        return self.point_options(values, resolve)

    def needs(self, values: Any) -> Needs:
        """``workers`` processes on ``nodes`` nodes, one thread each."""
        settings = self.settings(values)
        return Needs(int(settings["workers"]), int(settings["nodes"]), 1)

    def command(self, ctx: RunContext) -> Command:
        """``python -m tunelab.bench.ddp --workers N --nodes K …``; inside a batch allocation
        with K > 1 nodes: ``srun`` one ``torchrun`` per node (rendezvous on the first, see
        :mod:`tunelab.cluster.nodeenv`), each starting the benchmark's workers."""
        settings = self.settings(ctx.values)
        flags: list[str] = []
        for key, flag in _FLAGS.items():
            value = settings[key]
            if value is not None:
                flags += [flag, str(value)]
        # different seeds per repeat would change nothing measured; keep the data fixed
        py = self._python()
        nodes, workers = int(settings["nodes"]), int(settings["workers"])
        if not ctx.placement.in_allocation:
            return Command(tuple([py, "-m", "tunelab.bench.ddp", *flags]), {}, ctx.run_dir)
        flags[flags.index("--placement") + 1] = "local"  # the scheduler placed the nodes
        if nodes == 1:
            return Command(tuple([py, "-m", "tunelab.bench.ddp", *flags]), {}, ctx.run_dir)
        if settings["read_limit"]:
            raise WorkloadError("ddp workload: --read-limit needs the benchmark's own launcher "
                                "on one node; across the nodes of an allocation each torchrun "
                                "would throttle separately")
        per_node = workers // nodes
        cores = ctx.placement.cores_per_node or ctx.cores
        threads = int(settings["threads"] or max(1, cores // per_node))
        argv = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
                f"--cpus-per-task={cores}", py, "-m", "tunelab.cluster.nodeenv", "--",
                py, "-m", "torch.distributed.run", "--nnodes", str(nodes),
                "--nproc_per_node", str(per_node), "--rdzv_backend", "c10d",
                "--rdzv_id", f"{ctx.run_dir.parent.name}-{ctx.run_dir.name}",
                "--max_restarts", "0", "-m", "tunelab.bench.ddp", *flags]
        env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        return Command(tuple(argv), env, ctx.run_dir)

    @classmethod
    def work(cls, options: Mapping[str, Any], values: Mapping[str, Any],
             foms: Mapping[str, float]) -> list[Work]:
        """Real training arithmetic — samples/s x the model's training FLOPs per sample
        (counted from its shapes by the run), in the precision it computed in (fp16 autocast
        with ``amp`` on a GPU, else fp32; TF32 on a GPU), per device the bound stands for
        (:func:`_training_work`) — and, with a file dataset, the
        read rate against the storage bound of its directory. Emulated compute does no
        arithmetic, so only its reads are judged."""
        s = {**options, **{k: v for k, v in values.items() if k in options}}
        works: list[Work] = []
        rate, per = foms.get("throughput"), foms.get("flops_per_sample")
        if rate and per and not foms.get("compute_emulated"):
            works.append(_training_work(rate * per, foms))
        data, read = str(s.get("data") or ""), foms.get("read_Bps")
        if data.startswith("files:") and read:
            works.append(Work("storage", read, {"directory": data.removeprefix("files:"),
                                                "cache": str(s.get("cache") or "cold")},
                              foms.get("read_bytes"), "dataset read B/s"))
        return works

    def parse(self, stdout: str, stderr: str, run_dir: Path) -> dict[str, float]:
        """The FOMs of the last ``{"benchmark": "ddp", …}`` line of stdout."""
        record = last_json_object(stdout, lambda r: r.get("benchmark") == "ddp")
        if record is not None:
            foms = {name: float(record[name]) for name in FOMS
                    if isinstance(record.get(name), int | float)
                    and not isinstance(record.get(name), bool)}
            for flag in FOM_FLAGS:
                foms[flag] = 1.0 if record.get(flag) else 0.0
            if "throughput" not in foms:
                raise ParseError("the ddp result line has no throughput")
            return foms
        errors = [ln for ln in stderr.splitlines() if ln.startswith("ddp:")]
        hint = f" ({errors[-1]})" if errors else ""
        raise ParseError(f"no ddp result line in the output{hint}")


def _training_work(flops_per_s: float, foms: Mapping[str, float]) -> Work:
    """The run's training FLOP/s as a share of what one GEMM bound stands for: one GPU
    (``tunelab bounds --device cuda`` measures one; every worker has its own), or one host's
    cores with the threads the run's workers used there (all workers of virtual nodes share
    one host)."""
    gpu = bool(foms.get("gpu"))
    precision = "fp16" if gpu and foms.get("amp") else ("tf32" if gpu else "fp32")
    workers = max(1, round(foms.get("workers") or 1))
    if gpu:
        return Work("gemm", flops_per_s / workers, {"precision": precision, "device": "cuda"},
                    None, "training FLOP/s per GPU")
    hosts = max(1, round(foms.get("hosts") or 1))
    variant: dict[str, Any] = {"precision": precision, "device": "cpu"}
    if foms.get("threads"):
        threads = round(foms["threads"] * workers / hosts)
        cores = round(foms.get("host_cores") or 0)
        variant["threads"] = min(threads, cores) if cores > 0 else threads
    return Work("gemm", flops_per_s / hosts, variant, None,
                "training FLOP/s per host" if hosts > 1 else "training FLOP/s")
