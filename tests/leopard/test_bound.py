"""The bound printed beside every windows/s figure on a CPU: measured in the same run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tunelab.leopard.bound import Bound, measure_bound


def test_fraction_is_work_rate_over_gemm_rate() -> None:
    b = Bound("fp32", 100e9, 3e9, 2)
    assert b.fraction(10.0) == pytest.approx(0.3)
    assert b.beside(10.0) == "0.30 of bound"
    assert "fp32 GEMM bound 100.0 GFLOP/s" in b.describe()


def test_measured_with_the_threads_asked_and_they_are_restored() -> None:
    before = torch.get_num_threads()
    b = measure_bound("fp32", 1e9, threads=1, n=256, repeats=2)
    assert b.threads == 1 and b.flops_per_s > 0 and b.precision == "fp32"
    assert torch.get_num_threads() == before
    assert measure_bound("bf16", 1e9, n=128, repeats=1).precision == "bf16"


def test_training_prints_the_fraction_beside_every_windows_per_s(windows: Path,
                                                                 tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "tunelab.leopard", "train", "--data",
                        str(windows), "--out", str(tmp_path / "o"), "--batch-size", "4",
                        "--epochs", "2", "--steps-per-epoch", "1", "--device", "cpu",
                        "--threads", "1", "--no-progress"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rates = [ln for ln in r.stderr.splitlines() if "windows/s" in ln
             and not ln.startswith(("runtime:", "training layout", "bound:"))]
    assert len(rates) == 3 and all("of bound" in ln for ln in rates), rates
    assert any(ln.startswith("bound: fp32 GEMM bound") for ln in r.stderr.splitlines())
    foms = json.loads(r.stdout.strip().splitlines()[-1])
    assert foms["bound_fraction"] == pytest.approx(
        foms["windows_per_s"] * foms["flops_per_window"] / foms["gemm_flops_per_s"])
    hist = json.loads((tmp_path / "o" / "metrics.json").read_text())["history"]
    assert all(row["bound_fraction"] > 0 for row in hist)


def test_prediction_reports_windows_per_s_and_its_fraction(synth: Path,
                                                           tmp_path: Path) -> None:
    from tunelab.leopard.model import LeopardUNet
    from tunelab.leopard.predict import predict_genome

    ck = tmp_path / "m.pt"
    model = LeopardUNet()
    torch.save({"arch": model.arch.to_dict(), "window": 512, "model": model.state_dict()}, ck)
    res = predict_genome(ck, synth, tmp_path / "t.bedGraph", device="cpu", threads=1,
                         precision="fp32", compile="off")
    assert res["windows_per_s"] == pytest.approx(res["windows"] / res["seconds"])
    assert res["bound_fraction"] == pytest.approx(
        res["windows_per_s"] * res["flops_per_window"] / res["gemm_flops_per_s"])


def test_remeasured_keeps_the_higher_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    from tunelab.leopard import bound as B

    low = Bound("fp32", 1e9, 1e9, 1)
    monkeypatch.setattr(B, "measure_bound", lambda *a, **k: Bound("fp32", 5e9, 1e9, 1))
    assert low.remeasured().flops_per_s == 5e9
    assert Bound("fp32", 9e9, 1e9, 1).remeasured().flops_per_s == 9e9
    # two workers: the rate measured now is summed before it is compared (5 + 5 > 9)
    summed = Bound("fp32", 9e9, 1e9, 1, workers=2).remeasured(
        together=lambda now: Bound("fp32", 2 * now.flops_per_s, 1e9, 1, workers=2))
    assert summed.flops_per_s == 10e9 and summed.workers == 2


def test_data_parallel_workers_sum_their_rates(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows/s of N workers are all of theirs: the bound is the sum of their GEMM rates
    (was one worker's: 2 workers on 2 cores printed 0.78 of bound at 1 thread's rate)."""
    from tunelab.leopard import distributed as D
    from tunelab.leopard import train as T

    def twice(t: torch.Tensor, ctx: D.DistContext) -> torch.Tensor:
        return t.mul_(2)  # two workers that measured the same rate

    monkeypatch.setattr(D, "all_reduce_sum", twice)
    ctx = D.DistContext(rank=0, world=2, local_rank=0, device=torch.device("cpu"),
                        backend="gloo")
    b = T._all_workers(Bound("fp32", 100e9, 0.6e9, 1), ctx)
    assert (b.flops_per_s, b.workers) == (200e9, 2)
    assert b.fraction(100.0) == pytest.approx(0.3)
    assert "2 workers x 1 thread" in b.describe()
