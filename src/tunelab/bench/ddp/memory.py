"""The host memory a CPU run needs, estimated before anything starts, so that a batch or a
model too large for this machine is refused in one line instead of exhausting its memory.

Per worker: the runtime (this process's resident memory once torch is loaded and the model
built on PyTorch's ``meta`` device, times :data:`RUNTIME_FACTOR`: a worker also loads gloo,
DDP and the data source), the input batch (as the loader delivers it and as the step's float
input), the parameters, their gradients and the optimizer's state (SGD's momentum for the
ResNets, Adam's two moments otherwise), DDP's gradient buckets, and the activations the
forward pass saves for the backward pass, counted from one forward pass on the ``meta`` device
(nothing is computed or allocated; tensors saved twice are counted once; the weights a layer
saves are the parameters, counted once above, not per sample) times :data:`ACTIVATION_FACTOR`
(the backward pass's gradients of the activations and the allocator's slack on top of them).
An emulated accelerator holds only the runtime, its batch and, with ``--allreduce real``,
gradient buffers of the model's size. Every worker of every node counts against this host
(local and virtual nodes share it).

Estimate against the peak RSS of a real worker (``tunelab bench ddp --workers 1 --threads 1
--steps 3``, the largest RSS of the processes it waited for; docs/workloads/ddp.md "Memory"),
2-core AMD EPYC, torch 2.13 CPU: between 1.0x and 1.3x (before: 0.47x to 2.36x: the saved
weights counted once per sample, and no runtime). A run is refused only when the estimate
exceeds what the kernel says is available (``MemAvailable``).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from tunelab.errors import WorkloadError

if TYPE_CHECKING:
    from tunelab.bench.ddp.config import DDPConfig

__all__ = ["ACTIVATION_FACTOR", "RUNTIME_FACTOR", "check_memory", "runtime_bytes",
           "worker_bytes"]

_GB = 1e9

ACTIVATION_FACTOR = 1.7
"""Peak bytes per saved-activation byte: the saved activations, and the gradients of the
activations the backward pass holds beside them (fitted: 1.54 for ResNet-18 at 112 px, b8 to
b128; with a margin)."""

RUNTIME_FACTOR = 1.3
"""A worker's resident memory without batch, model or activations, per byte of this
process's once torch is loaded and the model built on ``meta`` (0.33 GB here; the workers'
intercept was 0.36 GB; with a margin)."""

_RUNTIME_FALLBACK = int(0.5 * _GB)


def _per_sample(cfg: DDPConfig) -> tuple[int, int, int]:
    """Parameters, input bytes per sample (float), saved-activation bytes per sample."""
    import torch

    from tunelab.bench.ddp.models import build_model

    model, spec = build_model(cfg.model, image_size=cfg.image_size, window=cfg.window,
                              patch=cfg.patch, device="meta")
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    sample = 4 * math.prod(spec.sample_shape)
    if cfg.compute_mode.emulated:
        return params, sample, 0
    saved: dict[int, int] = {}

    own = {id(t) for t in (*model.parameters(), *model.buffers())}

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if id(base) not in own:  # a layer's weight: the parameters, counted once
            saved[id(base)] = base.numel() * base.element_size()
        return t

    batch = 2  # BatchNorm in training mode needs more than one value per channel
    x = torch.empty(batch, *spec.sample_shape, device="meta")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model.train()(x)
    return params, sample, (sum(saved.values()) + out.numel() * out.element_size()) // batch


@functools.cache
def runtime_bytes() -> int:
    """A worker's memory before its batch, model and activations: this process's resident
    set (``VmRSS``) times :data:`RUNTIME_FACTOR`, read once (after the first meta forward);
    0.5 GB where it cannot be read."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(int(line.split()[1]) * 1024 * RUNTIME_FACTOR)
    except (OSError, ValueError, IndexError):
        pass
    return _RUNTIME_FALLBACK


def worker_bytes(cfg: DDPConfig, runtime: int | None = None) -> int:
    """Host bytes one worker of ``cfg`` needs on the CPU (see the module's docstring);
    ``runtime``: the worker's own (default :func:`runtime_bytes`, read after the meta
    forward)."""
    params, sample, activations = _per_sample(cfg)
    runtime = runtime_bytes() if runtime is None else runtime
    batch = cfg.local_batch * sample * 2  # the batch as delivered and as the step's input
    ddp = cfg.workers > 1 and cfg.allreduce_mode == "real"
    if cfg.compute_mode.emulated:
        return runtime + batch + (4 * params if ddp else 0)
    states = 1 if cfg.model in ("resnet18", "resnet50") else 2  # SGD momentum, Adam
    # DDP's buckets (a copy of the gradients) and gloo's working copy while it reduces them
    return (runtime + batch + 4 * params * (2 + states + (2 if ddp else 0))
            + math.ceil(cfg.local_batch * activations * ACTIVATION_FACTOR))


def check_memory(cfg: DDPConfig, available: int) -> None:
    """:class:`WorkloadError` when the workers of ``cfg`` on this host need more than
    ``available`` bytes."""
    one = worker_bytes(cfg)
    need = one * cfg.workers
    if need <= available:
        return
    raise WorkloadError(
        f"--model {cfg.model} --batch-size {cfg.batch_size} on {cfg.workers} worker(s) needs "
        f"about {need / _GB:,.1f} GB of memory ({one / _GB:,.1f} GB per worker: runtime, batch, "
        f"parameters, gradients, optimizer state, activations), but {available / _GB:,.1f}"
        f" GB is available here: use a smaller --batch-size or {_size_option(cfg.model)}")


def _size_option(model: str) -> str:
    return {"leopard": "--window", "unet3d": "--patch"}.get(model, "--image-size")
