"""How a batch crosses from a data-loader process to the training process.

A tensor sent through the DataLoader's queue travels in shared memory: the trainer fetches
each storage's file descriptor from the loader over a socket (``file_descriptor`` sharing),
about half a millisecond a storage on a busy 2-core machine, most of a warm run's input
wait. What need not travel that way does not: a batch of undecoded samples (``--decode
off``: one zero sample viewed n times, MLPerf Storage's method) goes as its shape and
dtype, and small targets (labels) go pickled inline. Decoded inputs stay in shared memory.

On a GPU, :func:`to_device` copies a batch from pinned memory; a blank batch is copied as a
real one would be, from a pinned zero batch of its shape made once (copying the expanded view
made PyTorch first write it out in pageable memory, ~25 ms for 256 images on one H200).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch

    from tunelab.bench.ddp.samples import Batch

__all__ = ["Blank", "pack", "to_device", "unpack"]

#: targets up to this size go inline (ImageNet labels of a 400-sample batch: 3.2 kB)
INLINE_BYTES = 1 << 16


class Blank(NamedTuple):
    """A batch of one zero sample repeated: ``shape`` (n first) and ``dtype``."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def _pack_tensor(t: Any) -> Any:
    import torch

    if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.dim() == 0:
        return t
    if t.stride(0) == 0 and t.shape[0] > 1 and not t[0].any():
        return Blank(tuple(t.shape), t.dtype)
    if t.numel() * t.element_size() <= INLINE_BYTES:
        return t.contiguous().numpy()
    return t


#: the zero sample of each (shape, dtype), made once in the trainer (a fresh one costs
#: page faults each batch)
_ZEROS: dict[tuple[tuple[int, ...], Any], torch.Tensor] = {}


def _unpack_tensor(t: Any) -> Any:
    import numpy as np
    import torch

    if isinstance(t, Blank):  # shape as a tuple, whatever sequence it arrived as
        key = (tuple(t.shape[1:]), t.dtype)
        if key not in _ZEROS:
            _ZEROS[key] = torch.zeros(key[0], dtype=t.dtype)
        return _ZEROS[key].expand(tuple(t.shape))
    if isinstance(t, np.ndarray):
        return torch.from_numpy(t)
    return t


def pack(batch: Batch) -> Batch:
    """The DataLoader's collate function (batches are built by the datasets): the batch as
    it crosses to the trainer (see the module's text)."""
    return batch._replace(x=_pack_tensor(batch.x), y=_pack_tensor(batch.y))


def unpack(batch: Batch) -> Batch:
    """The batch :func:`pack` sent, as tensors again (a blank is a zero sample expanded)."""
    return batch._replace(x=_unpack_tensor(batch.x), y=_unpack_tensor(batch.y))


#: pinned zero batches of each (shape, dtype), made once in the trainer
_PINNED_ZEROS: dict[tuple[tuple[int, ...], Any], torch.Tensor] = {}


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on the CUDA ``device``, copied asynchronously (the loaders' batches arrive in
    pinned memory); a blank (a zero sample expanded: stride 0 along the batch) is copied from
    a pinned zero batch of its shape."""
    import torch

    if t.dim() > 0 and t.shape[0] > 1 and t.stride(0) == 0 and not t[0].any():
        key = (tuple(t.shape), t.dtype)
        if key not in _PINNED_ZEROS:
            _PINNED_ZEROS[key] = torch.zeros(key[0], dtype=t.dtype, pin_memory=True)
        t = _PINNED_ZEROS[key]
    return t.to(device, non_blocking=True)
