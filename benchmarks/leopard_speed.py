"""Leopard speed, measured side by side in one run on a synthetic genome.

Prints training windows/s with 1 process and with 2 processes (``torchrun``, gloo on CPU,
the same *global* batch split over the workers; runs interleaved 1, 2, 1, 2 … so drift of
the machine hits both), then prediction bp/s of a trained model over a whole chromosome,
batched (the shipped path) and one window per forward pass (for comparison).

    .venv/bin/python benchmarks/leopard_speed.py [--window 2048] [--batch 16] [--steps 12]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _train(data: Path, out: Path, nproc: int, args: argparse.Namespace) -> dict:
    cores = os.cpu_count() or 1
    threads = max(1, cores // nproc)
    train = ["-m", "tunelab.leopard", "train", "--data", str(data), "--out", str(out),
             "--window", str(args.window), "--batch-size", str(args.batch // nproc),
             "--epochs", "2", "--steps-per-epoch", str(args.steps), "--max-eval-windows",
             "16", "--threads", str(threads), "--no-progress", "--device", "cpu"]
    if nproc > 1:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", str(nproc), *train]
    else:
        argv = [sys.executable, *train]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    r = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if r.returncode != 0:
        sys.exit(f"training with {nproc} process(es) failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=16, help="global batch (split over workers)")
    ap.add_argument("--steps", type=int, default=12, help="training steps per epoch (2 epochs)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--chrom-length", type=int, default=400_000)
    args = ap.parse_args()

    import torch

    from tunelab.leopard.data import load_chromosomes, load_manifest
    from tunelab.leopard.model import Architecture, LeopardUNet
    from tunelab.leopard.predict import predict_genome
    from tunelab.leopard.synthetic import SyntheticConfig, write_synthetic
    from tunelab.leopard.train import load_checkpoint

    with tempfile.TemporaryDirectory(prefix="leopard-bench-") as tmp:
        root = Path(tmp)
        data = write_synthetic(root / "data", SyntheticConfig(
            n_chroms=4, chrom_length=args.chrom_length))
        rates: dict[int, list[float]] = {1: [], 2: []}
        for rep in range(args.repeats):
            for nproc in (1, 2):
                foms = _train(data, root / f"run{nproc}-{rep}", nproc, args)
                rates[nproc].append(foms["windows_per_s"])
        one, two = statistics.median(rates[1]), statistics.median(rates[2])
        print(f"cores: {os.cpu_count()}  torch {torch.__version__}  window {args.window} bp  "
              f"global batch {args.batch}")
        print(f"training, 1 process : {one:8.1f} windows/s  ({one * args.window:,.0f} bp/s)  "
              f"runs {[round(r, 1) for r in rates[1]]}")
        print(f"training, 2 processes: {two:8.1f} windows/s  ({two / 2:.1f} per worker)  "
              f"runs {[round(r, 1) for r in rates[2]]}")
        print(f"2-process / 1-process: {two / one:.2f}x")

        ck = root / "run1-0" / "best.pt"
        batched = predict_genome(ck, data, root / "pred.bw", ["chr4"], batch_size=32,
                                 device="cpu")
        print(f"prediction (batched 32): {batched['bp_per_s']:,.0f} bp/s compute, "
              f"{batched['bp_per_s_end_to_end']:,.0f} bp/s with reading and writing "
              f"({batched['bp']:,.0f} bp)")
        # the same chromosome, one window per forward pass
        from tunelab.leopard.predict import predict_chromosome

        c = load_checkpoint(ck)
        model = LeopardUNet(Architecture(**c["arch"]))
        model.load_state_dict(c["model"])
        cs = load_chromosomes(load_manifest(data), ["chr4"])
        t = time.perf_counter()
        predict_chromosome(model, cs.seq, cs.dnase, None, int(c["window"]), batch_size=1)
        single = cs.total_length / (time.perf_counter() - t)
        print(f"prediction (1 window/pass): {single:,.0f} bp/s  -> batched is "
              f"{batched['bp_per_s'] / single:.2f}x")


if __name__ == "__main__":
    main()
