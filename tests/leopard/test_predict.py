"""Whole-chromosome prediction against a window-by-window reference; track files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyBigWig
import pytest
import torch

from tunelab.leopard.data import WindowBatch, build_inputs
from tunelab.leopard.errors import LeopardError
from tunelab.leopard.model import LeopardUNet
from tunelab.leopard.predict import predict_chromosome, predict_genome
from tunelab.leopard.train import TrainConfig, train


def _model(channels: int = 5) -> LeopardUNet:
    torch.manual_seed(0)
    m = LeopardUNet(in_channels=channels, base_filters=4, depth=3)
    with torch.no_grad():  # non-trivial running statistics
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm1d):
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.5, 2.0)
    return m.eval()


def _reference(model: LeopardUNet, seq: np.ndarray, dnase: np.ndarray, window: int,
               edge: int, avg: np.ndarray | None = None,
               stride: int | None = None) -> np.ndarray:
    """One window at a time, one base at a time, with the unfolded model."""
    n = len(seq)
    stride = stride or window - 2 * edge
    starts = sorted(set(range(0, n - window + 1, stride)) | {n - window})
    total, count = np.zeros(n), np.zeros(n)
    for s in starts:
        b = WindowBatch(seq=seq[None, s:s + window], dnase=dnase[None, s:s + window],
                        label=np.zeros((1, window), np.int8),
                        dnase_avg=None if avg is None else avg[None, s:s + window])
        x = build_inputs(b, 5 if avg is None else 6)
        with torch.no_grad():
            p = torch.sigmoid(model(torch.from_numpy(x))).numpy()[0]
        for j in range(window):
            keep = edge <= j < window - edge or (s == 0 and j < edge) or (
                s == n - window and j >= window - edge)
            if keep:
                total[s + j] += p[j]
                count[s + j] += 1
    assert (count > 0).all()
    return total / count


@pytest.mark.parametrize(("n", "edge", "stride"),
                         [(1000, 32, None), (1024, 64, 128), (640, 0, None), (3000, 48, 100)])
def test_tiled_prediction_matches_window_by_window(n: int, edge: int,
                                                   stride: int | None) -> None:
    """Streamed in groups of 3 windows (so stretches are emitted while later groups still
    overlap them), with the folded network: equal to the plain window-by-window average."""
    rng = np.random.default_rng(n)
    seq = rng.integers(0, 5, n).astype(np.uint8)
    dnase = rng.gamma(1.0, 1.0, n).astype(np.float32)
    model = _model()
    got = predict_chromosome(model, seq, dnase, None, 256, batch_size=3, edge=edge,
                             stride=stride)
    assert got.shape == (n,)
    assert np.allclose(got, _reference(model, seq, dnase, 256, edge, stride=stride),
                       atol=1e-5)


def test_six_channel_prediction_uses_the_average_track() -> None:
    rng = np.random.default_rng(6)
    seq = rng.integers(0, 5, 700).astype(np.uint8)
    dnase = rng.gamma(1.0, 1.0, 700).astype(np.float32)
    avg = rng.gamma(1.0, 1.0, 700).astype(np.float32)
    model = _model(6)
    got = predict_chromosome(model, seq, dnase, avg, 256, batch_size=4, edge=16)
    assert np.allclose(got, _reference(model, seq, dnase, 256, 16, avg), atol=1e-5)
    with pytest.raises(LeopardError, match="dnase_avg"):
        predict_chromosome(model, seq, dnase, None, 256)


def test_short_chromosome_and_bad_edge() -> None:
    model = _model()
    out = predict_chromosome(model, np.zeros(100, np.uint8), np.zeros(100, np.float32),
                             None, 256)
    assert out.shape == (100,) and ((out > 0) & (out < 1)).all()
    with pytest.raises(LeopardError, match="edge 100"):
        predict_chromosome(model, np.zeros(512, np.uint8), np.zeros(512, np.float32), None,
                           256, edge=100)


def test_predict_cli_writes_bigwig_and_bedgraph(windows: Path, synth: Path,
                                                tmp_path: Path) -> None:
    train(TrainConfig(data=windows, out=tmp_path / "t", batch_size=4, epochs=1,
                      steps_per_epoch=1, threads=1, progress=False))
    ck = tmp_path / "t" / "best.pt"
    r = subprocess.run([sys.executable, "-m", "tunelab.leopard", "predict",
                        "--checkpoint", str(ck), "--data", str(synth),
                        "--out", str(tmp_path / "p.bw"), "--device", "cpu"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["bp"] == 16_000 and res["bp_per_s"] > 0 and res["window"] == 512
    res = predict_genome(ck, synth, tmp_path / "p.bedGraph", ["chr4"], device="cpu")
    assert res["bp"] == 16_000
    bw = pyBigWig.open(str(tmp_path / "p.bw"))
    assert bw.chroms() == {"chr4": 16_000}
    vals = bw.values("chr4", 0, 16_000, numpy=True)
    assert np.isfinite(vals).all() and ((vals >= 0) & (vals <= 1)).all()
    rows = [ln.split("\t") for ln in (tmp_path / "p.bedGraph").read_text().splitlines()]
    assert rows[0][:2] == ["chr4", "0"] and rows[-1][2] == "16000"
    assert all(a[2] == b[1] for a, b in zip(rows, rows[1:], strict=False))
    # both tracks carry the same values (bedGraph rounded to 4 digits)
    bg = np.concatenate([np.full(int(e) - int(s), float(v)) for _, s, e, v in rows])
    assert np.allclose(bg, vals, atol=1e-4)
