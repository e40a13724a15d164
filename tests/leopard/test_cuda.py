"""The CUDA paths on a GPU (``pytest -m cuda tests/leopard``; skipped without CUDA): the
device-resident and pinned samplers, the captured training step and evaluation, the
layout/step probe, training end to end, the captured prediction engine and the pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyBigWig
import pytest
import torch

from tunelab.leopard import distributed as D
from tunelab.leopard.data import load_chromosomes, load_manifest
from tunelab.leopard.devicedata import DeviceWindows, Placement
from tunelab.leopard.metrics import MetricState
from tunelab.leopard.model import LeopardUNet
from tunelab.leopard.train import TrainConfig, numpy_batches, train
from tunelab.leopard.trainstep import Forward, TrainStep, choose_step_mode, make_adam
from tunelab.leopard.windows import WindowSource

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

GPU = D.DistContext(rank=0, world=1, local_rank=0,
                    device=torch.device("cuda", 0) if torch.cuda.is_available() else
                    torch.device("cpu"), backend=None)


@pytest.mark.parametrize("where", ["device", "pinned"])
def test_gpu_batches_equal_the_numpy_path(synth: Path, where: str) -> None:
    m = load_manifest(synth)
    src = WindowSource(load_chromosomes(m, m.chromosomes("train"), need_avg=True), None, 512,
                       "train")
    rng = np.random.default_rng([0, 0])
    plan = src.plan(24, rng)
    scales = rng.uniform(0.9, 1.1, 24)
    dev = DeviceWindows(src, GPU.device, Placement(where, "test"), 6)
    want = list(numpy_batches(src, plan, scales, 4, 6, 0, 1, 6))
    for (x, y), (xa, ya) in zip(dev.batches(plan, scales, 4, 6), want, strict=True):
        assert x.is_cuda and torch.equal(x.cpu(), torch.from_numpy(xa))
        assert torch.equal(y.cpu(), torch.from_numpy(ya))


def _step_run(graph: bool, batches: list[tuple[torch.Tensor, torch.Tensor]]
              ) -> tuple[LeopardUNet, list[float]]:
    torch.manual_seed(0)
    model = LeopardUNet(base_filters=4, depth=2).cuda().train()
    opt = make_adam(model.parameters(), 1e-2, GPU.device, graph)
    step = TrainStep(model, model, opt, torch.amp.GradScaler("cuda", enabled=False), GPU,
                     False, torch.bfloat16, graph)
    losses = [float(a / b) for a, b in (step(x, y) for x, y in batches)]
    assert step.fallback is None
    return model, losses


def test_a_captured_step_trains_as_the_eager_step_on_the_gpu() -> None:
    torch.backends.cudnn.deterministic = True
    try:
        g = torch.Generator().manual_seed(1)
        batches = [(torch.rand(4, 5, 256, generator=g).cuda(),
                    torch.randint(-1, 2, (4, 256), generator=g).to(torch.int8).cuda())
                   for _ in range(4)]
        eager, a = _step_run(False, batches)
        graphed, b = _step_run(True, batches)
    finally:
        torch.backends.cudnn.deterministic = False
    # the first step starts from the same state (the warm-up was undone); later ones differ
    # by what Adam makes of rounding (capturable and plain fused kernels)
    assert a[0] == pytest.approx(b[0], rel=1e-6)
    assert np.allclose(a, b, rtol=1e-3), (a, b)
    for p, q in zip(eager.parameters(), graphed.parameters(), strict=True):
        assert p.shape == q.shape and torch.isfinite(q).all()


def test_captured_evaluation_on_the_gpu() -> None:
    torch.manual_seed(0)
    model = LeopardUNet(base_filters=4, depth=2).cuda().eval()
    fwd = Forward(model, True, torch.bfloat16, True)
    x = torch.rand(3, 5, 256, device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        want = model(x)
    got = fwd(x)
    assert fwd.graph and torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    state_gpu, state_cpu = MetricState("cuda"), MetricState("cpu")
    y = torch.randint(-1, 2, (3, 256), dtype=torch.int8)
    state_gpu.update(want, y.cuda())
    state_cpu.update(want.cpu(), y)
    a, b = state_gpu.compute(), state_cpu.compute()
    assert all(a[k] == pytest.approx(b[k], rel=1e-5) for k in a)


def test_the_probe_measures_layouts_and_graphs() -> None:
    torch.manual_seed(0)
    model = LeopardUNet(base_filters=4, depth=2).cuda()
    layout, graph, why, rates = choose_step_mode(
        model, ["1d", "2d", "2d8"], "auto", batch=4, window=256, in_channels=5, ctx=GPU,
        amp=True, amp_dtype=torch.bfloat16, scaler_enabled=False, plain_bn=True)
    assert set(rates) == {f"{lay} {form}" for lay in ("1d", "2d", "2d8")
                          for form in ("eager", "CUDA graph")}, why
    assert rates[f"{layout} {'CUDA graph' if graph else 'eager'}"] == max(rates.values())


def test_training_on_the_gpu_keeps_the_data_there(synth: Path, tmp_path: Path) -> None:
    foms = train(TrainConfig(data=synth, out=tmp_path / "o", window=512, batch_size=8,
                             epochs=2, steps_per_epoch=5, max_eval_windows=16, device="cuda",
                             progress=False, val_windows=40))
    doc = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert "train 0.00 GiB on the GPU" in doc["runtime"] and "Adam fused" in doc["runtime"]
    assert all(np.isfinite(v) for v in foms.values()) and foms["epochs"] == 2
    assert [h["steps"] for h in doc["history"]] == [5, 5]


def test_gpu_prediction_matches_the_cpu_one(synth: Path, tmp_path: Path) -> None:
    from tunelab.leopard.predict import predict_genome

    torch.manual_seed(0)
    model = LeopardUNet(base_filters=4, depth=3).eval()
    torch.save({"arch": model.arch.to_dict(), "window": 512, "model": model.state_dict()},
               tmp_path / "m.pt")
    common = {"precision": "fp32", "compile": "off", "batch_size": 4, "section_bp": 7_000}
    torch.backends.cudnn.benchmark = False  # (an earlier test may have set it)
    gpu = predict_genome(tmp_path / "m.pt", synth, tmp_path / "g.bw", ["chr3", "chr4"],
                         device="cuda", readers=2, writers=2, **common)
    predict_genome(tmp_path / "m.pt", synth, tmp_path / "c.bw", ["chr3", "chr4"],
                   device="cpu", **common)
    assert gpu["bp"] == 32_000 and gpu["graphed"] in (True, False)
    assert torch.backends.cudnn.benchmark  # cuDNN's kernels chosen by timing them
    a, b = pyBigWig.open(str(tmp_path / "g.bw")), pyBigWig.open(str(tmp_path / "c.bw"))
    for c in ("chr3", "chr4"):  # TF32 convolutions on the GPU: a few 1e-3 at most
        assert np.abs(a.values(c, 0, 16_000, numpy=True)
                      - b.values(c, 0, 16_000, numpy=True)).max() < 5e-3
    a.close()
    b.close()


@pytest.mark.parametrize("layout", ["2d", "2d8"])
def test_channels_last_training_on_the_gpu_matches_the_1d_modules(layout: str) -> None:
    """The 2-D form (its channels padded to 8 or not) with PyTorch's own batch statistics
    (CUDA's kernel) computes what the 1-D modules do: logits, gradients and running
    statistics, fp32, over three Adam steps."""
    from tests.leopard.test_model import train_both_forms

    torch.backends.cudnn.allow_tf32 = False
    try:
        train_both_forms("cuda", 3, out_atol=1e-3, buffer_atol=1e-4, layout=layout)
    finally:
        torch.backends.cudnn.allow_tf32 = True
