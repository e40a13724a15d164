"""Leopard on one GPU, every figure of issue 26 in one run (tiny, on a CPU, for CI).

    python3 benchmarks/leopard_gpu.py [--budget 450] [--device auto] [--work DIR]
    python3 benchmarks/leopard_gpu.py --tiny --device cpu        # CI: the same parts, tiny

Parts, each printed with the command (or code) that produced it, every windows/s beside the
fraction of the same-run GEMM bound (FLOPs per window counted by torch.utils.flop_counter):

1. the device and the same-run GEMM rates (bf16, fp32 and TF32 on CUDA; the CPU's too);
2. FLOPs per window, forward and training (forward + backward);
3. training windows/s at batch 64 and 256 (``tunelab leopard train``: the step rate of the
   second epoch, and the whole run's); 3b. the kernels of one eager step at batch 256 by
   their time (``benchmarks/leopard_step_profile.py``), in the 2-D form and in it on channels
   padded to 8, and of a validation batch;
4. genome-wide prediction Mbp/s, compute and end to end, bigWig in -> bigWig out, on a
   >= 300 Mbp synthetic genome (generated first, in parallel), and where its wall time went;
5. validation PR-AUC of the CPU path against the GPU path, 3 seeds each, short runs on the
   default synthetic genome;
6. the seed's recipe — 5 epochs x 100,000 training windows + 100,000 validation windows
   per epoch, batch 64, lr 0.01, window 10,240 — wall time beside the seed's 941.6 s (A100)
   and 3,170 s (V100); it gets what is left of ``--budget`` and, stopped by it, says how far
   it got.

A part that fails prints its error and the run goes on; the exit status is then 1. Figures
also go to ``WORK/leopard_gpu.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

SEED_A100_S, SEED_V100_S = 941.6, 3170.0


@dataclass(frozen=True)
class Sizes:
    """How big each part is."""

    chroms: int  # the large genome (prediction, recipe): chromosomes x length
    chrom_len: int
    window: int
    batches: tuple[int, int]
    rate_steps: int  # per epoch, two epochs
    recipe_epochs: int
    recipe_train: int  # windows per epoch
    recipe_val: int
    recipe_batch: int
    seeds: int
    seed_run: dict[str, Any]  # the PR-AUC runs' TrainConfig fields
    gemm_n: int
    small_len: int  # the small genome (rates, PR-AUC): 6 chromosomes of this length


FULL = Sizes(chroms=16, chrom_len=20_000_000, window=10240, batches=(64, 256), rate_steps=150,
             recipe_epochs=5, recipe_train=100_000, recipe_val=100_000, recipe_batch=64,
             seeds=3, seed_run={"window": 2048, "batch_size": 16, "lr": 0.01, "epochs": 4,
                                "steps_per_epoch": 20, "bn_momentum": 0.1,
                                "max_eval_windows": 0},  # all val windows (~97; was 64)
             gemm_n=8192, small_len=200_000)
TINY = Sizes(chroms=4, chrom_len=40_000, window=1024, batches=(2, 4), rate_steps=2,
             recipe_epochs=2, recipe_train=8, recipe_val=8, recipe_batch=2, seeds=3,
             seed_run={"window": 512, "batch_size": 2, "lr": 0.01, "epochs": 1,
                       "steps_per_epoch": 1, "bn_momentum": 0.1,
                       # every val window (39): 4 could hold no bound base, which training
                       # now refuses (PR-AUC undefined) rather than scoring 0
                       "max_eval_windows": 0},
             gemm_n=1024, small_len=20_000)


class Report:
    """Printed lines and the JSON of figures; the budget's clock."""

    def __init__(self, budget: float, out: Path, logs: Path) -> None:
        self.t0, self.budget, self.out, self.logs = time.perf_counter(), budget, out, logs
        self.figures: dict[str, Any] = {}
        out.parent.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.t0)

    def say(self, text: str = "") -> None:
        print(text, flush=True)

    def command(self, text: str) -> None:
        print(f"    $ {text}", flush=True)

    def part(self, key: str, title: str, fn: Callable[[], Any]) -> Any:
        self.say(f"\n== {title}  [{time.perf_counter() - self.t0:.0f} s in, "
                 f"{self.left():.0f} s of the budget left]")
        t = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:  # one part failing must not cost the others
            first = str(exc).splitlines()[0] if str(exc) else ""
            self.say(f"!! {key} failed: {type(exc).__name__}: {first}")
            self.say("".join(traceback.format_exc().splitlines(keepends=True)[-12:]))
            self.figures[key] = {"error": f"{type(exc).__name__}: {exc}"}
            return None
        self.say(f"   ({key}: {time.perf_counter() - t:.1f} s)")
        self.figures[key] = value
        self.out.write_text(json.dumps(self.figures, indent=2, default=str) + "\n")
        return value


