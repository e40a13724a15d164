"""The ``leopard`` workload: train the Leopard U-Net and score it (validation PR-AUC).

Each run is ``python -m tunelab.leopard train …`` (under ``python -m torch.distributed.run
--standalone --nproc_per_node N`` when the point asks for ``nproc > 1``); its last stdout
line is a JSON object of figures of merit (``val_pr_auc``, ``test_pr_auc``, ``train_time_s``,
``windows_per_s`` …), which :meth:`LeopardWorkload.parse` reads.

Point values used when present (else the option of the same name): ``batch_size``, ``lr``,
``epochs``, ``steps_per_epoch``, ``window``, ``nproc``, ``threads``, ``lr_scaling``,
``warmup_epochs``, ``sync_bn``, ``bn_momentum``, ``augment_scale``, ``patience``, ``seed``,
``in_channels``; ``nodes`` and ``ppn`` place the processes. A study parameter of another name
is refused when the study is loaded (:attr:`LeopardWorkload.reads`).

Data: ``options.data`` (a ``leopard.json`` data set or a directory of ``.npz`` windows,
relative to the study file). Without it, a synthetic genome is generated once into
``options.cache_dir`` (default ``$TUNELAB_CACHE`` or ``~/.cache/tunelab``, then
``leopard/synthetic-…``) by :meth:`check` (or the first :meth:`command`), so an example
study runs with no manual step.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import sys
from collections.abc import Iterator, Mapping
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

__all__ = ["LeopardOptions", "LeopardWorkload"]


class LeopardOptions(WorkloadOptions):
    """Fixed options of a Leopard study (``workload.options``)."""

    data: str | None = None
    cache_dir: str | None = None
    synth_chroms: int = 6
    synth_length: int = 200_000
    synth_seed: int = 0
    window: int = Field(2048, ge=32)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(1e-3, gt=0, allow_inf_nan=False)
    epochs: int = Field(5, ge=1)
    steps_per_epoch: int | None = Field(25, ge=0)  # 0 or None: whole epochs
    patience: int = Field(5, ge=0)
    in_channels: int = Field(5, ge=5, le=6)
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"
    warmup_epochs: float = Field(0.0, ge=0, allow_inf_nan=False)
    sync_bn: bool = False
    bn_momentum: float = Field(0.01, ge=0, le=1)
    augment_scale: float = Field(0.1, ge=0, allow_inf_nan=False)
    max_eval_windows: int = 256
    seed: int = Field(0, ge=0)
    nproc: int = Field(1, ge=1)
    threads: int | None = Field(None, ge=0)  # 0 or None: the cores / nproc
    device: Literal["auto", "cpu", "cuda"] = "auto"
    python: str | None = None
    extra_args: list[str] = []


_POINT_KEYS = ("batch_size", "lr", "epochs", "steps_per_epoch", "window", "nproc", "threads",
               "lr_scaling", "warmup_epochs", "sync_bn", "bn_momentum", "augment_scale",
               "patience", "seed", "in_channels")


class LeopardWorkload(Workload):
    """Leopard U-Net training (DNA + DNase -> CTCF binding), tuned like the seed team did:
    batch size first, then learning rate; objective validation PR-AUC."""

    name = "leopard"
    description = "Leopard DNA-decoding U-Net training (PyTorch, optional DDP via torchrun)"
    Options = LeopardOptions
    options_from_parameters: ClassVar[bool] = True
    #: the options a point may set and the placement; the others (``data``, ``device``,
    #: ``max_eval_windows``, …) stay the study's, so a parameter of theirs changes nothing
    reads: ClassVar[frozenset[str] | None] = frozenset((*_POINT_KEYS, "nodes", "ppn"))

    @property
    def opts(self) -> LeopardOptions:
        """The options, typed."""
        assert isinstance(self.options, LeopardOptions)
        return self.options

    @property
    def objective(self) -> Objective:
        """Validation PR-AUC, maximised."""
        return Objective("val_pr_auc", "maximize")

    def default_space(self) -> dict[str, Any]:
        """The seed's search: batch sizes, then learning rates."""
        return {"batch_size": [16, 32, 64], "lr": [0.001, 0.0025, 0.005, 0.01]}

    def rules(self) -> list[tuple[str, str]]:
        """Window lengths fit the five 2x poolings; processes x threads fit the machine."""
        return [
            ("window % 32 == 0", "the U-Net halves the window 5 times"),
            ("nproc * threads <= cores", "processes x threads must fit the cores"),
        ]

    def tool_versions(self) -> dict[str, list[str]]:
        """torch's version goes into the machine snapshot."""
        return {"torch": [self._python(), "-c", "import torch; print(torch.__version__)"]}

    # -------------------------------------------------------------------- data

    def _python(self) -> str:
        return self.opts.python or sys.executable

    def _cache_root(self) -> Path:
        if self.opts.cache_dir:
            return self._relative(self.opts.cache_dir)
        base = os.environ.get("TUNELAB_CACHE") or str(Path.home() / ".cache" / "tunelab")
        return Path(base) / "leopard"

    def _relative(self, value: str) -> Path:
        p = Path(value).expanduser()
        if not p.is_absolute() and self.study_file is not None:
            p = Path(self.study_file).parent / p
        return p

    def synthetic_dir(self) -> Path:
        """Where the synthetic data set of these options lives."""
        o = self.opts
        key = json.dumps([o.synth_chroms, o.synth_length, o.synth_seed, 1])
        tag = hashlib.sha256(key.encode()).hexdigest()[:10]
        return self._cache_root() / f"synthetic-{tag}"

    def data_path(self, create: bool = True) -> Path:
        """The data set the runs read: the ``data`` option, or the synthetic cache
        (generated here when absent and ``create``)."""
        if self.opts.data:
            p = self._relative(self.opts.data)
            if not p.exists():
                raise WorkloadError(f"leopard option data: {p} does not exist")
            return p
        target = self.synthetic_dir()
        if (target / "leopard.json").is_file() or not create:
            return target
        from tunelab.leopard.synthetic import SyntheticConfig, write_synthetic

        target.parent.mkdir(parents=True, exist_ok=True)
        with _locked(target.parent / ".lock"):
            if not (target / "leopard.json").is_file():
                write_synthetic(target, SyntheticConfig(
                    n_chroms=self.opts.synth_chroms, chrom_length=self.opts.synth_length,
                    seed=self.opts.synth_seed))
        return target

    def check(self) -> None:
        """torch, pyfaidx and pyBigWig importable; the data set present (or generated)."""
        for mod in ("torch", "pyfaidx", "pyBigWig"):
            if importlib.util.find_spec(mod) is None:
                raise WorkloadError(f"leopard needs the Python package {mod!r}: "
                                    "pip install 'tunelab[leopard]'")
        self.data_path(create=True)

    def check_parameter(self, name: str, value: Any) -> None:
        """A value of a point key (``batch_size``, ``lr``, …) its option refuses (a batch
        of -4, a negative learning rate, 2.5 epochs); other names, and ``sync_bn`` (read as
        yes/no words too), are not the options a point sets."""
        if name in _POINT_KEYS and name != "sync_bn":
            super().check_parameter(name, value)

    # -------------------------------------------------------------------- runs

    def _value(self, values: Any, key: str) -> Any:
        return values[key] if key in values else getattr(self.opts, key)

    def needs(self, values: Any) -> Needs:
        """``nproc`` training processes per node (``ppn`` when given) on ``nodes`` nodes,
        ``threads`` each."""
        nodes = int(values.get("nodes", 1))
        per_node = int(values.get("ppn", self._value(values, "nproc")))
        threads = self._value(values, "threads")
        return Needs(nodes * per_node, nodes, int(threads) if threads else 1)

    def command(self, ctx: RunContext) -> Command:
        """``python -m tunelab.leopard train …`` (via torchrun when ``nproc > 1``; across
        nodes in an allocation: ``srun`` one torchrun per node, rendezvous on the first)."""
        v = {k: self._value(ctx.values, k) for k in _POINT_KEYS}
        if "ppn" in ctx.values:
            v["nproc"] = ctx.values["ppn"]
        nproc = int(v["nproc"])
        if nproc < 1:
            raise WorkloadError(f"leopard: nproc must be >= 1, got {nproc}")
        threads = int(v["threads"]) if v["threads"] else max(1, ctx.cores // nproc)
        data = self.data_path(create=not self.dry_run)
        train = ["-m", "tunelab.leopard", "train",
                 "--data", str(data), "--out", str(ctx.run_dir / "train"),
                 "--window", str(int(v["window"])),
                 "--in-channels", str(int(v["in_channels"])),
                 "--batch-size", str(int(v["batch_size"])),
                 "--lr", repr(float(v["lr"])),
                 "--lr-scaling", str(v["lr_scaling"]),
                 "--warmup-epochs", repr(float(v["warmup_epochs"])),
                 "--epochs", str(int(v["epochs"])),
                 "--patience", str(int(v["patience"])),
                 "--bn-momentum", repr(float(v["bn_momentum"])),
                 "--augment-scale", repr(float(v["augment_scale"])),
                 "--max-eval-windows", str(int(self.opts.max_eval_windows)),
                 # repeats differ by seed: they measure seed-to-seed variation
                 "--seed", str(int(v["seed"]) + ctx.repeat),
                 "--sync-bn" if _truthy(v["sync_bn"]) else "--no-sync-bn",
                 "--device", self.opts.device,
                 "--threads", str(threads), "--no-progress"]
        if v["steps_per_epoch"]:
            train += ["--steps-per-epoch", str(int(v["steps_per_epoch"]))]
        train += list(self.opts.extra_args)
        py = self._python()
        nodes = self.needs(ctx.values).nodes
        if nodes > 1 and ctx.placement.in_allocation:
            argv = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
                    f"--cpus-per-task={nproc * threads}", py, "-m", "tunelab.cluster.nodeenv",
                    "--", py, "-m", "torch.distributed.run", "--nnodes", str(nodes),
                    "--nproc_per_node", str(nproc), "--rdzv_backend", "c10d",
                    "--rdzv_id", f"{ctx.run_dir.parent.name}-{ctx.run_dir.name}", *train]
        elif nproc > 1:
            argv = [py, "-m", "torch.distributed.run", "--standalone",
                    "--nproc_per_node", str(nproc), *train]
        else:
            argv = [py, *train]
        env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        return Command(argv=tuple(argv), env=env, cwd=ctx.run_dir)

    @classmethod
    def work(cls, options: Mapping[str, Any], values: Mapping[str, Any],
             foms: Mapping[str, float]) -> list[Work]:
        """Training arithmetic: windows/s x FLOPs per window (forward and backward, counted
        by the run from the model's shapes), in the precision the run computed in (bf16 or
        fp16 autocast, else fp32; TF32 on a CUDA device)."""
        rate, per = foms.get("windows_per_s"), foms.get("flops_per_window")
        if not rate or not per:
            return []
        cuda = bool(foms.get("cuda"))
        if foms.get("amp"):
            precision = "bf16" if foms.get("amp_bf16") else "fp16"
        else:
            precision = "tf32" if cuda else "fp32"
        variant: dict[str, Any] = {"precision": precision, "device": "cuda" if cuda else "cpu"}
        threads = values.get("threads", options.get("threads"))
        if not cuda and threads:
            variant["threads"] = int(threads)
        return [Work("gemm", rate * per, variant, None, "training FLOP/s")]

    def parse(self, stdout: str, stderr: str, run_dir: Path) -> dict[str, float]:
        """The FOMs of the last JSON-object line of stdout."""
        doc = last_json_object(stdout, lambda r: "val_pr_auc" in r)
        if doc is not None:
            try:
                return {str(k): float(x) for k, x in doc.items()}
            except (TypeError, ValueError) as exc:
                raise ParseError(f"leopard: non-numeric figure of merit ({exc})") from exc
        last = next((ln for ln in reversed(stderr.strip().splitlines()) if ln.strip()),
                    "no output on stderr")
        raise ParseError(f"leopard: no figures-of-merit JSON line in the output ({last[:200]})")


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
