"""Metrics against hand-computed values and a brute-force reference written here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tunelab.leopard.metrics import MetricState, thresholds


def _logit(p: list[float]) -> torch.Tensor:
    t = torch.tensor(p, dtype=torch.float64)
    return torch.log(t / (1 - t)).float()


def _metrics(probs: list[float], labels: list[int]) -> dict[str, float]:
    s = MetricState()
    s.update(_logit(probs), torch.tensor(labels))
    return s.compute()


def reference_pr_auc(p: np.ndarray, y: np.ndarray) -> float:
    """Keras' AUC(curve='PR', num_thresholds=1001) written out with plain loops."""
    thr = thresholds()
    p = p.astype(np.float32)
    tp = [float(np.sum((p > t) & (y == 1))) for t in thr]
    fp = [float(np.sum((p > t) & (y == 0))) for t in thr]
    fn = [float(np.sum(~(p > t) & (y == 1))) for t in thr]
    area = 0.0
    for i in range(len(thr) - 1):
        dtp = tp[i] - tp[i + 1]
        pa, pb = tp[i] + fp[i], tp[i + 1] + fp[i + 1]
        dp = pa - pb
        slope = dtp / dp if dp > 0 else 0.0
        intercept = tp[i + 1] - slope * pb
        ratio = pa / pb if pa > 0 and pb > 0 else 1.0
        denom = tp[i + 1] + fn[i + 1]
        if denom > 0:
            area += slope * (dtp + intercept * math.log(ratio)) / denom
    return area


def test_pr_auc_hand_computed() -> None:
    # positives at 0.9 and 0.3, negatives at 0.6 and 0.1: the two steps of the curve give
    # (1 - ln 1.5) / 2 (from 3 predicted positives to 2) + 1 / 2 (from 1 to 0)
    m = _metrics([0.9, 0.6, 0.3, 0.1], [1, 0, 1, 0])
    assert m["pr_auc"] == pytest.approx(0.5 + (1 - math.log(1.5)) / 2, abs=1e-9)


def test_pr_auc_perfect_and_constant() -> None:
    assert _metrics([0.95, 0.9, 0.2, 0.05], [1, 1, 0, 0])["pr_auc"] == pytest.approx(1.0)
    # all predictions in one threshold bucket: the area is the positive fraction
    assert _metrics([0.5] * 8, [1, 0, 0, 0, 1, 0, 0, 0])["pr_auc"] == pytest.approx(0.25)


def test_pr_auc_matches_reference_on_random_data() -> None:
    rng = np.random.default_rng(3)
    y = (rng.random(3000) < 0.1).astype(np.int64)
    p = np.clip(rng.normal(0.3 + 0.3 * y, 0.2), 1e-4, 1 - 1e-4)
    s = MetricState()
    # two batches: accumulation must equal one pass
    s.update(_logit(p[:1000].tolist()), torch.from_numpy(y[:1000]))
    s.update(_logit(p[1000:].tolist()), torch.from_numpy(y[1000:]))
    assert s.compute()["pr_auc"] == pytest.approx(reference_pr_auc(p, y), abs=1e-9)


def test_dice_iou_loss_hand_computed() -> None:
    m = _metrics([0.9, 0.2, 0.4], [1, 0, 1])
    assert m["dice"] == pytest.approx((2 * 1.3 + 1) / (2 + 1.5 + 1))
    assert m["iou"] == pytest.approx(0.5)  # hard [1, 0, 0]: tp 1, fp 0, fn 1
    bce = -(math.log(0.9) + math.log(0.8) + math.log(0.4)) / 3
    assert m["loss"] == pytest.approx(bce, rel=1e-6)
    assert m["positive_fraction"] == pytest.approx(2 / 3)


def test_masked_labels_are_ignored() -> None:
    plain = _metrics([0.9, 0.2, 0.4], [1, 0, 1])
    masked = _metrics([0.9, 0.99, 0.2, 0.01, 0.4], [1, -1, 0, -1, 1])
    for key in ("pr_auc", "dice", "iou", "loss", "n_bases"):
        assert masked[key] == pytest.approx(plain[key]), key


def test_iou_is_zero_when_nothing_is_positive() -> None:
    assert _metrics([0.1, 0.2], [0, 0])["iou"] == 0.0
    assert _metrics([0.1, 0.2], [0, 0])["dice"] == pytest.approx(1 / (0.3 + 1))


def test_histograms_count_exactly_with_ignored_labels_and_a_crowded_bucket() -> None:
    """The per-threshold counts are exact where a trained model puts millions of bases in one
    bucket (near 0), with -1 labels left out and int8 labels (the training data's)."""
    from tunelab.leopard.metrics import _H

    rng = np.random.default_rng(5)
    n = 2_100_000
    p = np.where(rng.random(n) < 0.95, 1e-5, rng.random(n)).astype(np.float32)
    y = rng.choice(np.array([-1, 0, 1], dtype=np.int8), n, p=[0.1, 0.8, 0.1])
    s = MetricState()
    s.update(torch.logit(torch.from_numpy(p).double()).float(), torch.from_numpy(y))
    bucket = np.searchsorted(thresholds(), torch.sigmoid(
        torch.logit(torch.from_numpy(p).double()).float()).numpy(), side="left")
    state = s.state.numpy()
    assert np.array_equal(state[:_H], np.bincount(bucket[y == 1], minlength=_H))
    assert np.array_equal(state[_H:2 * _H], np.bincount(bucket[y == 0], minlength=_H))
    assert state[:2 * _H].sum() == np.sum(y >= 0)


def test_undefined_metrics_are_nan_not_a_score() -> None:
    every_ignored = _metrics([0.1, 0.6, 0.9], [-1, -1, -1])
    assert every_ignored["n_bases"] == 0
    for k in ("loss", "pr_auc", "dice", "iou", "positive_fraction"):
        assert math.isnan(every_ignored[k]), (k, every_ignored[k])  # (was loss 0, Dice 1)
    no_bound = _metrics([0.1, 0.6, 0.9], [0, 0, -1])
    assert math.isnan(no_bound["pr_auc"])  # (was 0: a model that found nothing)
    assert no_bound["loss"] > 0 and no_bound["iou"] == 0.0
    assert _metrics([0.1, 0.6, 0.9], [1, 1, 1])["pr_auc"] == pytest.approx(1.0)
