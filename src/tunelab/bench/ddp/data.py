"""Where a worker's batches come from: the data seam of the benchmark.

A :class:`DataSource` hands out one local batch per step, already on the worker's device.
``synthetic`` (the only source so far) makes one random batch of the model's input shape
once and serves it every step, as the synthetic-data modes of the Horovod and torchvision
benchmarks do: the figures then measure training and communication, not input. Sources that
read samples (from memory or files) plug in here through :func:`make_source`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from tunelab.bench.ddp.models import ModelSpec
from tunelab.errors import WorkloadError

if TYPE_CHECKING:
    import torch

__all__ = ["DataSource", "SyntheticSource", "make_source"]


class DataSource(Protocol):
    """One worker's supply of batches."""

    name: str

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of ``step`` (on the worker's device)."""
        ...


class SyntheticSource:
    """The same random batch every step (ImageNet-shaped images with class labels, or DNA
    windows with per-base 0/1 targets), generated once from ``seed``."""

    name = "synthetic"

    def __init__(self, spec: ModelSpec, local_batch: int, device: torch.device,
                 seed: int) -> None:
        import torch

        gen = torch.Generator().manual_seed(seed)
        x = torch.randn((local_batch, *spec.sample_shape), generator=gen)
        if spec.task == "classify":
            y = torch.randint(0, spec.classes, (local_batch,), generator=gen)
        else:
            y = (torch.rand((local_batch, spec.sample_shape[-1]), generator=gen) < 0.1).float()
        self._x = x.to(device)
        self._y = y.to(device)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch (the same tensors every step)."""
        return self._x, self._y


def make_source(kind: str, spec: ModelSpec, local_batch: int, device: torch.device,
                seed: int) -> DataSource:
    """The data source named ``kind`` for this worker."""
    if kind == "synthetic":
        return SyntheticSource(spec, local_batch, device, seed)
    raise WorkloadError(f"--data: unknown source {kind!r}; choose one of synthetic")
