"""The loaders read on across an epoch's end: the epochs' batches come from one iterator
(the same batches a DataLoader started again per epoch deals), so the first batch of an
epoch is read ahead like every other (the stall at each epoch's start was most of a warm
run's input wait)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import pytest

from tunelab.bench.ddp.config import DDPConfig
from tunelab.bench.ddp.data import make_source
from tunelab.bench.ddp.makedata import MakeDataConfig, make_dataset
from tunelab.bench.ddp.models import ModelSpec
from tunelab.bench.ddp.sampling import EpochChain

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")


def _per_epoch_batches(n: int, world: int, rank: int, batch: int, epochs: int,
                       ) -> list[list[int]]:
    from torch.utils.data import BatchSampler, DistributedSampler

    sampler: Any = DistributedSampler(cast(Any, range(n)), num_replicas=world, rank=rank,
                                      shuffle=True, seed=3, drop_last=True)
    out: list[list[int]] = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        out.extend(BatchSampler(sampler, batch, drop_last=True))
    return out


@pytest.mark.parametrize("n,world,batch", [(50, 2, 7), (48, 2, 8), (31, 1, 5)])
def test_the_chain_deals_each_epochs_batches_as_a_restarted_loader_would(n: int, world: int,
                                                                         batch: int) -> None:
    from torch.utils.data import DistributedSampler

    epochs = 4
    for rank in range(world):
        sampler: Any = DistributedSampler(cast(Any, range(n)), num_replicas=world, rank=rank,
                                          shuffle=True, seed=3, drop_last=True)
        chain = EpochChain(sampler, batch)
        it = iter(chain)
        got = [next(it) for _ in range(chain.steps * epochs)]
        assert got == _per_epoch_batches(n, world, rank, batch, epochs)
        assert chain.steps == (n // world) // batch
        # every batch whole; within an epoch no sample twice; epochs shuffled differently
        assert all(len(b) == batch for b in got)
        firsts = [sum(got[e * chain.steps:(e + 1) * chain.steps], []) for e in range(epochs)]
        assert all(len(set(f)) == len(f) for f in firsts)
        assert firsts[0] != firsts[1]


def test_a_warm_files_source_reads_the_next_epoch_before_it_is_asked_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tunelab.bench.ddp import samples

    reads = tmp_path / "reads.log"  # each file the loader reads, a line (it forks after this)
    real_read = samples.read_file

    def logged_read(path: str) -> bytes:
        with open(reads, "a") as f:
            f.write(path + "\n")
        return real_read(path)

    monkeypatch.setattr(samples, "read_file", logged_read)
    root = tmp_path / "img"
    make_dataset(MakeDataConfig(str(root), "imagenet", 24, classes=3, scale=0.05, jobs=1))
    status = tmp_path / "status"
    status.mkdir()
    cfg = DDPConfig(model="resnet18", image_size=32, batch_size=6, data=f"files:{root}",
                    loader_workers=1, prefetch=2, cache="warm", decode="off").validate()
    spec = ModelSpec("resnet18", (3, 32, 32), "classify", classes=3)
    source = make_source(cfg, spec, torch.device("cpu"), 0, 1, str(status))
    try:
        steps = 24 // 6
        for _ in range(steps):  # the whole of epoch 0
            x, y, info = source.next_batch()
            assert x.shape == (6, 3, 32, 32) and info["samples"] == 6
        # the loader reads epoch 1's first batch ahead, before it is asked for (a loader
        # started again per epoch stops at epoch 0's last file and waits)
        deadline = time.monotonic() + 60
        while len(reads.read_text().split()) < 24 + 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(reads.read_text().split()) >= 24 + 6
        x, y, info = source.next_batch()  # epoch 1 goes on as before
        assert info["samples"] == 6
        assert source.summary()["epochs"] == 2
    finally:
        source.close()
