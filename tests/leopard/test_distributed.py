"""Data-parallel training: helpers, and a real 2-process torchrun (gloo) run compared with
one process of the same global batch and learning rate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tunelab.leopard import distributed as D
from tunelab.leopard.errors import LeopardError


def _ctx(rank: int, world: int) -> D.DistContext:
    return D.DistContext(rank=rank, world=world, local_rank=rank,
                         device=torch.device("cpu"), backend="gloo")


def test_shards_are_disjoint_and_complete() -> None:
    ids = np.arange(11)
    parts = [D.shard(ids, _ctx(r, 3)) for r in range(3)]
    assert sorted(np.concatenate(parts).tolist()) == ids.tolist()
    assert all(len(set(a) & set(b)) == 0 for i, a in enumerate(parts) for b in parts[i + 1:])


def test_learning_rate_rules_and_warmup() -> None:
    assert D.scaled_lr(0.01, 4, "none") == 0.01
    assert D.scaled_lr(0.01, 4, "linear") == pytest.approx(0.04)
    assert D.scaled_lr(0.01, 4, "sqrt") == pytest.approx(0.02)
    with pytest.raises(LeopardError, match="none, linear, sqrt"):
        D.scaled_lr(0.01, 4, "cubic")
    # two warm-up epochs of 10 steps: 0.01 -> 0.04 linearly, then flat
    assert D.lr_at(0, 10, 2, 0.01, 0.04) == pytest.approx(0.01)
    assert D.lr_at(10, 10, 2, 0.01, 0.04) == pytest.approx(0.025)
    assert D.lr_at(20, 10, 2, 0.01, 0.04) == pytest.approx(0.04)
    assert D.lr_at(0, 10, 0, 0.01, 0.04) == pytest.approx(0.04)


def _run(argv: list[str], out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.slow
def test_two_process_ddp_matches_one_process(windows: Path, tmp_path: Path) -> None:
    """Tolerance: per-epoch losses and final metrics agree to 1e-3 relative, and the median
    weight differs by under a fifth of how far training moved it. The first epoch agrees to
    ~1e-6; afterwards float32 sums taken in another order, magnified by Adam for weights
    whose gradient is ~0 (its first steps are +-lr whatever the gradient's size), leave
    ~2e-4 in losses and ~5e-4 in weights (training moves them ~5e-3) — the same gaps as
    between two single-process runs with 1 and 2 threads."""
    common = ["-m", "tunelab.leopard", "train", "--data", str(windows), "--epochs", "2",
              "--steps-per-epoch", "3", "--lr", "0.002", "--sync-bn", "--threads", "1",
              "--no-progress", "--device", "cpu"]  # gloo: two workers on one GPU fail
    one = _run([sys.executable, *common, "--out", str(tmp_path / "one"),
                "--batch-size", "8"], tmp_path / "one")
    two = _run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2", *common, "--out", str(tmp_path / "two"),
                "--batch-size", "4"], tmp_path / "two")
    assert two["foms"]["world_size"] == 2 and two["foms"]["global_batch"] == 8
    assert len(two["windows_per_s_by_worker"]) == 2
    assert all(r > 0 for r in two["windows_per_s_by_worker"])
    for h1, h2 in zip(one["history"], two["history"], strict=True):
        assert h2["train_loss"] == pytest.approx(h1["train_loss"], rel=1e-3)
        assert h2["val_loss"] == pytest.approx(h1["val_loss"], rel=1e-3)
    assert two["history"][0]["train_loss"] == pytest.approx(one["history"][0]["train_loss"],
                                                            rel=1e-5)
    for key in ("val_loss", "test_loss", "test_dice"):
        assert two["foms"][key] == pytest.approx(one["foms"][key], rel=1e-3), key
    a = torch.load(tmp_path / "one" / "last.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "two" / "last.pt", weights_only=False)["model"]
    diff = torch.cat([(a[k] - b[k]).abs().flatten() for k in a if k.endswith(
        ("weight", "bias"))])
    moved = torch.cat([(a[k] - init).abs().flatten() for k, init in
                       _initial_weights().items()])
    assert diff.median() < 0.2 * moved.median()


def _initial_weights() -> dict[str, torch.Tensor]:
    from tunelab.leopard.model import LeopardUNet

    torch.manual_seed(0)
    return {k: v for k, v in LeopardUNet().state_dict().items()
            if k.endswith(("weight", "bias"))}
