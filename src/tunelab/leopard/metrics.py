"""Masked segmentation metrics, accumulated over batches and reducible across workers.

* **PR-AUC** exactly as ``tf.keras.metrics.AUC(curve="PR", num_thresholds=1001)`` computes
  it (the metric of the competition's Keras code): thresholds ``-1e-7, 0.001, …, 0.999,
  1 + 1e-7``; a prediction counts as positive when strictly above a threshold; the area is
  summed with Davis & Goadrich's interpolation between consecutive thresholds.
* **Dice** with smoothing 1 on probabilities: ``(2·Σ y·p + 1) / (Σ y + Σ p + 1)``.
* **Binary IoU** of the bound class at threshold 0.5 (prediction > 0.5):
  ``TP / (TP + FP + FN)``, 0 when the denominator is 0 (as Keras does).
* **loss**: mean binary cross-entropy.

Undefined values are NaN, never a number that looks like a score: everything when no base
is labelled (all -1), PR-AUC when no labelled base is bound (Keras would say 0, as for a
model that found nothing). Training refuses such data before it starts
(:meth:`~tunelab.leopard.windows.WindowSource.check_labels`).

Every sum runs over labelled bases only: a label of -1 is ignored. Dice and IoU are computed
over all bases seen (not averaged per batch as Keras' running mean of a batch metric is).
The state is one float64 vector, so workers sum it with a single ``all_reduce``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["MetricState", "NUM_THRESHOLDS", "pr_auc_from_counts", "thresholds"]

NUM_THRESHOLDS = 1001
_EPS = 1e-7
# state layout: [pos hist (T+1), neg hist (T+1), loss_sum, n, sum_y, sum_p, sum_yp, tp, fp, fn]
_H = NUM_THRESHOLDS + 1
_SCALARS = ("loss_sum", "n", "sum_y", "sum_p", "sum_yp", "tp", "fp", "fn")


def thresholds(num: int = NUM_THRESHOLDS) -> np.ndarray:
    """Keras' PR-AUC thresholds: ``-eps``, ``i / (num - 1)`` for ``i = 1 … num - 2``,
    ``1 + eps`` (float32)."""
    inner = [(i + 1) * 1.0 / (num - 1) for i in range(num - 2)]
    return np.asarray([0.0 - _EPS, *inner, 1.0 + _EPS], dtype=np.float32)


def pr_auc_from_counts(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> float:
    """Area under the precision-recall curve from confusion counts at each threshold
    (ascending thresholds), by Davis & Goadrich's interpolation (Keras' formula)."""
    tp, fp, fn = (np.asarray(a, dtype=np.float64) for a in (tp, fp, fn))
    p = tp + fp
    dtp = tp[:-1] - tp[1:]
    dp = p[:-1] - p[1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(dp > 0, dtp / np.maximum(dp, 0), 0.0)
        intercept = tp[1:] - slope * p[1:]
        ratio = np.where((p[:-1] > 0) & (p[1:] > 0), p[:-1] / np.maximum(p[1:], 1e-300), 1.0)
        denom = np.maximum(tp[1:] + fn[1:], 0)
        inc = np.where(denom > 0, slope * (dtp + intercept * np.log(ratio)) / np.where(
            denom > 0, denom, 1.0), 0.0)
    return float(np.sum(inc))


class MetricState:
    """Running sums for PR-AUC, Dice, IoU and loss (torch tensors on one device)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        import torch

        self.device = torch.device(device)
        self.state = torch.zeros(2 * _H + len(_SCALARS), dtype=torch.float64,
                                 device=self.device)
        self._thr = torch.as_tensor(thresholds(), device=self.device)

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Add a batch: ``logits`` and ``labels`` (-1 ignored, 0, 1) of any equal shape.

        Masks weight the sums instead of selecting elements, so nothing here waits for the
        device (a boolean selection would read its size back)."""
        import torch
        import torch.nn.functional as F

        logits = logits.detach().float().reshape(-1)
        y = labels.reshape(-1)
        keep = (y >= 0).double()
        pos = y > 0
        neg = y == 0
        target = pos.float()
        p = torch.sigmoid(logits)
        bucket = torch.bucketize(p, self._thr, right=False)  # thresholds strictly below p
        s = self.state
        # both histograms in one pass: bucket + _H x (0 bound, 1 unbound, 2 ignored). histc
        # counts in per-block shared memory on CUDA; index_add_ of float64 weights counted
        # in global memory, where a trained model's millions of near-0 probabilities all
        # hit one address. The codes are integers below 2**24: exact in float32.
        band = neg.long() + 2 * (y < 0).long()
        codes = (bucket + _H * band).float()
        s[:2 * _H] += torch.histc(codes, bins=3 * _H, min=0, max=3 * _H)[:2 * _H].double()
        hard = p > 0.5
        pd = p.double()
        loss = F.binary_cross_entropy_with_logits(logits, target, weight=keep.float(),
                                                  reduction="sum")
        s[2 * _H:] += torch.stack([
            loss.double(), keep.sum(), target.double().sum(), (pd * keep).sum(),
            (pd * target.double()).sum(), (hard & pos).double().sum(),
            (hard & neg).double().sum(), (~hard & pos).double().sum(),
        ])

    def merge(self, other: MetricState) -> None:
        """Add another state's sums."""
        self.state += other.state.to(self.device)

    def compute(self) -> dict[str, float]:
        """``loss``, ``pr_auc``, ``dice``, ``iou``, ``positive_fraction``, ``n_bases``."""
        s = self.state.cpu().numpy()
        pos_hist, neg_hist = s[:_H], s[_H:2 * _H]
        sc = dict(zip(_SCALARS, s[2 * _H:], strict=True))
        # tp[k] = positives with more than k thresholds below them, i.e. bucket >= k + 1
        tp = np.cumsum(pos_hist[::-1])[::-1][1:]
        fp = np.cumsum(neg_hist[::-1])[::-1][1:]
        fn = pos_hist.sum() - tp
        n = sc["n"]
        if n == 0:  # every base ignored: nothing is defined (not a loss of 0, a Dice of 1)
            nan = float("nan")
            return {"loss": nan, "pr_auc": nan, "dice": nan, "iou": nan,
                    "positive_fraction": nan, "n_bases": 0.0}
        denom = sc["tp"] + sc["fp"] + sc["fn"]
        return {
            "loss": float(sc["loss_sum"] / n),
            # without a bound base precision-recall is undefined (Keras would say 0)
            "pr_auc": pr_auc_from_counts(tp, fp, fn) if sc["sum_y"] > 0 else float("nan"),
            "dice": float((2 * sc["sum_yp"] + 1.0) / (sc["sum_y"] + sc["sum_p"] + 1.0)),
            "iou": float(sc["tp"] / denom) if denom > 0 else 0.0,
            "positive_fraction": float(sc["sum_y"] / n),
            "n_bases": float(sc["n"]),
        }
