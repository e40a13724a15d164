"""The device-side sampler against the numpy path, on CPU tensors: the same windows, the same
inputs and labels, batch by batch, for a given seed; placement; padded evaluation batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tunelab.leopard.data import build_inputs, load_chromosomes, load_manifest
from tunelab.leopard.devicedata import DeviceWindows, Placement, bytes_needed, choose_placement
from tunelab.leopard.train import numpy_batches
from tunelab.leopard.trainsetup import WindowSource
from tunelab.leopard.windows import load_windows

HOST = Placement("host", "test")
#: "pinned" on a CPU: the loader-thread gather and the in-turn copy, without page locking
PINNED = Placement("pinned", "test")


def _genome(synth: Path, channels: int) -> WindowSource:
    m = load_manifest(synth)
    cs = load_chromosomes(m, m.chromosomes("train"), need_avg=channels == 6)
    return WindowSource(cs, None, 512, "train")


def _plan(src: WindowSource, seed: int, n: int, augment: float) -> tuple[np.ndarray,
                                                                          np.ndarray | None]:
    """What the training loop draws for an epoch (train.py: same generator, same order)."""
    rng = np.random.default_rng([seed, 0])
    plan = src.plan(n, rng)
    return plan, rng.uniform(1 - augment, 1 + augment, len(plan)) if augment > 0 else None


@pytest.mark.parametrize("placement", [HOST, PINNED], ids=["host", "pinned"])
@pytest.mark.parametrize(("channels", "augment", "world"), [(5, 0.1, 1), (6, 0.1, 1),
                                                            (5, 0.0, 2)])
def test_device_batches_equal_the_numpy_path(synth: Path, placement: Placement, channels: int,
                                             augment: float, world: int) -> None:
    src = _genome(synth, channels)
    steps, gb = 5, 6
    plan, scales = _plan(src, 3, steps * gb, augment)
    dev = DeviceWindows(src, torch.device("cpu"), placement, channels)
    for rank in range(world):
        want = list(numpy_batches(src, plan, scales, steps, gb, rank, world, channels))
        got = list(dev.batches(plan, scales, steps, gb, rank, world))
        assert len(got) == len(want) == steps
        for (x, y), (xa, ya) in zip(got, want, strict=True):
            assert x.dtype == torch.float32 and y.dtype == torch.int8
            assert x.shape == (gb // world, channels, 512)
            assert torch.equal(x, torch.from_numpy(xa))  # bit for bit, scaling included
            assert torch.equal(y, torch.from_numpy(ya))
    other, _ = _plan(src, 4, steps * gb, augment)
    assert not np.array_equal(other, plan)  # another seed draws other windows


def test_fixed_windows_from_npz_arrays(windows: Path) -> None:
    arr = load_windows(windows / "train.npz")
    src = WindowSource(None, arr, arr.window, "train.npz")
    plan, scales = _plan(src, 0, 3 * 4, 0.2)
    want = list(numpy_batches(src, plan, scales, 3, 4, 0, 1, 5))
    got = list(DeviceWindows(src, torch.device("cpu"), HOST, 5).batches(plan, scales, 3, 4))
    for (x, y), (xa, ya) in zip(got, want, strict=True):
        assert torch.equal(x, torch.from_numpy(xa)) and torch.equal(y, torch.from_numpy(ya))


@pytest.mark.parametrize("placement", [HOST, PINNED], ids=["host", "pinned"])
def test_evaluation_batches_are_padded_to_one_shape(synth: Path, placement: Placement) -> None:
    m = load_manifest(synth)
    src = WindowSource(load_chromosomes(m, ["chr3"]), None, 512, "val")
    ids = src.eval_ids(None, 0)
    assert len(ids) == 31
    got = list(DeviceWindows(src, torch.device("cpu"), placement, 5).eval_batches(ids, 8))
    assert [x.shape[0] for x, _ in got] == [8, 8, 8, 8]  # 31 windows: the last batch padded
    xs = torch.cat([x for x, _ in got])
    ys = torch.cat([y for _, y in got])
    b = src.get(ids)
    assert torch.equal(xs[:31], torch.from_numpy(build_inputs(b, 5)))
    assert torch.equal(ys[:31], torch.from_numpy(b.label))
    assert (ys[31:] == -1).all()  # padding is ignored by every metric


def test_drawn_validation_windows_are_seeded_and_stay_inside(synth: Path) -> None:
    src = _genome(synth, 5)
    a, b = src.eval_ids(None, 0, drawn=50), src.eval_ids(None, 0, drawn=50)
    assert np.array_equal(a, b) and len(a) == 50 and np.all(np.diff(a) >= 0)
    which, local = src.cs.locate(a)  # type: ignore[union-attr]
    assert np.all(local + 512 <= src.cs.lengths[which])  # type: ignore[union-attr]


def test_placement_follows_the_free_memory(synth: Path) -> None:
    src = _genome(synth, 6)
    need = bytes_needed(src, 6)
    assert need == src.bases() * 10 and bytes_needed(src, 5) == src.bases() * 6
    assert choose_placement("cpu", need, None).where == "host"
    assert choose_placement("cuda", need, need * 2).where == "device"
    pinned = choose_placement("cuda", need, need // 2)
    assert pinned.where == "pinned" and "pinned host memory" in pinned.why