# ------------------------------------------------------------------------------ parts


def gemm_rates(device: str, n: int, reps: int = 10) -> dict[str, float]:
    """TFLOP/s of an n^3 matmul per dtype on ``device`` (TF32 counted apart on CUDA)."""
    import torch

    out = {}
    kinds = [("bf16", torch.bfloat16, False), ("fp32", torch.float32, False)]
    if device == "cuda":
        kinds.append(("tf32", torch.float32, True))
    for name, dtype, tf32 in kinds:
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        for _ in range(3):
            a @ b
        _sync(device)
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        _sync(device)
        out[name] = 2 * n**3 * reps / (time.perf_counter() - t) / 1e12
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    return out


def window_flops(window: int) -> tuple[float, float]:
    """FLOPs of one window: forward, and forward + backward (torch.utils.flop_counter)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from tunelab.leopard.model import LeopardUNet

    model = LeopardUNet().train()
    model.channels_last_training = False
    x = torch.rand(1, 5, window)
    with FlopCounterMode(display=False) as fwd:
        model(x)
    with FlopCounterMode(display=False) as both:
        model(x).sum().backward()
    return float(fwd.get_total_flops()), float(both.get_total_flops())


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _train_cli(cfg: Any) -> str:
    """The ``tunelab leopard train`` command line of a TrainConfig (non-default fields)."""
    from tunelab.leopard.train import TrainConfig

    default = TrainConfig(data=Path("."), out=Path("."))
    words = ["python -m tunelab.leopard train", f"--data {cfg.data}", f"--out {cfg.out}"]
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if f.name in ("data", "out", "extra") or v == getattr(default, f.name):
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(v, bool):
            words.append(flag if v else "--no-" + f.name.replace("_", "-"))
        elif v is None:
            words.append(f"{flag} 0" if f.name == "max_eval_windows" else "")
        else:
            words.append(f"{flag} {v}")
    return " ".join(w for w in words if w)


def _logged(r: Report, name: str, fn: Callable[[], Any]) -> Any:
    """``fn()`` with its stdout and stderr (training's epoch lines) in ``LOGS/name.log``;
    the log's end is printed when it fails."""
    r.logs.mkdir(parents=True, exist_ok=True)
    path = r.logs / f"{name}.log"
    try:
        with path.open("w") as fh, contextlib.redirect_stdout(fh), \
                contextlib.redirect_stderr(fh):
            return fn()
    except Exception:
        sys.stdout.write("".join(path.read_text().splitlines(True)[-15:]))
        raise


def _train(r: Report, **kw: Any) -> tuple[dict[str, float], dict[str, Any], float]:
    from tunelab.leopard.train import TrainConfig, train

    cfg = TrainConfig(progress=False, **kw)
    r.command(_train_cli(cfg))
    t = time.perf_counter()
    foms = _logged(r, Path(cfg.out).name, lambda: train(cfg))
    wall = time.perf_counter() - t
    doc = json.loads((Path(cfg.out) / "metrics.json").read_text())
    return foms, doc, wall


def _rate(flop_s: float) -> str:
    """FLOP/s in the unit that suits it."""
    return (f"{flop_s / 1e12:,.1f} TFLOP/s" if flop_s >= 1e12 else
            f"{flop_s / 1e9:,.1f} GFLOP/s")


def _readers(n: int) -> str:
    return "reading in turn" if n == 0 else "1 reader thread" if n == 1 else \
        f"{n} reader processes"


def _mbp(bp: float) -> str:
    return f"{bp / 1e6:,.0f} Mbp" if bp >= 1e7 else f"{bp / 1e6:.2f} Mbp"


def _bound(rate_w: float, flops: float, peak_tflops: float) -> str:
    return f"{_rate(rate_w * flops)} = {rate_w * flops / 1e12 / peak_tflops:.3f}"


def part_rates(r: Report, s: Sizes, device: str, small: Path, work: Path,
               flops: dict[int, tuple[float, float]], peak: dict[str, float]) -> dict:
    out = {}
    for batch in s.batches:
        foms, doc, _ = _train(r, data=small, out=work / f"rate-b{batch}", window=s.window,
                              batch_size=batch, epochs=2, steps_per_epoch=s.rate_steps,
                              max_eval_windows=16, device=device)
        steady = doc["history"][-1]["step_windows_per_s"]
        f_train = flops[s.window][1]
        r.say(f"  batch {batch:4d}: {steady:10,.0f} windows/s (second epoch's steps; "
              f"{_bound(steady, f_train, peak['bf16'])} of the bf16 GEMM rate, "
              f"{steady * f_train / 1e12 / peak['fp32']:.3f} of fp32); whole run "
              f"{foms['windows_per_s']:,.0f} windows/s (first steps, and a capture, included)")
        r.say(f"    runtime: {doc['runtime']}")
        out[f"b{batch}"] = {"windows_per_s_steady": steady,
                            "windows_per_s_run": foms["windows_per_s"],
                            "fraction_bf16": steady * f_train / 1e12 / peak["bf16"],
                            "runtime": doc["runtime"]}
    return out


def part_profile(r: Report, s: Sizes, device: str) -> dict:
    from leopard_step_profile import describe, profile_step

    r.command(f"python3 benchmarks/leopard_step_profile.py --device {device} --batch "
              f"{s.batches[1]} --window {s.window} --layout 2d (and 2d8)")
    steps = 5 if s is FULL else 2
    p = profile_step(device, s.batches[1], s.window, "2d", steps=steps)
    padded = profile_step(device, s.batches[1], s.window, "2d8", steps=steps, top=6)
    for line in describe(p) + describe(padded):
        r.say(line)
    r.say(f"  2d8 / 2d: {padded['windows_per_s'] / p['windows_per_s']:.2f}x windows/s, eager "
          "(each run's probe measures both, captured and not, and takes the faster)")
    ev = profile_step(device, s.batches[1], s.window, "2d", steps=steps, top=8,
                      evaluation=True)
    for line in describe(ev):
        r.say(line)
    return {**p, "padded": padded, "evaluation": ev}


def part_predict(r: Report, s: Sizes, device: str, big: Path, work: Path, ck: Path,
                 chroms: list[str], flops: dict[int, tuple[float, float]],
                 peak: dict[str, float]) -> dict:
    from tunelab.leopard.predict import predict_genome

    out_bw = work / "prediction.bw"
    r.command(f"python -m tunelab.leopard predict --checkpoint {ck} --data {big} --out "
              f"{out_bw} --chroms {','.join(chroms)} --device {device}")
    res = _logged(r, "prediction", lambda: predict_genome(ck, big, out_bw, chroms,
                                                         device=device))
    w = res["windows"] / max(res["seconds"], 1e-9)
    f_fwd = flops[int(res["window"])][0] if int(res["window"]) in flops else \
        window_flops(int(res["window"]))[0]
    r.say(f"  {_mbp(res['bp'])}: {res['bp_per_s'] / 1e6:,.2f} Mbp/s compute "
          f"({w:,.0f} windows/s of {int(res['window']):,} bp; {_bound(w, f_fwd, peak['bf16'])}"
          f" of the bf16 GEMM rate), {res['bp_per_s_end_to_end'] / 1e6:,.2f} Mbp/s end to "
          f"end ({res['wall_s']:.1f} s: loading, runtime choice, reading, predicting, "
          f"writing); {_readers(res['readers'])}, {res['writers']} writer threads, "
          f"{res['sections']} sections; output {out_bw.stat().st_size / 2**20:,.0f} MiB")
    ph = res["phases"]
    r.say(f"    wall time: load {ph['load_s']:.2f} s, runtime choice {ph['runtime_s']:.2f} s, "
          f"start {ph['start_s']:.2f} s, run {ph['run_s']:.2f} s (waiting for readers "
          f"{ph['read_wait_s']:.2f} s, for writers {ph['write_wait_s']:.2f} s; device "
          f"{res['seconds']:.2f} s), close {ph['close_s']:.2f} s")
    r.say(f"    runtime: {res['runtime']}")
    return {k: v for k, v in res.items()}


def part_seeds(r: Report, s: Sizes, device: str, small: Path, work: Path,
               peak: dict[str, float], cpu_peak: dict[str, float],
               flops: dict[int, tuple[float, float]]) -> dict:
    paths = ["cpu"] + (["cuda"] if device == "cuda" else [])
    out: dict[str, Any] = {}
    f_train = flops[s.seed_run["window"]][1]
    for path in paths:
        runs = []
        for seed in range(s.seeds):
            if r.left() < 60 and runs:
                r.say(f"  {path}: stopped after {len(runs)} seed(s): the budget is short")
                break
            foms, doc, wall = _train(r, data=small, out=work / f"seed-{path}-{seed}",
                                     seed=seed, device=path, **s.seed_run)
            bound = (cpu_peak if path == "cpu" else peak)["fp32" if path == "cpu" else "bf16"]
            rate = foms["windows_per_s"]
            r.say(f"  {path} seed {seed}: val PR-AUC {foms['val_pr_auc']:.4f}, test "
                  f"{foms['test_pr_auc']:.4f}; {rate:,.0f} windows/s "
                  f"({_bound(rate, f_train, bound)} of the {path} "
                  f"{'fp32' if path == 'cpu' else 'bf16'} GEMM rate), {wall:.1f} s")
            runs.append({"seed": seed, "val_pr_auc": foms["val_pr_auc"],
                         "test_pr_auc": foms["test_pr_auc"], "windows_per_s": rate,
                         "wall_s": wall})
        vals = [x["val_pr_auc"] for x in runs]
        sd = statistics.stdev(vals) if len(vals) > 1 else float("nan")
        r.say(f"  {path} path: val PR-AUC mean {statistics.mean(vals):.4f} ± {sd:.4f} "
              f"(sd over {len(vals)} seeds)")
        out[path] = runs
    return out


def part_recipe(r: Report, s: Sizes, device: str, big: Path, work: Path,
                flops: dict[int, tuple[float, float]], peak: dict[str, float]) -> dict:
    steps = math.ceil(s.recipe_train / s.recipe_batch)
    limit = float(max(round(r.left() - 30), 5))  # the final evaluation and writing
    foms, doc, wall = _train(r, data=big, out=work / "recipe", window=s.window,
                             batch_size=s.recipe_batch, lr=0.01, epochs=s.recipe_epochs,
                             steps_per_epoch=steps, val_windows=s.recipe_val,
                             device=device, time_limit=limit, patience=s.recipe_epochs)
    hist = doc["history"]
    done = sum(h["steps"] for h in hist)
    full = steps * s.recipe_epochs
    windows = done * s.recipe_batch
    finished = done == full
    rate = foms["windows_per_s"]
    r.say(f"  {'finished' if finished else 'STOPPED by the budget'}: {len(hist)} epoch(s), "
          f"{done:,} of {full:,} steps ({windows:,} training windows + "
          f"{len(hist) * s.recipe_val:,} validation windows), wall {wall:.1f} s "
          f"(loading, set-up, training, validation, test)")
    if s is not FULL:
        r.say("  (tiny sizes: not comparable with the seed's 941.6 s on an A100)")
    elif finished:
        r.say(f"  vs the seed: A100 {SEED_A100_S} s -> {SEED_A100_S / wall:.1f}x, V100 "
              f"{SEED_V100_S:,.0f} s -> {SEED_V100_S / wall:.1f}x")
    else:
        r.say(f"  (at this pace the whole recipe would take ~{wall * full / max(done, 1):,.0f}"
              f" s: the seed's A100 {SEED_A100_S} s, V100 {SEED_V100_S:,.0f} s)")
    by_epoch = ", ".join(f"{h['val_pr_auc']:.4f}" for h in hist)
    r.say(f"  training {rate:,.0f} windows/s ({_bound(rate, flops[s.window][1], peak['bf16'])}"
          f" of the bf16 GEMM rate); val PR-AUC by epoch {by_epoch}; test PR-AUC "
          f"{foms['test_pr_auc']:.4f}")
    ph = doc.get("phases") or {}
    if ph:
        r.say(f"    wall time: set-up {ph['setup_s']:.1f} s (data, model, runtime probe), steps "
              f"{ph['steps_s']:.1f} s, validation {ph['validation_s']:.1f} s, checkpoints "
              f"{ph['checkpoints_s']:.1f} s, final evaluation {ph['final_evaluation_s']:.1f} s")
    r.say(f"    runtime: {doc['runtime']}")
    return {"finished": finished, "wall_s": wall, "steps_done": done, "steps_full": full,
            "phases": ph,
            "epochs": len(hist), "windows_per_s": rate, "val_pr_auc": foms["val_pr_auc"],
            "test_pr_auc": foms["test_pr_auc"], "history": hist, "runtime": doc["runtime"]}


# ------------------------------------------------------------------------------ main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=450.0,
                    help="seconds for the whole run; the recipe gets what is left")
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="CI sizes (runs on a CPU)")
    ap.add_argument("--work", type=Path, help="keep data and outputs here (default: temp)")
    ap.add_argument("--json", type=Path, help="write the figures here (default: "
                    "WORK/leopard_gpu.json)")
    args = ap.parse_args()

    import torch

    from tunelab.leopard.synthetic import SyntheticConfig, write_synthetic

    device = args.device if args.device != "auto" else (
        "cuda" if torch.cuda.is_available() else "cpu")
    s = TINY if args.tiny else FULL
    cores = len(os.sched_getaffinity(0))
    tmp = None if args.work else tempfile.TemporaryDirectory(prefix="leopard-gpu-")
    work = args.work or Path(tmp.name)  # type: ignore[union-attr]
    work.mkdir(parents=True, exist_ok=True)
    r = Report(args.budget, args.json or work / "leopard_gpu.json",
               (args.json.parent if args.json else work) / "leopard_gpu_logs")
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    r.say(f"leopard_gpu: {name}; torch {torch.__version__} (CUDA {torch.version.cuda}); "
          f"{cores} cores; {'tiny' if args.tiny else 'full'} sizes; budget {args.budget:.0f} s"
          f"; {time.strftime('%Y-%m-%d %H:%M:%S')}")
    r.figures["setup"] = {"device": name, "torch": torch.__version__, "cores": cores,
                          "tiny": args.tiny, "budget_s": args.budget}

    def gemms() -> dict:
        out = {"device": gemm_rates(device, s.gemm_n)}
        out["cpu"] = out["device"] if device == "cpu" else gemm_rates("cpu", min(s.gemm_n,
                                                                                 2048), 3)
        for where, rates in out.items():
            r.say(f"  {where}: " + ", ".join(f"{k} {_rate(v * 1e12)}" for k, v in rates.items()))
        r.command(f"this script: torch.matmul of {s.gemm_n}^3 random matrices, 10 timed after"
                  " 3 (the CPU's: 2048^3 at most)")
        return out

    g = r.part("gemm", "1. same-run GEMM rates", gemms)
    peak = g["device"] if g else {"bf16": float("nan"), "fp32": float("nan")}
    cpu_peak = g["cpu"] if g else peak

    def count() -> dict:
        out = {}
        for w in sorted({s.window, s.seed_run["window"]}):
            fwd, both = window_flops(w)
            out[w] = (fwd, both)
            r.say(f"  window {w:,}: {fwd / 1e9:.3f} GFLOP forward, {both / 1e9:.3f} GFLOP "
                  "training (forward + backward)")
        r.command("this script: torch.utils.flop_counter.FlopCounterMode over LeopardUNet()")
        return out

    flops = r.part("flops", "2. FLOPs per window", count) or {}

    def data() -> dict:
        small = write_synthetic(work / "small", SyntheticConfig(chrom_length=s.small_len))
        r.command(f"python -m tunelab.leopard synth {work / 'small'} --chrom-length "
                  f"{s.small_len}")
        held = 2 if s.chroms >= 8 else 1  # validation and test chromosomes each
        cfg = SyntheticConfig(n_chroms=s.chroms, chrom_length=s.chrom_len, val_chroms=held,
                              test_chroms=held)
        t = time.perf_counter()
        big = write_synthetic(work / "big", cfg, workers=max(1, cores - 1))
        mbp = s.chroms * s.chrom_len / 1e6
        r.say(f"  {_mbp(mbp * 1e6)} ({s.chroms} x {s.chrom_len / 1e6:g} Mbp) in "
              f"{time.perf_counter() - t:.1f} s")
        r.command(f"this script: write_synthetic({work / 'big'}, SyntheticConfig(n_chroms="
                  f"{s.chroms}, chrom_length={s.chrom_len}, val_chroms={held}, test_chroms="
                  f"{held}), workers={max(1, cores - 1)})")
        return {"small": str(small.parent), "big": str(big.parent), "big_mbp": mbp}

    d = r.part("data", "data: the synthetic genomes", data)
    if d is None:
        r.say("no data: nothing else can run")
        return 1
    small, big = Path(d["small"]), Path(d["big"])
    r.part("training", f"3. training windows/s at batch {s.batches[0]} and "
                   f"{s.batches[1]} (window {s.window:,})",
                   lambda: part_rates(r, s, device, small, work, flops, peak))
    r.part("profile", f"3b. where a training step's time goes (batch {s.batches[1]}, eager)",
           lambda: part_profile(r, s, device))
    ck = work / f"rate-b{s.batches[0]}" / "best.pt"
    if not ck.is_file():  # the training part failed: predict with a fresh model
        from tunelab.leopard.model import LeopardUNet

        torch.manual_seed(0)
        m = LeopardUNet()
        ck.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"arch": m.arch.to_dict(), "window": s.window, "model": m.state_dict()},
                   ck)
    chroms = [f"chr{i + 1}" for i in range(s.chroms)]
    r.part("prediction", f"4. genome-wide prediction of {_mbp(d['big_mbp'] * 1e6)}",
           lambda: part_predict(r, s, device, big, work, ck, chroms, flops, peak))
    r.part("pr_auc", f"5. validation PR-AUC, CPU path vs GPU path, {s.seeds} seeds",
           lambda: part_seeds(r, s, device, small, work, peak, cpu_peak, flops))
    r.part("recipe", f"6. the seed's recipe ({s.recipe_epochs} x ({s.recipe_train:,} + "
           f"{s.recipe_val:,}) windows, batch {s.recipe_batch}, lr 0.01)",
           lambda: part_recipe(r, s, device, big, work, flops, peak))
    failed = [k for k, v in r.figures.items() if isinstance(v, dict) and "error" in v]
    r.say(f"\ntotal {time.perf_counter() - r.t0:.0f} s; figures in {r.out}"
          + (" (in a temporary folder, removed now)" if tmp and not args.json else "")
          + (f"; FAILED parts: {', '.join(failed)}" if failed else ""))
    if tmp is not None:
        tmp.cleanup()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
