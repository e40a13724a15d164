"""Set-up of a training run: its configuration, data, model, optimiser, precision, compile.

:func:`prepare_training` turns a :class:`TrainConfig` into everything the training loop of
:mod:`tunelab.leopard.train` starts from (a :class:`TrainingSetup`): the CPU threads, the
windows (:class:`WindowSource`: a genome or pre-extracted ``.npz`` arrays), the step count and
global batch, mixed precision (autocast dtype, gradient scaler), the model (BatchNorm
momentum, synchronised BatchNorm, the measured or asked CPU layout), DDP, ``torch.compile``,
Adam and the scaled learning rate, and the output directory. torch is imported lazily.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tunelab.leopard import distributed as D
from tunelab.leopard.data import (
    ChromosomeSet,
    WindowBatch,
    load_chromosomes,
    load_manifest,
)
from tunelab.leopard.errors import LeopardError
from tunelab.leopard.windows import WindowArrays, eval_starts, load_windows

if TYPE_CHECKING:
    import torch

    from tunelab.leopard.model import Architecture

__all__ = ["TrainConfig", "TrainLog", "TrainingSetup", "WindowSource", "prepare_training"]


@dataclass
class TrainConfig:
    """Everything a training run depends on."""

    data: Path
    out: Path
    window: int | None = None  # None: from the .npz files, else 10240
    in_channels: int = 5
    base_filters: int = 15
    depth: int = 5
    kernel_size: int = 7
    batch_size: int = 64
    lr: float = 1e-3
    lr_scaling: str = "none"
    warmup_epochs: float = 0.0
    epochs: int = 10
    steps_per_epoch: int | None = None
    patience: int = 5
    augment_scale: float = 0.1
    bn_momentum: float = 0.01  # PyTorch convention; Keras' 0.99
    max_eval_windows: int | None = 256
    seed: int = 0
    sync_bn: bool = False
    device: str = "auto"
    amp: bool | None = None  # None: on CUDA only; True on a CPU: bf16 autocast
    compile: bool = False
    layout: str = "auto"  # CPU convolutions: "1d", "2d" (channels-last) or "auto" (measured)
    threads: int | None = None
    resume: bool = False
    progress: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------- data sources


class WindowSource:
    """Windows by id: a genome (ids are global starts) or fixed arrays (ids are indices)."""

    def __init__(self, cs: ChromosomeSet | None, arrays: WindowArrays | None, window: int,
                 name: str) -> None:
        self.cs, self.arrays, self.window, self.name = cs, arrays, window, name

    def n_distinct(self) -> int:
        if self.arrays is not None:
            return len(self.arrays)
        assert self.cs is not None
        return self.cs.n_positions(self.window)

    def bases(self) -> int:
        if self.arrays is not None:
            return len(self.arrays) * self.window
        assert self.cs is not None
        return self.cs.total_length

    def plan(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.arrays is not None:
            k = math.ceil(n / len(self.arrays))
            return np.concatenate([rng.permutation(len(self.arrays)) for _ in range(k)])[:n]
        assert self.cs is not None
        return self.cs.sample_starts(n, self.window, rng)

    def eval_ids(self, max_eval: int | None, seed: int) -> np.ndarray:
        if self.arrays is not None:
            return np.arange(len(self.arrays))
        assert self.cs is not None
        return eval_starts(self.cs, self.window, max_eval, seed)

    def get(self, ids: np.ndarray) -> WindowBatch:
        if self.arrays is not None:
            return self.arrays.take(ids)
        assert self.cs is not None
        return self.cs.gather(ids, self.window)


def _open_sources(cfg: TrainConfig, multiple: int) -> tuple[dict[str, WindowSource], int]:
    data = Path(cfg.data)
    need_avg = cfg.in_channels == 6
    if data.is_dir() and (data / "train.npz").is_file():
        sources = {}
        window = None
        for split in ("train", "val", "test"):
            arr = load_windows(data / f"{split}.npz")
            if window is None:
                window = arr.window
            elif arr.window != window:
                raise LeopardError(f"{arr.source}: window length {arr.window} differs from "
                                   f"train.npz's {window}")
            if need_avg and arr.batch.dnase_avg is None:
                raise LeopardError(f"{arr.source}: 6 input channels need 'dnase_avg' windows")
            sources[split] = WindowSource(None, arr, arr.window, arr.source)
        assert window is not None
        if cfg.window is not None and cfg.window != window:
            raise LeopardError(f"{data}: windows are {window} bp long, --window asks "
                               f"{cfg.window}")
        if window % multiple:
            raise LeopardError(f"{data}: window length {window} is not divisible by "
                               f"{multiple}")
        return sources, window
    window = cfg.window if cfg.window is not None else 10240
    if window <= 0 or window % multiple:
        raise LeopardError(f"window length {window} is not divisible by {multiple}")
    m = load_manifest(data)
    sources = {s: WindowSource(load_chromosomes(m, m.chromosomes(s), need_avg=need_avg), None,
                               window, f"{m.path} ({s})") for s in ("train", "val", "test")}
    for s, src in sources.items():
        if src.n_distinct() == 0:
            raise LeopardError(f"{m.path}: no {s} chromosome is as long as the window "
                               f"({window} bp)")
    return sources, window


# ------------------------------------------------------------------------- helpers


def _setup_threads(cfg: TrainConfig, ctx: D.DistContext) -> None:
    import torch

    if ctx.device.type != "cpu":
        return
    if cfg.threads:
        n = cfg.threads
    elif os.environ.get("OMP_NUM_THREADS"):
        n = int(os.environ["OMP_NUM_THREADS"])
    else:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        n = max(1, (os.cpu_count() or 1) // local_world)
    torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # already set, or parallel work started
        torch.set_num_interop_threads(1)


class TrainLog:
    """Messages for stderr (rank 0's only), and whether rank 0 shows progress bars."""

    def __init__(self, ctx: D.DistContext, progress: bool | None) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, soft_wrap=True)
        self.main = ctx.is_main
        self.progress = ctx.is_main and (self.console.is_terminal if progress is None
                                         else progress)

    def __call__(self, msg: str) -> None:
        if self.main:
            self.console.print(msg, highlight=False)


