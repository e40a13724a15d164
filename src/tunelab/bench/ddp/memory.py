"""The host memory a CPU run needs, estimated before anything starts, so that a batch or a
model too large for this machine is refused in one line instead of exhausting its memory.

Per worker: the input batch (as the loader delivers it and as the step's float input), the
parameters, their gradients and the optimizer's state (SGD's momentum for the ResNets, Adam's
two moments otherwise), DDP's gradient buckets, and the activations the forward pass saves
for the backward pass, counted from one forward pass on PyTorch's ``meta`` device (nothing
is computed or allocated; tensors saved twice are counted once). An emulated accelerator
holds only its batch and, with ``--allreduce real``, gradient buffers of the model's size.
Every worker of every node counts against this host (local and virtual nodes share it).

The activation count errs high (measured on the CPU: ResNet-50 at 224 px 137 MB per sample
counted, 132 MB seen in the RSS; Leopard 5.3 against 6.6 MB): a run is refused only when the
estimate exceeds what the kernel says is available (``MemAvailable``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tunelab.errors import WorkloadError

if TYPE_CHECKING:
    from tunelab.bench.ddp.config import DDPConfig

__all__ = ["check_memory", "worker_bytes"]

_GB = 1e9


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

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        saved[id(base)] = base.numel() * base.element_size()
        return t

    batch = 2  # BatchNorm in training mode needs more than one value per channel
    x = torch.empty(batch, *spec.sample_shape, device="meta")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model.train()(x)
    return params, sample, (sum(saved.values()) + out.numel() * out.element_size()) // batch


def worker_bytes(cfg: DDPConfig) -> int:
    """Host bytes one worker of ``cfg`` needs on the CPU (see the module's docstring)."""
    params, sample, activations = _per_sample(cfg)
    batch = cfg.local_batch * sample * 2  # the batch as delivered and as the step's input
    ddp = cfg.workers > 1 and cfg.allreduce_mode == "real"
    if cfg.compute_mode.emulated:
        return batch + (4 * params if ddp else 0)
    states = 1 if cfg.model in ("resnet18", "resnet50") else 2  # SGD momentum, Adam
    return batch + 4 * params * (2 + states + (1 if ddp else 0)) + cfg.local_batch * activations


def check_memory(cfg: DDPConfig, available: int) -> None:
    """:class:`WorkloadError` when the workers of ``cfg`` on this host need more than
    ``available`` bytes."""
    one = worker_bytes(cfg)
    need = one * cfg.workers
    if need <= available:
        return
    raise WorkloadError(
        f"--model {cfg.model} --batch-size {cfg.batch_size} on {cfg.workers} worker(s) needs "
        f"about {need / _GB:,.1f} GB of memory ({one / _GB:,.1f} GB per worker: batch, "
        f"parameters, gradients, optimizer state, saved activations), but {available / _GB:,.1f}"
        f" GB is available here: use a smaller --batch-size or {_size_option(cfg.model)}")


def _size_option(model: str) -> str:
    return {"leopard": "--window", "unet3d": "--patch"}.get(model, "--image-size")
