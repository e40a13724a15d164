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
(as the loader delivered it: it is never converted for a step; with ``--data memory`` also
its pool of made-up samples; the synthetic source's, made once; 2 x the float batch before:
0.15 GB too many at 128 images of 224 px) and, with ``--allreduce real``, gradient buffers of
the model's size.

Per worker with data-loader processes (``memory`` and ``files:`` sources, ``--loader-workers``
> 0; :func:`loader_bytes`): each loader's own private memory (:data:`LOADER_RUNTIME`: forked
from its worker, it copies the pages it writes) and what it holds while it builds a batch
(:data:`LOADER_BATCH_FACTOR` times the batch as delivered: uint8 images, float volumes; with
``--decode gpu`` the files' bytes; nothing with ``--decode off``, whose batch is a shape; a
volume's whole file, which the loader reads before it crops), and the read-ahead: ``--prefetch``
batches per loader waiting in shared memory for the worker (held by a file descriptor, mapped
by no process until taken, so in no process's resident set). Uncounted before: 8 loaders x
prefetch 2 of 128 images of 224 px held 0.60 GB of loader memory and 0.33 GB of shared memory
beside a worker estimated at 0.3 GB.

Per job (:func:`job_bytes`): every worker of every node (local and virtual nodes share this
host), one torchrun agent per node (:data:`AGENT_FACTOR` of the runtime), and once the
file-backed pages of this process (torch's shared libraries: about 90 MB of a 320 MB resident
set), which every process maps and the kernel holds once — counted per worker, as before,
they added about 0.12 GB per worker (64 emulated ResNet-50 workers: 28.4 GB estimated, and
refused with 23 GB available, for a job that peaks at 15.8 GB; now 20.2 GB).

Estimate against the peak RSS of a real worker (``tunelab bench ddp --workers 1 --threads 1
--steps 3``, the largest RSS of the processes it waited for; docs/workloads/ddp.md "Memory")
and against the peak of a whole job of N workers (the sum of the Pss of the job's processes
and the shared memory its file descriptors hold, sampled), 2-core AMD EPYC, torch 2.13 CPU:
between 1.0x and 1.3x. A run is refused only when the estimate exceeds what the kernel says
is available (``MemAvailable``).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, NamedTuple

from tunelab.bench.ddp.synthetic import memory_pool_size
from tunelab.errors import WorkloadError

if TYPE_CHECKING:
    from tunelab.bench.ddp.config import DDPConfig
    from tunelab.bench.ddp.dataset import DatasetIndex

__all__ = ["ACTIVATION_FACTOR", "AGENT_FACTOR", "LOADER_BATCH_FACTOR", "LOADER_RUNTIME",
           "RUNTIME_FACTOR", "Runtime", "check_loader_memory", "check_memory", "job_bytes",
           "loader_bytes", "runtime",
           "shared_bytes", "worker_bytes"]

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

LOADER_RUNTIME = 40_000_000
"""A data-loader process's private bytes besides the batch it builds (9-29 MB measured; with
a margin)."""

LOADER_BATCH_FACTOR = 3
"""A loader's peak private bytes per byte of the batch it delivers: the decoded samples, the
stacked batch and the decoder's buffers (2.9 measured: JPEGs of ~112 KiB cropped to 224 px,
local batches of 32 and 128)."""


class Runtime(NamedTuple):
    """This process's resident memory once torch is loaded and the model built on ``meta``."""

    private: int
    """Anonymous (and shmem) bytes: each worker holds its own."""
    shared: int
    """File-backed bytes (the shared libraries' pages): the kernel holds them once for every
    process that maps them."""


_RUNTIME_FALLBACK = Runtime(int(0.4 * _GB), int(0.1 * _GB))


class _Model(NamedTuple):
    """What the estimate needs of a model, per sample where it says so."""

    params: int
    sample: int
    """Input bytes per sample as the step takes it (float)."""
    delivered: int
    """Bytes per sample of a batch as a loader delivers it (input and target)."""
    activations: int
    """Saved-activation bytes per sample (0 under emulated compute)."""


def _delivered(task: str, shape: tuple[int, ...]) -> int:
    """Bytes per sample of a loader's batch (:func:`tunelab.bench.ddp.synthetic.random_samples`
    gives the dtypes): uint8 images and an integer label; float volumes and uint8 targets;
    float windows and float targets."""
    n = math.prod(shape)
    if task == "classify":
        return n + 8
    if task == "segment3d":
        return 4 * n + math.prod(shape[1:])
    return 4 * n + 4 * shape[-1]


def _model(cfg: DDPConfig) -> _Model:
    """The model of ``cfg`` built on the ``meta`` device, measured (see the module's text);
    once per model, shape and compute mode (:func:`worker_bytes` and :func:`loader_bytes`
    both read it)."""
    return _measure(cfg.model, cfg.image_size, cfg.window, cfg.patch,
                    cfg.compute_mode.emulated)


@functools.cache
def _measure(name: str, image_size: int, window: int, patch: int, emulated: bool) -> _Model:
    import torch

    from tunelab.bench.ddp.models import build_model

    model, spec = build_model(name, image_size=image_size, window=window, patch=patch,
                              device="meta")
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    sample = 4 * math.prod(spec.sample_shape)
    delivered = _delivered(spec.task, spec.sample_shape)
    if emulated:
        return _Model(params, sample, delivered, 0)
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
    saved_bytes = sum(saved.values()) + out.numel() * out.element_size()
    return _Model(params, sample, delivered, saved_bytes // batch)


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
    params, sample, delivered, activations = _model(cfg)
    own = int((runtime() if rt is None else rt).private * RUNTIME_FACTOR)
    batch = cfg.local_batch * sample * 2  # the batch as delivered and as the step's input
    ddp = cfg.workers > 1 and cfg.allreduce_mode == "real"
    if cfg.compute_mode.emulated:  # the batch is taken, never computed on
        if cfg.data_spec.kind == "synthetic":  # made once, as the step's input
            batch = cfg.local_batch * sample
        elif cfg.decode == "off":  # a view of one zero sample
            batch = 0
        else:  # as a loader delivered it; ``memory`` also holds its pool of made-up samples
            made_up = cfg.data_spec.kind == "memory" and not cfg.data_spec.path
            batch = (cfg.local_batch + (memory_pool_size(cfg.local_batch) if made_up else 0)
                     ) * delivered
        return own + batch + (4 * params if ddp else 0)
    states = 1 if cfg.model in ("resnet18", "resnet50") else 2  # SGD momentum, Adam
    # DDP's buckets (a copy of the gradients) and gloo's working copy while it reduces them
    return (own + batch + 4 * params * (2 + states + (2 if ddp else 0))
            + math.ceil(cfg.local_batch * activations * ACTIVATION_FACTOR))


def loader_bytes(cfg: DDPConfig, index: DatasetIndex | None = None) -> int:
    """Host bytes one worker's data-loader processes need (see the module's docstring): each
    loader's :data:`LOADER_RUNTIME` and :data:`LOADER_BATCH_FACTOR` times the batch it
    delivers, and the read-ahead waiting in shared memory; 0 without loader processes (the
    ``synthetic`` source has none). ``index``: the ``files:`` dataset, whose files' sizes a
    ``--decode gpu`` batch carries and whose largest volume a loader reads whole."""
    loaders = cfg.loader_workers
    if loaders == 0 or cfg.data_spec.kind == "synthetic":
        return 0
    files = index.entries if index is not None else ()
    if cfg.decode == "off":
        delivered, largest = 0, 0  # a blank: its shape only
    elif cfg.decode == "gpu":  # the files' bytes; ImageNet's mean JPEG where none is known
        delivered = max((e.size // max(1, e.samples) for e in files), default=115_000)
        largest = 0
    else:
        delivered = _model(cfg).delivered
        largest = max((e.size for e in files), default=0) if cfg.model == "unet3d" else 0
    batch = cfg.local_batch * delivered
    each = LOADER_RUNTIME + LOADER_BATCH_FACTOR * batch + largest
    return loaders * each + cfg.read_ahead * batch


def shared_bytes(cfg: DDPConfig, rt: Runtime | None = None) -> int:
    """What the job holds once, not per worker: one torchrun agent per node
    (:data:`AGENT_FACTOR` of the private runtime) and the shared libraries' pages."""
    rt = runtime() if rt is None else rt
    return cfg.nodes * int(rt.private * AGENT_FACTOR) + rt.shared


class _Need(NamedTuple):
    """The bytes a job needs, in all and by part."""

    job: int
    worker: int
    """One worker's bytes, its loaders' included."""
    loaders: int
    """One worker's loaders' part of :attr:`worker`."""
    once: int


def _need(cfg: DDPConfig, rt: Runtime | None, index: DatasetIndex | None) -> _Need:
    one = worker_bytes(cfg, rt)  # first: reads the runtime after the meta forward
    loaders = loader_bytes(cfg, index)
    once = shared_bytes(cfg, rt)
    return _Need(cfg.workers * (one + loaders) + once, one + loaders, loaders, once)


def job_bytes(cfg: DDPConfig, rt: Runtime | None = None,
              index: DatasetIndex | None = None) -> int:
    """Host bytes the whole job of ``cfg`` needs on the CPU: every worker's private bytes
    (:func:`worker_bytes`) and its loaders' (:func:`loader_bytes`, ``index``: the ``files:``
    dataset) and, once, :func:`shared_bytes`; ``rt`` default :func:`runtime`."""
    return _need(cfg, rt, index).job


def check_memory(cfg: DDPConfig, available: int, rt: Runtime | None = None,
                 index: DatasetIndex | None = None) -> None:
    """:class:`WorkloadError` when the job of ``cfg`` on this host needs more than
    ``available`` bytes (:func:`job_bytes`)."""
    need = _need(cfg, rt, index)
    if need.job <= available:
        return
    loaders = ""
    if need.loaders:
        loaders = (f", of which {need.loaders / _GB:,.1f} GB its {cfg.loader_workers} loader "
                   f"process(es) and their read-ahead of {cfg.read_ahead} batch(es)")
    fewer = (f"a smaller --batch-size or {_size_option(cfg.model)}"
             if need.loaders * 2 < need.worker else
             "fewer --loader-workers, a smaller --prefetch or a smaller --batch-size")
    raise WorkloadError(
        f"--model {cfg.model} --batch-size {cfg.batch_size} on {cfg.workers} worker(s) needs "
        f"about {need.job / _GB:,.1f} GB of memory ({need.worker / _GB:,.1f} GB per worker: "
        f"runtime, batch, parameters, gradients, optimizer state, activations{loaders}; "
        f"{need.once / _GB:,.1f} GB once: torchrun and the shared libraries), but "
        f"{available / _GB:,.1f} GB is available here: use {fewer}")


def check_loader_memory(cfg: DDPConfig, available: int,
                        index: DatasetIndex | None = None) -> None:
    """:class:`WorkloadError` when the data-loader processes of every worker of ``cfg`` and
    their read-ahead (:func:`loader_bytes`) alone need more than ``available`` host bytes: a
    GPU run's check, whose model lives on the GPUs but whose loaders live on this host."""
    each = loader_bytes(cfg, index)
    if cfg.workers * each <= available:
        return
    raise WorkloadError(
        f"--loader-workers {cfg.loader_workers} --prefetch {cfg.prefetch} of --batch-size "
        f"{cfg.batch_size} on {cfg.workers} worker(s) need about {cfg.workers * each / _GB:,.1f} "
        f"GB of host memory ({each / _GB:,.1f} GB per worker: its loader processes and their "
        f"read-ahead of {cfg.read_ahead} batch(es)), but {available / _GB:,.1f} GB is available "
        "here: use fewer --loader-workers, a smaller --prefetch or a smaller --batch-size")


def _size_option(model: str) -> str:
    return {"leopard": "--window", "unet3d": "--patch"}.get(model, "--image-size")
