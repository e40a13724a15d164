"""The one training step: what a benchmark worker runs every step and what ``calibrate`` times.

:func:`training_step` prepares the model (channels-last on CUDA for the ResNets, cuDNN's
kernels chosen by timing them), wraps it in DDP when gradients are all-reduced (more than one
worker and ``--allreduce real``), and returns a :class:`TrainStep`: input conversion (uint8
images normalised on the device), forward under autocast (fp16 on CUDA with a gradient
scaler, fp32 elsewhere), backward with DDP's bucketed all-reduce overlapping it, the optimizer
(SGD with momentum for the ResNets, Adam otherwise). Calibrate builds the same step with one
worker, so a profile it writes is the benchmark's own step on that device;
:attr:`TrainStep.setup` says how it ran (precision, memory format, optimizer) and goes into
the profile.

:func:`emulated_step` is the step of an emulated accelerator: a wait of the profile's
seconds, with the all-reduce real (gloo over the host), emulated (the fabric's time from
:mod:`tunelab.bench.ddp.fabric`, overlapped with the backward part) or off.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from tunelab.bench.ddp.fabric import Link
    from tunelab.bench.ddp.models import ModelSpec

__all__ = ["AMP_PRECISION", "StepParts", "StepSetup", "TrainStep", "emulated_step",
           "gemm_precision", "training_step"]

AMP_PRECISION = "fp16"
"""The autocast precision of a real step under ``--amp`` (with a gradient scaler): the step
computes in it and its in-run bound (:func:`gemm_precision`) times the GEMM in it."""
_AUTOCAST = {"fp16": "float16", "bf16": "bfloat16"}

#: (compute_s, allreduce_s, exposed_s, other_s, bytes all-reduced, peer_s, comm_busy_s):
#: ``peer_s`` is the part of ``exposed_s`` spent waiting for the other workers at the step's
#: meeting, beyond the all-reduce's own time (known under ``--allreduce emulate`` only; 0
#: otherwise); ``comm_busy_s`` the all-reduce's own time (some bucket being reduced, or the
#: emulated fabric's), where ``allreduce_s`` is the window from the first bucket to the last
StepParts = tuple[float, float, float, float, int, float, float]


@dataclass(frozen=True)
class StepSetup:
    """How a real step runs: autocast precision, memory format, optimizer, DDP or not."""

    precision: str
    memory_format: str
    optimizer: str
    ddp: bool


class TrainStep:
    """One real training step on a batch (call it with inputs and targets); its parts."""

    def __init__(self, setup: StepSetup, fn: Any) -> None:
        self.setup = setup
        self._fn = fn

    def __call__(self, x: Any, y: Any) -> StepParts:
        return self._fn(x, y)


def gemm_precision(device_type: str, amp: bool) -> str:
    """The arithmetic a real step's convolutions and products run in, named as
    :mod:`tunelab.bounds.compute` names a GEMM's: :data:`AMP_PRECISION` under ``amp``; else
    ``tf32`` on a GPU where cuDNN may use it (torch's default for convolutions, which carry
    the models' work), ``fp32`` otherwise."""
    if amp:
        return AMP_PRECISION
    if device_type == "cuda":
        import torch

        return "tf32" if torch.backends.cudnn.allow_tf32 else "fp32"
    return "fp32"


def training_step(model: torch.nn.Module, spec: ModelSpec, device: torch.device, amp: bool,
                  *, ddp: bool, bucket_mb: float = 25.0) -> TrainStep:
    """The real step (see the module's docstring) of ``model`` on ``device``."""
    import torch

    from tunelab.bench.ddp.comm import CommTimer

    cuda = device.type == "cuda"
    if cuda:  # as torchvision's reference training does: cuDNN times each convolution's
        # candidate kernels once per shape (the warm-up steps) and keeps the fastest
        torch.backends.cudnn.benchmark = True
    channels_last = cuda and spec.task == "classify"
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    net: torch.nn.Module = model
    timer: CommTimer | None = None
    if ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = DDP(model, device_ids=[device] if cuda else None, bucket_cap_mb=bucket_mb)
        timer = CommTimer(None, device)
        hook = timer
        # a plain callable: DDP rejects hooks whose annotations are strings (PEP 563)
        net.register_comm_hook(None, lambda state, bucket: hook(state, bucket))
    if spec.task in ("classify", "segment3d"):
        loss_fn: Any = torch.nn.CrossEntropyLoss()
    else:
        loss_fn = torch.nn.BCEWithLogitsLoss()
    if spec.task == "classify":
        opt: torch.optim.Optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    else:
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    amp_dtype = getattr(torch, _AUTOCAST[AMP_PRECISION])

    def prepare(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dtype == torch.uint8:  # decoded images: normalise on the device
            x = (x.float().div_(255) - mean) / std
        if channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=fmt)
        if spec.task == "segment3d":
            y = y.long()
        return x, y

    # the step's own stream, not the whole device: --decode gpu decodes the next batch on
    # another stream meanwhile (DDP makes this stream wait for its all-reduce)
    stream = torch.cuda.current_stream(device) if cuda else None

    def step(x: torch.Tensor, y: torch.Tensor) -> StepParts:
        ev0 = None
        if stream is not None:
            stream.synchronize()
            ev0 = torch.cuda.Event(enable_timing=True)
            ev0.record()
        t0 = time.perf_counter()
        x, y = prepare(x, y)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp):
            loss = loss_fn(net(x), y)
        scaler.scale(loss).backward()
        if stream is not None:
            stream.synchronize()
        t1 = time.perf_counter()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        if stream is not None:
            stream.synchronize()
        t2 = time.perf_counter()
        comm = timer.take(t0, ev0) if timer is not None else None
        if comm is None:
            return t1 - t0, 0.0, 0.0, t2 - t1, 0, 0.0, 0.0
        compute_end = min(comm.last_launch, t1)
        return (compute_end - t0, comm.done - comm.first_launch, max(0.0, t1 - compute_end),
                t2 - t1, comm.bytes, 0.0, comm.busy)

    setup = StepSetup(f"{AMP_PRECISION}-amp" if amp else "fp32",
                      "channels_last" if channels_last else "contiguous",
                      type(opt).__name__, ddp)
    return TrainStep(setup, step)


