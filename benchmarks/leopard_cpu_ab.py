"""Leopard on a CPU, two versions side by side: training windows/s and genome-wide prediction
Mbp/s of this checkout's ``src`` against another's (e.g. the commit before a change),
alternating A, B, A, B … in fresh processes on the same data, medians and per-round ratios.

    git archive <commit> src | tar -x -C /tmp/base
    .venv/bin/python benchmarks/leopard_cpu_ab.py --base-src /tmp/base/src [--rounds 3]

Training: ``tunelab leopard train`` (window 10,240, batch 32 by default, ``--amp`` where the
CPU has native bf16, layout and everything else as the version decides), the figure is its
``windows_per_s``. Prediction: ``tunelab leopard predict`` of the validation and test
chromosomes into a bigWig (bigWig in, bigWig out), ``bp_per_s`` (compute) and
``bp_per_s_end_to_end``. A machine shared with other jobs moves both; only the ratios
within a round mean something.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "src"


def _run(src: Path, args: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    r = subprocess.run([sys.executable, "-m", "tunelab.leopard", *args], capture_output=True,
                       text=True, env=env, check=False)
    if r.returncode != 0:
        sys.exit(f"{src}: {' '.join(args[:1])} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-src", type=Path, required=True, help="the other version's src/")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=int, default=10240)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=4, help="training steps per epoch (2 epochs)")
    ap.add_argument("--chrom-mbp", type=float, default=2.0, help="Mbp per chromosome (6)")
    ap.add_argument("--layout", default="auto", help="training layout (pin it: the probe is "
                    "noisy on a busy machine)")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    import torch

    from tunelab.leopard.model import LeopardUNet
    from tunelab.leopard.runtime import bf16_capable, cpu_flags
    from tunelab.leopard.synthetic import SyntheticConfig, write_synthetic

    amp = ["--amp"] if bf16_capable(cpu_flags()) else []
    versions = {"base": args.base_src.resolve(), "this": HERE}
    with tempfile.TemporaryDirectory(prefix="leopard-ab-") as tmp:
        root = Path(tmp)
        data = write_synthetic(root / "data", SyntheticConfig(
            n_chroms=6, chrom_length=int(args.chrom_mbp * 1e6)))
        torch.manual_seed(0)
        model = LeopardUNet()
        ck = root / "model.pt"
        torch.save({"arch": model.arch.to_dict(), "window": args.window,
                    "model": model.state_dict()}, ck)
        train = ["train", "--data", str(data), "--window", str(args.window), "--batch-size",
                 str(args.batch), "--epochs", "2", "--steps-per-epoch", str(args.steps),
                 "--max-eval-windows", "8", "--no-progress", "--device", "cpu", "--layout",
                 args.layout, *amp]
        predict = ["predict", "--checkpoint", str(ck), "--data", str(data), "--chroms",
                   "chr5,chr6", "--device", "cpu"]
        fig: dict[str, dict[str, list[float]]] = {v: {"train": [], "mbps": [], "e2e": []}
                                                  for v in versions}
        for rnd in range(args.rounds):
            order = list(versions) if rnd % 2 == 0 else list(versions)[::-1]
            for v in order:
                t = _run(versions[v], [*train, "--out", str(root / f"t-{v}-{rnd}")])
                p = _run(versions[v], [*predict, "--out", str(root / f"p-{v}-{rnd}.bw")])
                fig[v]["train"].append(t["windows_per_s"])
                fig[v]["mbps"].append(p["bp_per_s"] / 1e6)
                fig[v]["e2e"].append(p["bp_per_s_end_to_end"] / 1e6)
            print(f"round {rnd + 1}: " + "  ".join(
                f"{v}: train {fig[v]['train'][-1]:.1f} w/s, predict {fig[v]['mbps'][-1]:.2f} "
                f"/ {fig[v]['e2e'][-1]:.2f} Mbp/s" for v in versions), flush=True)
        print(f"\ncores {len(os.sched_getaffinity(0))}, torch {torch.__version__}, window "
              f"{args.window}, batch {args.batch}, {'bf16 --amp' if amp else 'fp32'}; "
              f"prediction of chr5+chr6 ({2 * args.chrom_mbp:g} Mbp), medians of "
              f"{args.rounds} alternating rounds")
        for key, name in (("train", "training windows/s"), ("mbps", "prediction Mbp/s compute"),
                          ("e2e", "prediction Mbp/s end to end")):
            base, this = fig["base"][key], fig["this"][key]
            ratios = [b / a for a, b in zip(base, this, strict=True)]
            print(f"{name:30s} base {statistics.median(base):8.2f}  this "
                  f"{statistics.median(this):8.2f}  this/base per round "
                  f"{', '.join(f'{r:.2f}' for r in ratios)} (median "
                  f"{statistics.median(ratios):.2f})")


if __name__ == "__main__":
    main()
