"""The host memory a CPU run needs, estimated before anything starts, so that a batch or a
model too large for this machine is refused in one line instead of exhausting its memory.

Per worker: the runtime (this process's private, anonymous memory once torch is loaded and
the model built on PyTorch's ``meta`` device, times :data:`RUNTIME_FACTOR`: a worker also
loads gloo, DDP and the data source), the input batch (as the loader delivers it and as the
step's float input), the parameters, their gradients and the optimizer's state (SGD's
momentum for the ResNets, Adam's two moments otherwise), DDP's gradient buckets, and the
activations the forward pass saves for the backward pass, counted from one forward pass on
the ``meta`` device (nothing is computed or allocated; tensors saved twice are counted once;
the weights a layer saves are the parameters, counted once above, not per sample) times
:data:`ACTIVATION_FACTOR` (the backward pass's gradients of the activations and the
allocator's slack on top of them). An emulated accelerator holds only the runtime, its batch
and, with ``--allreduce real``, gradient buffers of the model's size.

Per job (:func:`job_bytes`): every worker of every node (local and virtual nodes share this
host), one torchrun agent per node (:data:`AGENT_FACTOR` of the runtime), and once the
file-backed pages of this process (torch's shared libraries: about 90 MB of a 320 MB resident
set), which every process maps and the kernel holds once — counted per worker, as before,
they added about 0.12 GB per worker (64 emulated ResNet-50 workers: 28.4 GB estimated, and
refused with 23 GB available, for a job that peaks at 15.8 GB; now 20.2 GB).

Estimate against the peak RSS of a real worker (``tunelab bench ddp --workers 1 --threads 1
--steps 3``, the largest RSS of the processes it waited for; docs/workloads/ddp.md "Memory")
and against the peak of a whole job of N workers (the sum of the Pss of the job's processes,
sampled), 2-core AMD EPYC, torch 2.13 CPU: between 1.0x and 1.3x. A run is refused only when
the estimate exceeds what the kernel says is available (``MemAvailable``).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, NamedTuple

from tunelab.errors import WorkloadError

if TYPE_CHECKING:
    from tunelab.bench.ddp.config import DDPConfig

__all__ = ["ACTIVATION_FACTOR", "AGENT_FACTOR", "RUNTIME_FACTOR", "Runtime", "check_memory",
           "job_bytes", "runtime", "shared_bytes", "worker_bytes"]

_GB = 1e9

ACTIVATION_FACTOR = 1.7
"""Peak bytes per saved-activation byte: the saved activations, and the gradients of the
activations the backward pass holds beside them (fitted: 1.54 for ResNet-18 at 112 px, b8 to
b128; with a margin)."""

RUNTIME_FACTOR = 1.3
"""A worker's private memory without batch, model or activations, per byte of this process's
private memory once torch is loaded and the model built on ``meta`` (0.235 GB here; an
emulated worker's 0.246 GB, a real one's intercept about 0.27 GB; with a margin)."""

AGENT_FACTOR = 0.75
"""A node's torchrun agent's private memory per byte of this process's (0.153 GB measured
against 0.235 GB; with a margin)."""


class Runtime(NamedTuple):
    """This process's resident memory once torch is loaded and the model built on ``meta``."""

    private: int
    """Anonymous (and shmem) bytes: each worker holds its own."""
    shared: int
    """File-backed bytes (the shared libraries' pages): the kernel holds them once for every
    process that maps them."""


_RUNTIME_FALLBACK = Runtime(int(0.4 * _GB), int(0.1 * _GB))


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
def runtime() -> Runtime:
    """This process's resident set split into private (``RssAnon`` + ``RssShmem``) and
    file-backed (``RssFile``) bytes, read once (after the first meta forward); 0.4 + 0.1 GB
    where it cannot be read."""
    found: dict[str, int] = {}
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("RssAnon", "RssFile", "RssShmem"):
                    found[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return _RUNTIME_FALLBACK
    if "RssAnon" not in found or "RssFile" not in found:
        return _RUNTIME_FALLBACK
    return Runtime(found["RssAnon"] + found.get("RssShmem", 0), found["RssFile"])


def worker_bytes(cfg: DDPConfig, rt: Runtime | None = None) -> int:
    """Private host bytes one worker of ``cfg`` needs on the CPU (see the module's docstring);
    ``rt``: this process's runtime (default :func:`runtime`, read after the meta forward),
    of which a worker holds the private part times :data:`RUNTIME_FACTOR`. The shared
    libraries' pages are not in it: :func:`job_bytes` counts them once."""
    params, sample, activations = _per_sample(cfg)
    own = int((runtime() if rt is None else rt).private * RUNTIME_FACTOR)
    batch = cfg.local_batch * sample * 2  # the batch as delivered and as the step's input
    ddp = cfg.workers > 1 and cfg.allreduce_mode == "real"
    if cfg.compute_mode.emulated:
        return own + batch + (4 * params if ddp else 0)
    states = 1 if cfg.model in ("resnet18", "resnet50") else 2  # SGD momentum, Adam
    # DDP's buckets (a copy of the gradients) and gloo's working copy while it reduces them
    return (own + batch + 4 * params * (2 + states + (2 if ddp else 0))
            + math.ceil(cfg.local_batch * activations * ACTIVATION_FACTOR))


def shared_bytes(cfg: DDPConfig, rt: Runtime | None = None) -> int:
    """What the job holds once, not per worker: one torchrun agent per node
    (:data:`AGENT_FACTOR` of the private runtime) and the shared libraries' pages."""
    rt = runtime() if rt is None else rt
    return cfg.nodes * int(rt.private * AGENT_FACTOR) + rt.shared


def _need(cfg: DDPConfig, rt: Runtime | None) -> tuple[int, int, int]:
    """The job's bytes, one worker's, and those held once."""
    one = worker_bytes(cfg, rt)  # first: reads the runtime after the meta forward
    once = shared_bytes(cfg, rt)
    return cfg.workers * one + once, one, once


def job_bytes(cfg: DDPConfig, rt: Runtime | None = None) -> int:
    """Host bytes the whole job of ``cfg`` needs on the CPU: every worker's private bytes
    (:func:`worker_bytes`) and, once, :func:`shared_bytes`; ``rt`` default :func:`runtime`."""
    return _need(cfg, rt)[0]


def check_memory(cfg: DDPConfig, available: int, rt: Runtime | None = None) -> None:
    """:class:`WorkloadError` when the job of ``cfg`` on this host needs more than
    ``available`` bytes (:func:`job_bytes`)."""
    need, one, once = _need(cfg, rt)
    if need <= available:
        return
    raise WorkloadError(
        f"--model {cfg.model} --batch-size {cfg.batch_size} on {cfg.workers} worker(s) needs "
        f"about {need / _GB:,.1f} GB of memory ({one / _GB:,.1f} GB per worker: runtime, batch, "
        f"parameters, gradients, optimizer state, activations; {once / _GB:,.1f} GB once: "
        f"torchrun and the shared libraries), but {available / _GB:,.1f}"
        f" GB is available here: use a smaller --batch-size or {_size_option(cfg.model)}")


def _size_option(model: str) -> str:
    return {"leopard": "--window", "unet3d": "--patch"}.get(model, "--image-size")