def _compiled(net: torch.nn.Module, log: TrainLog) -> torch.nn.Module:
    """``torch.compile(net)``, falling back to eager (logged) where Inductor cannot work."""
    import torch

    from tunelab.leopard.runtime import has_cxx_compiler

    if not has_cxx_compiler():
        log("warning: --compile needs a C++ compiler; training eagerly")
        return net
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True  # a graph that fails to compile runs eagerly
    log("compiling the model (torch.compile); the first step takes a while")
    return torch.compile(net)  # type: ignore[return-value]


# ------------------------------------------------------------------------- set-up


@dataclass
class TrainingSetup:
    """What the training loop starts from (see :func:`prepare_training`)."""

    log: TrainLog
    arch: Architecture
    sources: dict[str, WindowSource]
    window: int
    global_batch: int  # batch_size * world_size
    steps: int  # per epoch
    cuda: bool
    amp: bool
    amp_dtype: torch.dtype
    model: torch.nn.Module  # the plain model: its weights, train()/eval(), evaluation
    net: torch.nn.Module  # what a training step calls: the model, wrapped by DDP, compiled
    counts: dict[str, int]  # parameter counts
    layout: str  # the CPU convolution layout chosen for training
    lr_target: float  # the learning rate after warm-up, scaled for the world size
    opt: torch.optim.Adam
    scaler: torch.amp.GradScaler
    out: Path


def prepare_training(cfg: TrainConfig, ctx: D.DistContext) -> TrainingSetup:
    """Check ``cfg``, open the data and build the model, optimiser and output directory."""
    import torch

    from tunelab.leopard.model import Architecture, LeopardUNet, count_parameters
    from tunelab.leopard.runtime import choose_training_layout, has_cxx_compiler

    _setup_threads(cfg, ctx)
    log = TrainLog(ctx, cfg.progress)
    arch = Architecture(in_channels=cfg.in_channels, base_filters=cfg.base_filters,
                        depth=cfg.depth, kernel_size=cfg.kernel_size)
    if cfg.batch_size < 1 or cfg.epochs < 1 or cfg.lr <= 0:
        raise LeopardError("batch size and epochs must be >= 1 and lr > 0")
    sources, window = _open_sources(cfg, arch.multiple)
    gb = cfg.batch_size * ctx.world
    train_src = sources["train"]
    if gb > train_src.n_distinct():
        raise LeopardError(
            f"{train_src.name}: batch size {cfg.batch_size} x {ctx.world} worker(s) = {gb} "
            f"is larger than the {train_src.n_distinct()} training windows")
    steps = cfg.steps_per_epoch or max(1, train_src.bases() // (window * gb))
    cuda = ctx.device.type == "cuda"
    amp = cuda if cfg.amp is None else cfg.amp
    amp_dtype = (torch.float16 if cuda and not torch.cuda.is_bf16_supported()
                 else torch.bfloat16)
    if amp and not cuda:
        from tunelab.leopard.runtime import bf16_capable, cpu_flags

        if not bf16_capable(cpu_flags()):
            log("warning: --amp on a CPU without native bf16 (no avx512_bf16/amx_bf16): "
                "bf16 is emulated there and much slower than fp32")
    if cuda:
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(cfg.seed)
    model: torch.nn.Module = LeopardUNet(arch)
    counts = count_parameters(model)
    for mod in model.modules():
        if isinstance(mod, torch.nn.BatchNorm1d):
            mod.momentum = cfg.bn_momentum
    if cfg.sync_bn:
        model = D.convert_sync_batchnorm(model, ctx)
    model.to(ctx.device)
    chosen_layout = "1d"
    if isinstance(model, LeopardUNet):
        layout, why = choose_training_layout(model, cfg.layout, cfg.batch_size, window,
                                             amp_dtype if amp and not cuda else None,
                                             compiled=cfg.compile and has_cxx_compiler())
        model.channels_last_training = layout == "2d"
        chosen_layout = layout
        log(f"training layout {layout}: {why}")
    net: torch.nn.Module = model
    if ctx.distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = DDP(model, device_ids=[ctx.device.index] if cuda else None)
    if cfg.compile:
        net = _compiled(net, log)
    lr_target = D.scaled_lr(cfg.lr, ctx.world, cfg.lr_scaling)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, eps=1e-7)
    scaler = torch.amp.GradScaler("cuda", enabled=amp and cuda and
                                  amp_dtype == torch.float16)
    out = Path(cfg.out)
    if ctx.is_main:
        out.mkdir(parents=True, exist_ok=True)
    return TrainingSetup(log=log, arch=arch, sources=sources, window=window, global_batch=gb,
                         steps=steps, cuda=cuda, amp=amp, amp_dtype=amp_dtype, model=model,
                         net=net, counts=counts, layout=chosen_layout, lr_target=lr_target,
                         opt=opt, scaler=scaler, out=out)
