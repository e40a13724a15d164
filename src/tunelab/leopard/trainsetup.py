"""Set-up of a training run: its configuration, data, model, optimiser, precision, compile.

:func:`prepare_training` turns a :class:`TrainConfig` into everything the training loop of
:mod:`tunelab.leopard.train` starts from (a :class:`TrainingSetup`): the CPU threads, the
windows (:class:`WindowSource`: a genome or pre-extracted ``.npz`` arrays; on CUDA also held
on the device or in pinned memory, :mod:`tunelab.leopard.devicedata`), the step count and
global batch, mixed precision (autocast dtype, gradient scaler), the model (BatchNorm
momentum, synchronised BatchNorm, the measured or asked layout), the step (eager or a CUDA
graph, :mod:`tunelab.leopard.trainstep`), DDP, ``torch.compile`` (when asked, or when the job
repays it), Adam (fused on CUDA) and the scaled learning rate, and the output directory. What
was chosen and why is one ``runtime:`` line. torch is imported lazily.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunelab.leopard import distributed as D
from tunelab.leopard.data import (
    Manifest,
    RegionReader,
    load_chromosomes,
    load_manifest,
)
from tunelab.leopard.errors import LeopardError
from tunelab.leopard.genomefiles import fasta_sizes, open_fasta
from tunelab.leopard.windows import WindowSource, load_windows

if TYPE_CHECKING:
    import torch

    from tunelab.leopard.devicedata import DeviceWindows
    from tunelab.leopard.model import Architecture
    from tunelab.leopard.trainstep import Forward, TrainStep

__all__ = ["TrainConfig", "TrainLog", "TrainingSetup", "WindowSource", "prepare_training"]

#: genomes at least this large are loaded by reader processes
PARALLEL_LOAD_BP = 64_000_000
MAX_LOADERS = 8


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
    compile: bool | None = None  # None: when the job repays it (from a measured step rate)
    layout: str = "auto"  # convolutions: "1d", "2d" (channels-last), "2d8" (its channels
    # padded to 8) or "auto" (measured)
    graphs: str = "auto"  # CUDA graphs of the training step: "auto" (measured), "on", "off"
    val_windows: int | None = None  # validation windows drawn at random, not a tiling
    time_limit: float | None = None  # seconds: stop training after the step that passes it
    threads: int | None = None
    resume: bool = False
    progress: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------- data sources


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
            sources[split].check_labels(split)
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
    reader = _loader(m, need_avg)
    sources = {s: WindowSource(load_chromosomes(m, m.chromosomes(s), need_avg=need_avg,
                                                reader=reader),
                               None, window, f"{m.path} ({s})") for s in ("train", "val", "test")}
    for s, src in sources.items():
        if src.n_distinct() == 0:
            raise LeopardError(f"{m.path}: no {s} chromosome is as long as the window "
                               f"({window} bp)")
        names = m.chromosomes(s)
        src.check_labels(s, where=f"{m.labels} ({', '.join(names[:4])}"
                                  f"{' …' if len(names) > 4 else ''})")
    return sources, window


def _loader(m: Manifest, need_avg: bool) -> RegionReader | None:
    """Reader processes for a genome of at least :data:`PARALLEL_LOAD_BP` (one process read
    ~28 Mbp/s, so a human genome took minutes); None: read in this process."""
    from tunelab.leopard.readers import Tracks, region_reader

    workers = min(MAX_LOADERS, len(os.sched_getaffinity(0)) - 1)
    fa = open_fasta(m.fasta)
    sizes = fasta_sizes(fa)
    fa.close()
    total = sum(sizes.get(c, 0) for s in ("train", "val", "test") for c in m.chromosomes(s))
    if total < PARALLEL_LOAD_BP or workers < 2:
        return None
    tracks = Tracks(m.fasta, m.dnase, m.dnase_avg if need_avg else None, difference=False)
    return region_reader(tracks, workers)


# ------------------------------------------------------------------------- helpers


def _setup_threads(cfg: TrainConfig, ctx: D.DistContext) -> int | None:
    """Set and return the CPU threads (None on a GPU): ``--threads``, else
    ``OMP_NUM_THREADS``, else the cores this process may run on (its affinity, as
    ``taskset`` or a batch system's cgroup sets it; not the machine's count) ÷ local workers."""
    import torch

    from tunelab.leopard.runtime import choose_threads

    if ctx.device.type != "cpu":
        return None
    n, given = choose_threads(cfg.threads)
    if not given:
        n = max(1, n // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # already set, or parallel work started
        torch.set_num_interop_threads(1)
    return n


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
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True  # a graph that fails to compile runs eagerly
    log("compiling the model (torch.compile); the first step takes a while")
    return torch.compile(net)  # type: ignore[return-value]


def _decide_compile(asked: bool | None, rate: float | None, windows: int,
                    device_type: str) -> tuple[bool, str]:
    """``(compile, why)``: ``asked`` (True/False), else (None) whether the job's estimated
    eager time at ``rate`` windows/s (measured; None: not measured) repays compiling."""
    from tunelab.leopard.runtime import COMPILE_GUESS_S, COMPILE_PAYBACK, has_cxx_compiler

    if asked is False:
        return False, "not compiled (asked)"
    if device_type == "cpu" and not has_cxx_compiler():
        return False, "not compiled: torch.compile needs a C++ compiler on a CPU"
    if asked:
        return True, "torch.compile (asked)"
    if not rate:
        return False, "not compiled: no measured step rate to judge it by (pass --compile)"
    est = windows / rate
    if est < COMPILE_PAYBACK * COMPILE_GUESS_S:
        return False, (f"not compiled: the job (~{est:.0f} s) is too short to repay "
                       f"torch.compile (~{COMPILE_GUESS_S:.0f} s)")
    return True, f"torch.compile: the job (~{est:.0f} s) repays it"


def _device_feeds(sources: dict[str, WindowSource], device: torch.device,
                  in_channels: int) -> tuple[dict[str, DeviceWindows], str]:
    """Each split's arrays on the GPU while they fit, else in pinned host memory."""
    import torch

    from tunelab.leopard.devicedata import (
        FIT_FRACTION,
        DeviceWindows,
        bytes_needed,
        choose_placement,
    )

    room = FIT_FRACTION * torch.cuda.mem_get_info(device)[0]
    feeds, said = {}, []
    for split, src in sources.items():
        need = bytes_needed(src, in_channels)
        where = choose_placement(device.type, need, room)
        if where.where == "device":
            room -= need
        feeds[split] = DeviceWindows(src, device, where, in_channels)
        said.append(f"{split} {where.why}")
    return feeds, "data: " + "; ".join(said)


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
    layout: str  # the convolution layout chosen for training
    lr_target: float  # the learning rate after warm-up, scaled for the world size
    opt: torch.optim.Adam
    scaler: torch.amp.GradScaler
    out: Path
    step: TrainStep  # one optimisation step: eager or a captured CUDA graph
    forward: Forward  # the evaluation forward pass, likewise
    feeds: dict[str, DeviceWindows] | None  # CUDA: batches made on the device
    runtime: str  # what was chosen and why, one line


