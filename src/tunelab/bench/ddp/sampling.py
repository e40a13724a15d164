"""Samplers that never end, so that a DataLoader's prefetch runs across an epoch's end.

A DataLoader started again for each epoch (``iter(loader)``) begins with its queues empty:
the first batch of every epoch waits for a whole batch to be read, a stall the loaders'
prefetch hides everywhere else. With a few batches per epoch (8,192 samples at 2 × 400 a
step: 10 steps) that stall was most of the input wait of a warm-cache run. These samplers
deal the epochs' batches one after another to one iterator started once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["Cycle", "EpochChain"]


class Cycle:
    """A sampler drawing random permutations of range(n) for ever (memory sources)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.seed = seed

    def __iter__(self) -> Iterator[int]:
        import torch

        gen = torch.Generator().manual_seed(self.seed)
        while True:
            yield from torch.randperm(self.n, generator=gen).tolist()


class EpochChain:
    """Whole batches of a DistributedSampler's epochs 0, 1, 2, … one after another.

    Each epoch is the sampler's own (``set_epoch(e)``: the same shuffle and the same share
    of each worker as a DataLoader started again per epoch); a batch never spans two epochs
    (the last partial batch of an epoch is dropped, as ``drop_last=True`` does).
    """

    def __init__(self, sampler: Any, batch: int) -> None:
        self.sampler = sampler
        self.batch = batch
        #: batches in one epoch
        self.steps = len(sampler) // batch

    def __iter__(self) -> Iterator[list[int]]:
        epoch = 0
        while True:
            self.sampler.set_epoch(epoch)
            indices = list(self.sampler)
            for s in range(self.steps):
                yield indices[s * self.batch:(s + 1) * self.batch]
            epoch += 1
