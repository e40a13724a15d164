#!/usr/bin/env python3
"""Does Leopard learn the same in its channels-last 2-D training form as in the 1-D one?

The two forms are the same computation (``tests/leopard/test_model.py`` checks outputs,
gradients and BatchNorm statistics of a step), but fp32 Adam training is chaotic: rounding
differences grow to different networks within a few dozen steps, so one seed proves nothing.
This trains the short synthetic-genome run of ``tests/leopard/test_train.py`` (window 1,024,
batch 8, 3 epochs x 12 steps) from each seed in three arms: the 1-D form with 2 threads, the
1-D form with 1 thread (the same mathematics, rounded differently: the control) and the 2-D
form with 2 threads, and prints each figure's mean per arm and the paired differences with
their t statistic. A difference the control shows as well is rounding, not the form.

    .venv/bin/python benchmarks/leopard_layout_seeds.py --seeds 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ARMS = (("1d", "1d", 2), ("1d-1thread", "1d", 1), ("2d", "2d", 2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args()
    from tunelab.leopard.synthetic import SyntheticConfig, write_synthetic
    from tunelab.leopard.train import TrainConfig, train

    runs: dict[str, list[dict[str, Any]]] = {a: [] for a, _, _ in ARMS}
    with tempfile.TemporaryDirectory(prefix="leopard-seeds-") as tmp:
        root = Path(tmp)
        data = write_synthetic(root / "g", SyntheticConfig(
            n_chroms=4, chrom_length=40_000, site_spacing=1_000, seed=2))
        for seed in range(args.seeds):
            for arm, layout, threads in ARMS:
                foms = train(TrainConfig(
                    data=data, out=root / f"{arm}-{seed}", window=1024, batch_size=8,
                    lr=1e-3, bn_momentum=0.1, epochs=3, steps_per_epoch=12,
                    max_eval_windows=32, progress=False, seed=seed, layout=layout,
                    threads=threads))
                doc = json.loads((root / f"{arm}-{seed}" / "metrics.json").read_text())
                runs[arm].append({"foms": foms, "history": doc["history"]})
            print(f"seed {seed}: test PR-AUC "
                  + ", ".join(f"{a} {runs[a][-1]['foms']['test_pr_auc']:.3f}"
                              for a, _, _ in ARMS), flush=True)
    figures: dict[str, Callable[[dict[str, Any]], float]] = {
        "test PR-AUC (weights of the best val_loss epoch)":
            lambda r: r["foms"]["test_pr_auc"],
        "final training loss": lambda r: r["history"][-1]["train_loss"],
        "val PR-AUC, mean over epochs":
            lambda r: statistics.mean(h["val_pr_auc"] for h in r["history"]),
        "val PR-AUC, last epoch": lambda r: r["history"][-1]["val_pr_auc"],
    }
    print(f"\n{args.seeds} seeds; mean per arm; paired difference (t statistic)")
    for name, get in figures.items():
        means = {a: statistics.mean(get(r) for r in runs[a]) for a, _, _ in ARMS}
        print(f"  {name}: " + ", ".join(f"{a} {m:.4f}" for a, m in means.items()))
        for a, b in (("2d", "1d"), ("1d-1thread", "1d"), ("2d", "1d-1thread")):
            d = [get(x) - get(y) for x, y in zip(runs[a], runs[b], strict=True)]
            sd = statistics.stdev(d) if len(d) > 1 else float("nan")
            t = statistics.mean(d) / (sd / len(d) ** 0.5) if sd > 0 else float("nan")
            print(f"      {a} - {b}: {statistics.mean(d):+.4f} (t {t:+.2f})")


if __name__ == "__main__":
    main()
