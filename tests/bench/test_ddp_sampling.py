"""What a warm run's input wait was made of, gone: the loaders read on across an epoch's end
(the epochs' batches come from one iterator, the same batches a DataLoader started again per
epoch deals), and a batch crosses to the trainer without file descriptors to fetch where it
need not (undecoded samples as a shape, labels inline)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import pytest

from tunelab.bench.ddp.config import DDPConfig
from tunelab.bench.ddp.data import make_source
from tunelab.bench.ddp.handover import Blank, pack, unpack
from tunelab.bench.ddp.makedata import MakeDataConfig, make_dataset
from tunelab.bench.ddp.models import ModelSpec
from tunelab.bench.ddp.samples import Batch, Decoder
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


def _crosses_without_tensors(obj: object) -> bool:
    if isinstance(obj, torch.Tensor):
        return False
    if isinstance(obj, (tuple, list)):
        return all(_crosses_without_tensors(o) for o in obj)
    if isinstance(obj, dict):
        return all(_crosses_without_tensors(o) for o in obj.values())
    return True


@pytest.mark.parametrize("unit", ["images", "volumes"])
def test_undecoded_batches_cross_as_a_shape_and_come_back_equal(unit: str) -> None:
    decoder = Decoder(unit, 32, 64, decode=False)
    from tunelab.bench.ddp.samples import _stack

    xs, ys = zip(*(decoder(b"", label) for label in range(5)), strict=True)
    x, y = _stack(xs, ys, decoder)
    sent = pack(Batch(x, y, {"samples": 5}))
    assert isinstance(sent.x, Blank) and _crosses_without_tensors(sent)
    got = unpack(sent)
    assert got.x.shape == x.shape and got.x.dtype == x.dtype and not got.x.any()
    assert torch.equal(got.y, y) and got.y.dtype == y.dtype
    assert got.info == {"samples": 5}


def test_decoded_inputs_stay_tensors_and_labels_go_inline() -> None:
    x = torch.randint(0, 255, (4, 3, 96, 96), dtype=torch.uint8)  # 110 kB
    y = torch.tensor([3, 1, 4, 1])
    sent = pack(Batch(x, y, {}))
    assert sent.x is x  # shared memory, as before
    assert not isinstance(sent.y, torch.Tensor)
    got = unpack(sent)
    assert got.x is x and torch.equal(got.y, y)
    big = torch.zeros(4, 64, 64, 64, dtype=torch.uint8)  # targets of volumes: large
    assert pack(Batch(x, big, {})).y is big
    one = torch.zeros(1, 3, 32, 32, dtype=torch.uint8)  # a real zero sample: sent as is
    assert torch.equal(unpack(pack(Batch(one, y[:1], {}))).x, one)