def prepare_training(cfg: TrainConfig, ctx: D.DistContext) -> TrainingSetup:
    """Check ``cfg``, open the data and build the model, optimiser and output directory."""
    import torch

    from tunelab.leopard.model import Architecture, LeopardUNet, count_parameters
    from tunelab.leopard.runtime import (
        LAYOUTS,
        choose_training_layout,
        has_cxx_compiler,
        plain_batchnorm,
    )
    from tunelab.leopard.trainstep import (
        Forward,
        TrainStep,
        choose_step_mode,
        make_adam,
        use_cuda_training_kernels,
    )

    threads = _setup_threads(cfg, ctx)
    log = TrainLog(ctx, cfg.progress)
    arch = Architecture(in_channels=cfg.in_channels, base_filters=cfg.base_filters,
                        depth=cfg.depth, kernel_size=cfg.kernel_size)
    if cfg.batch_size < 1 or cfg.epochs < 1 or cfg.lr <= 0:
        raise LeopardError("batch size and epochs must be >= 1 and lr > 0")
    if cfg.val_windows is not None and cfg.val_windows < 1:
        raise LeopardError(f"validation windows must be >= 1, got {cfg.val_windows}")
    if cfg.time_limit is not None and cfg.time_limit <= 0:
        raise LeopardError(f"time limit must be > 0 seconds, got {cfg.time_limit}")
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
    notes = [f"{ctx.device}: " + (f"{'bf16' if amp_dtype == torch.bfloat16 else 'fp16'} "
                                  "autocast" if amp else "fp32")
             + (f", {threads} thread{'s' if threads != 1 else ''}" if threads else "")]
    if amp and not cuda:
        from tunelab.leopard.runtime import bf16_capable, cpu_flags

        if not bf16_capable(cpu_flags()):
            log("warning: --amp on a CPU without native bf16 (no avx512_bf16/amx_bf16): "
                "bf16 is emulated there and much slower than fp32")
    if cuda:
        use_cuda_training_kernels()
    torch.manual_seed(cfg.seed)
    model: torch.nn.Module = LeopardUNet(arch)
    counts = count_parameters(model)
    for mod in model.modules():
        if isinstance(mod, torch.nn.BatchNorm1d):
            mod.momentum = cfg.bn_momentum
    if cfg.sync_bn:
        model = D.convert_sync_batchnorm(model, ctx)
    model.to(ctx.device)
    assert isinstance(model, LeopardUNet)
    plain = plain_batchnorm(model)
    scaler_on = amp and cuda and amp_dtype == torch.float16
    windows_total = cfg.epochs * steps * cfg.batch_size
    rates: dict[str, float] = {}
    if cfg.layout not in LAYOUTS:
        raise LeopardError(f"layout: unknown value {cfg.layout!r}; choose one of "
                           f"{', '.join(LAYOUTS)}")
    if cuda:  # the layout and the step's form, measured together on the device
        layouts = (["1d", "2d", "2d8"] if cfg.layout == "auto" and plain
                   else [cfg.layout if plain and cfg.layout != "auto" else "1d"])
        layout, graph, why, rates = choose_step_mode(
            model, layouts, cfg.graphs, batch=cfg.batch_size, window=window,
            in_channels=cfg.in_channels, ctx=ctx, amp=amp, amp_dtype=amp_dtype,
            scaler_enabled=scaler_on, plain_bn=plain)
        notes.append(f"layout and step {why}")
    else:
        layout, why = choose_training_layout(model, cfg.layout, cfg.batch_size, window,
                                             amp_dtype if amp else None,
                                             compiled=bool(cfg.compile) and has_cxx_compiler(),
                                             rates_out=rates)
        _, graph, step_why, _ = choose_step_mode(
            model, [layout], cfg.graphs, batch=cfg.batch_size, window=window,
            in_channels=cfg.in_channels, ctx=ctx, amp=amp, amp_dtype=amp_dtype,
            scaler_enabled=scaler_on, plain_bn=plain)
        notes.append(f"layout {layout}: {why}; step {step_why}")
    compiled, compile_why = _decide_compile(cfg.compile, max(rates.values(), default=None),
                                            windows_total, ctx.device.type)
    if compiled and not cuda and cfg.layout == "auto" and plain and layout != "2d":
        layout, _ = choose_training_layout(model, "auto", cfg.batch_size, window,
                                           compiled=True)
        notes.append("layout 2d: compiled")
    model.set_training_layout(layout)
    notes.append(compile_why)
    log(f"training layout {layout}: {why}")
    net: torch.nn.Module = model
    if ctx.distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = DDP(model, device_ids=[ctx.device.index] if cuda else None)
    if compiled:
        net = _compiled(net, log)
    lr_target = D.scaled_lr(cfg.lr, ctx.world, cfg.lr_scaling)
    opt = make_adam(model.parameters(), cfg.lr, ctx.device, graph)
    if cuda:
        notes.append("Adam fused" + (", capturable" if graph else ""))
    scaler = torch.amp.GradScaler("cuda", enabled=scaler_on)
    feeds = None
    if cuda:
        feeds, said = _device_feeds(sources, ctx.device, cfg.in_channels)
        notes.append(said)
    else:
        notes.append("data: numpy batches built by a loader thread")
    step = TrainStep(model, net, opt, scaler, ctx, amp, amp_dtype, graph)
    forward = Forward(model, amp, amp_dtype, graph)
    runtime = "; ".join(notes)
    log(f"runtime: {runtime}")
    out = Path(cfg.out)
    if ctx.is_main:
        out.mkdir(parents=True, exist_ok=True)
    return TrainingSetup(log=log, arch=arch, sources=sources, window=window, global_batch=gb,
                         steps=steps, cuda=cuda, amp=amp, amp_dtype=amp_dtype, model=model,
                         net=net, counts=counts, layout=layout, lr_target=lr_target,
                         opt=opt, scaler=scaler, out=out, step=step, forward=forward,
                         feeds=feeds, runtime=runtime)