def emulated_step(seconds: float, mode: str, world: int, *, buckets: Sequence[Any] = (),
                  bucket_bytes: Sequence[int] = (), link: Link | None = None,
                  device: Any = "cpu") -> Any:
    """The step of an emulated accelerator: wait ``seconds``; then, by ``mode``:

    * ``real``: all-reduce ``buckets`` (tensors of DDP's layout) over the process group;
    * ``emulate``: a ring all-reduce of ``bucket_bytes`` on ``link`` overlapped with the
      backward part of the wait (:func:`tunelab.bench.ddp.fabric.plan_allreduce`). DDP's
      last bucket is reduced only once every worker has computed it, so the step ends the
      modelled exposed time after the *last* worker's compute ends: when the backward part
      begins, the workers all-reduce (max) the wall-clock time their compute will end (one
      number on ``device``, so the exchange's own latency hides in the backward part as
      DDP's first bucket's does), and each waits for that time. A worker that waited for
      data holds the others up as a real all-reduce would; the wait is returned apart
      (``peer_s``, inside ``exposed_s``). Across hosts the wall clocks must agree (NTP);
    * ``off``: nothing.

    One worker does no all-reduce in any mode."""
    import torch
    import torch.distributed as dist

    from tunelab.bench.ddp.comm import emulated_allreduce
    from tunelab.bench.ddp.fabric import BACKWARD_SHARE, plan_allreduce

    if world <= 1:
        mode = "off"
    plan = None
    if mode == "emulate":
        assert link is not None
        plan = plan_allreduce(bucket_bytes, world, link, seconds)
    forward = seconds * (1.0 - BACKWARD_SHARE)

    def step(x: Any, y: Any) -> StepParts:
        t0 = time.perf_counter()
        if plan is None:
            time.sleep(seconds)
            t_c = time.perf_counter()
            if mode == "real":
                comm = emulated_allreduce(buckets, world)
                t1 = time.perf_counter()
                return (t_c - t0, comm.done - comm.first_launch, t1 - t_c, 0.0, comm.bytes,
                        0.0, comm.busy)
            return t_c - t0, 0.0, 0.0, 0.0, 0, 0.0, 0.0
        ends = torch.tensor([time.time() + seconds], dtype=torch.float64, device=device)
        _sleep_until(t0 + forward)
        work = dist.all_reduce(ends, op=dist.ReduceOp.MAX, async_op=True)
        _sleep_until(t0 + seconds)
        t_c = time.perf_counter()
        if work is not None:
            work.wait()
        last = float(ends.item())  # when the last worker's compute ends
        _sleep_until(time.perf_counter() + (last - time.time()))
        t_m = time.perf_counter()  # every worker has its last bucket: the tail goes on the ring
        _sleep_until(t_m + plan.exposed)
        t1 = time.perf_counter()
        return t_c - t0, plan.window, t1 - t_c, 0.0, plan.bytes, t_m - t_c, plan.fabric_s

    return step


def _sleep_until(t: float) -> None:
    left = t - time.perf_counter()
    if left > 0:
        time.sleep(left)
