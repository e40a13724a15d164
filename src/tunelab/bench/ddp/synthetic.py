"""Made-up data for the DDP benchmark: random samples of a model's input
(:func:`random_samples`), served as the ``synthetic`` source (:class:`SyntheticSource`: one
batch made once) and as the pool of samples the ``memory`` source holds without a dataset
(:func:`memory_pool_size`), for :mod:`tunelab.bench.ddp.data`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tunelab.bench.ddp.models import ModelSpec

if TYPE_CHECKING:
    import torch

__all__ = ["SyntheticSource", "memory_pool_size", "random_samples"]


def _empty_info(samples: int) -> dict[str, Any]:
    return {"samples": samples, "bytes": 0, "rchar": 0, "device_bytes": 0, "loader": -1,
            "corrupt": 0, "corrupt_files": [], "fatal": ""}


def random_samples(spec: ModelSpec, n: int, gen: torch.Generator,
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random samples of the model's input, in the dtype a loader delivers (images as
    uint8, as decoded JPEGs are)."""
    import torch

    shape = (n, *spec.sample_shape)
    if spec.task == "classify":
        x = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
        y = torch.randint(0, spec.classes, (n,), generator=gen)
    elif spec.task == "segment3d":
        x = torch.randn(shape, generator=gen)
        y = torch.randint(0, spec.classes, (n, *spec.sample_shape[1:]), generator=gen,
                          dtype=torch.uint8)
    else:
        x = torch.randn(shape, generator=gen)
        y = (torch.rand((n, spec.sample_shape[-1]), generator=gen) < 0.1).float()
    return x, y


class SyntheticSource:
    """The same random batch every step, generated once from ``seed``, on the device."""

    name = "synthetic"
    drop_s = 0.0

    def __init__(self, spec: ModelSpec, local_batch: int, device: torch.device,
                 seed: int) -> None:
        import torch

        gen = torch.Generator().manual_seed(seed)
        x, y = random_samples(spec, local_batch, gen)
        if x.dtype == torch.uint8:
            x = x.float().div_(255)
        self._x = x.to(device)
        self._y = y.to(device)
        self._n = local_batch

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """The batch (the same tensors every step)."""
        return self._x, self._y, _empty_info(self._n)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch (any step)."""
        return self._x, self._y

    def close(self) -> None:
        """Nothing to stop."""

    def kill_loader(self) -> None:
        """No loader to kill."""

    def translate(self, exc: Exception) -> Exception:
        """No loader: the error as it is."""
        return exc

    def summary(self) -> dict[str, Any]:
        """Nothing read."""
        return {"epochs": 0, "corrupt_files": [], "cache": "n/a"}


def memory_pool_size(local_batch: int) -> int:
    """Made-up samples a ``memory`` worker holds: two local batches."""
    return max(2, 2 * local_batch)
