#!/usr/bin/env python3
"""Leopard in tunelab (PyTorch) against the same network in Keras 3 / TensorFlow, in one run.

1. **Fixed shape** (window 10,240 bp, batch 32, the same thread count for both): a Keras
   server process and a tunelab server process stay up, and each round asks them in turn
   for prediction and training windows/s (contenders alternate, so a busy moment of the
   machine hits every one of them; medians over rounds are reported). Each round also
   measures the machine's arithmetic bound, a large fp32 ``torch.matmul`` in GFLOP/s, and
   every row says its GFLOP/s (FLOPs counted with ``torch.utils.flop_counter``) as a
   fraction of that bound next to its ratio to Keras.
2. **bf16 agreement**: when the runtime picks bf16, a model trained briefly on a synthetic
   genome predicts the held-out chromosomes in fp32 and in bf16; their PR-AUCs must agree
   within 1e-3.
3. **Genome-wide**: ``python -m tunelab.leopard predict`` end to end (bigWig in, bigWig out)
   over the synthetic genome's validation and test chromosomes, at the training window's
   tiling and with longer prediction windows.

Keras is optional: ``bash scripts/keras-venv.sh`` makes its virtual environment (never in
the project's own); without ``--keras-python`` the Keras rows are skipped with the reason.

    bash scripts/keras-venv.sh
    .venv/bin/python benchmarks/leopard_vs_keras.py \\
        --keras-python ~/.cache/tunelab/keras-venv/bin/python
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GEMM_N = 2048


# --------------------------------------------------------------------------- servers


def _inputs(n: int, window: int, channels_last: bool, seed: int = 0) -> tuple[np.ndarray,
                                                                                np.ndarray]:
    """Random one-hot DNA + gamma DNase windows and 5 % bound labels (same for both)."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 4, (n, window))
    x = np.zeros((n, window, 5), np.float32)
    np.put_along_axis(x, codes[:, :, None], 1.0, axis=2)
    x[:, :, 4] = rng.gamma(1.0, 1.0, (n, window))
    y = (rng.random((n, window)) < 0.05).astype(np.float32)
    return (x if channels_last else np.ascontiguousarray(x.transpose(0, 2, 1))), y


def _timed(fn: Any, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return time.perf_counter() - t


def keras_server(args: argparse.Namespace) -> None:
    """Answer timing requests with the Keras model (runs in the Keras virtual environment)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf
    from keras import layers

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)

    def conv_block(h: Any, n: int) -> Any:
        for _ in range(2):
            h = layers.Conv1D(n, 7, padding="same", activation="relu")(h)
            h = layers.BatchNormalization(momentum=0.99, epsilon=1e-3)(h)
        return h

    inp = keras.Input((args.window, 5))
    enc = [15]
    for _ in range(5):
        enc.append(int(enc[-1] * 1.5))
    h = conv_block(inp, enc[0])
    skips = [h]
    for f in enc[1:]:
        h = conv_block(layers.MaxPooling1D(2)(h), f)
        skips.append(h)
    skips.pop()
    f = int(enc[-1] / 1.5)
    for _ in range(5):
        h = layers.Conv1DTranspose(f, 2, strides=2)(h)
        h = conv_block(layers.Concatenate()([h, skips.pop()]), f)
        f = int(f / 1.5)
    out = layers.Conv1D(1, 1, activation="sigmoid")(h)
    model = keras.Model(inp, out)
    jit = {"on": True, "off": False, "auto": "auto"}[args.keras_jit]
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy",
                  jit_compile=jit)
    x, y = _inputs(args.batch, args.window, channels_last=True)
    y = y[:, :, None]
    model.predict_on_batch(x)
    model.train_on_batch(x, y)
    info = {"params": int(model.count_params()), "keras": keras.__version__,
            "tensorflow": tf.__version__, "jit_compile": str(model.jit_compile),
            "intra_op": args.threads,
            "inter_op": tf.config.threading.get_inter_op_parallelism_threads()}
    _serve({"info": lambda req: info,
            "predict": lambda req: {"windows_per_s": req["n"] * args.batch / _timed(
                lambda: model.predict_on_batch(x), req["n"])},
            "train": lambda req: {"windows_per_s": req["n"] * args.batch / _timed(
                lambda: model.train_on_batch(x, y), req["n"])}})


def tunelab_server(args: argparse.Namespace) -> None:
    """Answer timing requests with tunelab's model, engine and training step. The "before"
    server loads torch ahead of tunelab.leopard, so OpenMP keeps its default (spinning)
    wait policy, as the code before this work ran."""
    if args.serve == "tunelab":
        import tunelab.leopard  # noqa: F401  (sets the OpenMP wait policy before torch loads)
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from tunelab.leopard.model import LeopardUNet
    from tunelab.leopard.runtime import bf16_capable, cpu_flags, keep_freed_memory, prepare
    from tunelab.leopard.trainstep import masked_bce_sum as _masked_bce_sum

    # prepare() sets this process-wide for the engines; set it up front so that no variant's
    # speed depends on which one ran first
    keep_freed_memory()
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(0)
    xa, ya = _inputs(args.batch, args.window, channels_last=False)
    x, y = torch.from_numpy(xa), torch.from_numpy(ya).to(torch.int8)
    ref = LeopardUNet().eval()
    predictors: dict[str, Any] = {}

    def predictor(variant: str) -> Any:
        if variant not in predictors:
            if variant == "eager-fp32":  # the unfolded network, as prediction ran before
                def run() -> None:
                    with torch.inference_mode():
                        ref(x)
                predictors[variant] = (run, {"precision": "fp32", "note": "unfolded"})
            else:
                precision, compile_ = {"fp32": ("fp32", "off"), "bf16": ("bf16", "off"),
                                       "auto": ("auto", "off"),
                                       "auto-compiled": ("auto", "on")}[variant]
                engine = prepare(ref, "cpu", precision, compile_, args.threads, args.window,
                                 args.batch)
                predictors[variant] = (lambda: engine(x), engine.runtime.to_dict())
            predictors[variant][0]()  # warm-up
        return predictors[variant]

    trainers: dict[str, Any] = {}

    def trainer(variant: str) -> Any:
        if variant not in trainers:
            torch.manual_seed(0)
            model = LeopardUNet().train()
            model.channels_last_training = "-2d" in variant  # the channels-last 2-D form
            net = torch.compile(model) if variant.endswith("compiled") else model
            opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
            amp = variant.startswith("bf16")

            def step() -> None:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                    logits = net(x)
                lsum, cnt = _masked_bce_sum(logits, y)
                opt.zero_grad(set_to_none=True)
                (lsum / cnt.clamp_min(1)).backward()
                opt.step()
            step()  # warm-up (and compilation)
            trainers[variant] = step
        return trainers[variant]

    def flops() -> dict[str, float]:
        one = x[:1]
        with FlopCounterMode(display=False) as fc, torch.no_grad():
            ref(one)
        fwd = fc.get_total_flops()
        model = LeopardUNet().train()
        with FlopCounterMode(display=False) as fc:
            model(x[:2]).sum().backward()
        return {"forward": fwd, "train": fc.get_total_flops() / 2}

    def gemm(req: dict[str, Any]) -> dict[str, float]:
        out = {}
        for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            a = torch.randn(GEMM_N, GEMM_N, dtype=dt)
            b = torch.randn(GEMM_N, GEMM_N, dtype=dt)
            a @ b
            best = min(_timed(lambda a=a, b=b: a @ b, 1) for _ in range(3))
            out[name] = 2 * GEMM_N**3 / best
        return out

    info = {"torch": torch.__version__, "flops_per_window": flops(),
            "cpu_bf16": bf16_capable(cpu_flags()), "threads": args.threads}
    _serve({"info": lambda req: info, "gemm": gemm,
            "predict": lambda req: {"windows_per_s": req["n"] * args.batch / _timed(
                predictor(req["variant"])[0], req["n"]),
                "runtime": predictor(req["variant"])[1]},
            "train": lambda req: {"windows_per_s": req["n"] * args.batch / _timed(
                trainer(req["variant"]), req["n"])}})


def _serve(handlers: dict[str, Any]) -> None:
    """One JSON request per stdin line, one JSON answer per stdout line."""
    out = sys.stdout
    sys.stdout = sys.stderr  # library chatter must not corrupt the protocol
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "quit":
            return
        try:
            answer = handlers[req["op"]](req)
        except Exception as exc:  # reported to the driver, which prints it
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


class Server:
    """The driver's handle on one server process."""

    def __init__(self, python: str, kind: str, args: argparse.Namespace) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads),
               "PYTHONPATH": str(ROOT / "src")}
        if kind == "tunelab-before":
            env.pop("OMP_WAIT_POLICY", None)
        argv = [python, __file__, "--serve", kind, "--window", str(args.window), "--batch",
                str(args.batch), "--threads", str(args.threads), "--keras-jit", args.keras_jit]
        self.kind = kind
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL if kind == "keras" else None,
                                     text=True, env=env)
        first = self._read()
        if not first.get("ready"):
            raise RuntimeError(f"{kind} server did not start")

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.kind} server ended (exit {self.proc.wait()})")
        return dict(json.loads(line))

    def ask(self, **req: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        if "error" in answer:
            raise RuntimeError(f"{self.kind} {req}: {answer['error']}")
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            with contextlib.suppress(BrokenPipeError, ValueError):
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# --------------------------------------------------------------------------- part 1


def _med(v: list[float]) -> float:
    return statistics.median(v) if v else float("nan")


def fixed_shape(args: argparse.Namespace) -> dict[str, Any]:
    """Part 1: windows/s, GFLOP/s, fraction of the GEMM bound, ratio to Keras."""
    keras: Server | None = None
    if args.keras_python:
        try:
            keras = Server(args.keras_python, "keras", args)
        except (RuntimeError, OSError) as exc:
            print(f"  - Keras: {exc}; its rows are skipped")
    else:
        print("  - Keras: no --keras-python (bash scripts/keras-venv.sh makes one); its rows "
              "are skipped")
    tl = Server(sys.executable, "tunelab", args)
    before = Server(sys.executable, "tunelab-before", args)
    try:
        info = tl.ask(op="info")
        kinfo = keras.ask(op="info") if keras else None
        pred_variants = ["fp32"] + (["bf16"] if info["cpu_bf16"] or args.force_bf16
                                    else []) + ["auto"] + (["auto-compiled"] if args.compile
                                                           else [])
        train_variants = ["fp32"] + (["bf16"] if info["cpu_bf16"] or args.force_bf16 else [])
        train_variants += [v + "-2d" for v in train_variants]
        train_variants += [v + "-compiled" for v in train_variants] if args.compile else []
        rows: dict[tuple[str, str], list[float]] = {}
        bound: dict[str, list[float]] = {"fp32": [], "bf16": []}
        runtime: dict[str, Any] = {}
        for r in range(args.rounds):
            g = tl.ask(op="gemm")
            for k in bound:
                bound[k].append(g[k])
            if keras:
                rows.setdefault(("predict", "keras"), []).append(
                    keras.ask(op="predict", n=args.predict_batches)["windows_per_s"])
            rows.setdefault(("predict", "before"), []).append(before.ask(
                op="predict", variant="eager-fp32", n=args.predict_batches)["windows_per_s"])
            for v in pred_variants:
                a = tl.ask(op="predict", variant=v, n=args.predict_batches)
                rows.setdefault(("predict", v), []).append(a["windows_per_s"])
                runtime[v] = a["runtime"]
            if keras:
                rows.setdefault(("train", "keras"), []).append(
                    keras.ask(op="train", n=args.train_steps)["windows_per_s"])
            rows.setdefault(("train", "before"), []).append(before.ask(
                op="train", variant="fp32", n=args.train_steps)["windows_per_s"])
            for v in train_variants:
                rows.setdefault(("train", v), []).append(
                    tl.ask(op="train", variant=v, n=args.train_steps)["windows_per_s"])
            print(f"  round {r + 1}/{args.rounds} done (load {os.getloadavg()[0]:.1f})",
                  flush=True)
    finally:
        tl.close()
        before.close()
        if keras:
            keras.close()
    return {"info": info, "keras": kinfo, "rows": rows, "bound": bound, "runtime": runtime}


def print_fixed(res: dict[str, Any], args: argparse.Namespace) -> None:
    info, kinfo, rows, bound = res["info"], res["keras"], res["rows"], res["bound"]
    fl = info["flops_per_window"]
    b32, b16 = _med(bound["fp32"]), _med(bound["bf16"])
    print()
    print(f"fixed shape: window {args.window} bp, batch {args.batch}, {args.threads} threads "
          f"each, {args.rounds} alternating rounds, medians; torch {info['torch']}"
          + (f", Keras {kinfo['keras']} / TF {kinfo['tensorflow']} (jit_compile "
             f"{kinfo['jit_compile']}, {kinfo['params']:,} parameters)" if kinfo else ""))
    print(f"work per window: {fl['forward'] / 1e9:.3f} GFLOP forward, {fl['train'] / 1e9:.3f} "
          f"GFLOP per training window (forward + backward)")
    print(f"arithmetic bound (fp32 torch.matmul {GEMM_N}x{GEMM_N}): {b32 / 1e9:.1f} GFLOP/s "
          f"(rounds {[round(v / 1e9) for v in bound['fp32']]}); bf16 matmul "
          f"{b16 / 1e9:.1f} GFLOP/s")
    labels = {"keras": "Keras 3 (TF)", "before": "tunelab before (eager fp32, spin-wait)",
              "fp32": "tunelab fp32", "auto": "tunelab engine auto",
              "auto-compiled": "tunelab engine auto + compile", "bf16": "tunelab bf16 (--amp)",
              "fp32-compiled": "tunelab fp32 + compile", "bf16-compiled":
              "tunelab bf16 (--amp) + compile", "fp32-2d": "tunelab fp32, 2-D layout",
              "bf16-2d": "tunelab bf16 (--amp), 2-D layout",
              "fp32-2d-compiled": "tunelab fp32, 2-D layout + compile",
              "bf16-2d-compiled": "tunelab bf16 (--amp), 2-D + compile"}
    print()
    print(f"{'':<40} {'windows/s':>10} {'GFLOP/s':>8} {'of bound':>9} {'vs Keras':>9}  runs")
    for phase in ("predict", "train"):
        print("prediction" if phase == "predict" else "training")
        per = fl["forward"] if phase == "predict" else fl["train"]
        k = _med(rows.get((phase, "keras"), []))
        for (ph, v), vals in rows.items():
            if ph != phase:
                continue
            m = _med(vals)
            label = labels.get(v, v)
            if phase == "predict" and v in ("fp32", "bf16"):
                label = f"tunelab engine {v} (BN folded)"
            if phase == "predict" and v in res["runtime"] and "precision" in res["runtime"][v]:
                label += f" [{res['runtime'][v]['precision']}]"
            ratio = f"{m / k:8.2f}x" if k == k and v != "keras" else f"{'':>9}"
            print(f"  {label:<38} {m:10.1f} {m * per / 1e9:8.1f} {m * per / b32:9.2f} {ratio}"
                  f"  {[round(a, 1) for a in vals]}")
    auto = res["runtime"].get("auto", {})
    if auto.get("notes"):
        print(f"runtime choice: {'; '.join(auto['notes'])}")
    k = _med(rows.get(("predict", "keras"), []))
    if k == k:
        need = 2 * k * fl["forward"]
        print(f"2x Keras prediction needs {2 * k:.1f} windows/s = {need / 1e9:.1f} GFLOP/s = "
              f"{need / b32:.2f} of the fp32 bound"
              + (" (more than the fp32 bound allows: only bf16 can get there)"
                 if need > b32 else ""))
        best = max(_med(v) for (ph, name), v in rows.items()
                   if ph == "predict" and name != "keras")
        print(f"prediction target >= 2.0x Keras: {best / k:.2f}x "
              f"({'met' if best >= 2 * k else 'MISSED'})")
        kt = _med(rows.get(("train", "keras"), []))
        bt = max(_med(v) for (ph, name), v in rows.items() if ph == "train" and name != "keras")
        print(f"training target >= 1.3x Keras: {bt / kt:.2f}x "
              f"({'met' if bt >= 1.3 * kt else 'MISSED'})")


# --------------------------------------------------------------------------- parts 2, 3


def _synthetic(root: Path, mbp: float) -> Path:
    from tunelab.leopard.synthetic import SyntheticConfig, write_synthetic

    length = max(200_000, int(mbp * 1e6 / 2))
    return write_synthetic(root / "genome", SyntheticConfig(n_chroms=3, chrom_length=length,
                                                           seed=3))


def _train(data: Path, out: Path, args: argparse.Namespace) -> Path:
    argv = [sys.executable, "-m", "tunelab.leopard", "train", "--data", str(data), "--out",
            str(out), "--window", "2048", "--batch-size", "16", "--epochs", "3",
            "--steps-per-epoch", str(args.agree_steps), "--max-eval-windows", "32",
            "--bn-momentum", "0.1", "--threads", str(args.threads), "--no-progress",
            "--device", "cpu"]
    r = subprocess.run(argv, capture_output=True, text=True, check=False,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    if r.returncode != 0:
        sys.exit(f"training the agreement model failed:\n{r.stderr[-2000:]}")
    foms = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"  trained on the synthetic genome: val PR-AUC {foms['val_pr_auc']:.4f}")
    return out / "best.pt"


def agreement(data: Path, ck: Path, args: argparse.Namespace) -> None:
    """Part 2: PR-AUC of fp32 and bf16 predictions of the held-out chromosomes."""
    import torch

    from tunelab.leopard.data import load_chromosomes, load_manifest
    from tunelab.leopard.metrics import MetricState
    from tunelab.leopard.model import Architecture, LeopardUNet
    from tunelab.leopard.predict import predict_chromosome
    from tunelab.leopard.runtime import bf16_capable, cpu_flags, prepare
    from tunelab.leopard.train import load_checkpoint

    c = load_checkpoint(ck)
    model = LeopardUNet(Architecture(**c["arch"]))
    model.load_state_dict(c["model"])
    m = load_manifest(data)
    chroms = m.chromosomes("val") + m.chromosomes("test")
    cs = load_chromosomes(m, chroms)
    auto = prepare(model, "cpu", "auto", "off", args.threads, 10240, 32)
    print(f"  runtime: {auto.runtime.summary()}")
    if auto.runtime.precision != "bf16" and not args.force_bf16:
        print("  bf16 not chosen on this CPU"
              + ("" if bf16_capable(cpu_flags()) else " (no native bf16)")
              + ": nothing to check")
        return
    auc = {}
    for prec in ("fp32", "bf16"):
        eng = prepare(model, "cpu", prec, "off", args.threads, 10240, 32)
        state = MetricState(torch.device("cpu"))
        for off, n in zip(cs.offsets.tolist(), cs.lengths.tolist(), strict=True):
            part = slice(off, off + n)
            probs = predict_chromosome(eng, cs.seq[part], cs.dnase[part], None, 10240,
                                       edge=1280)
            p = torch.from_numpy(probs).double().clamp(1e-9, 1 - 1e-9)
            state.update(torch.logit(p), torch.from_numpy(cs.label[part]))
        auc[prec] = state.compute()["pr_auc"]
    d = abs(auc["fp32"] - auc["bf16"])
    print(f"  PR-AUC over {', '.join(chroms)} ({cs.total_length:,} bp): fp32 {auc['fp32']:.5f}, "
          f"bf16 {auc['bf16']:.5f}, |difference| {d:.2e} "
          f"({'within' if d <= 1e-3 else 'OUTSIDE'} 1e-3)")


def genome_wide(data: Path, ck: Path, root: Path, args: argparse.Namespace) -> None:
    """Part 3: end-to-end prediction of the validation and test chromosomes."""
    from tunelab.leopard.data import load_manifest

    m = load_manifest(data)
    chroms = ",".join(m.chromosomes("val") + m.chromosomes("test"))
    plans = [("window 10240, edge 1280 (stride 7680)", ["--window", "10240", "--edge", "1280"]),
             ("window 40960, edge 1280 (stride 38400)", ["--window", "40960", "--edge", "1280",
                                                         "--batch-size", "8"]),
             ("window 163840, edge 1280 (stride 161280)", ["--window", "163840", "--edge",
                                                           "1280", "--batch-size", "2"]),
             # what --compile auto does on a genome-sized job (here forced: tens of Mbp are
             # too short to repay compiling, so only the compute column says what it gives)
             ("window 163840, edge 1280, compiled", ["--window", "163840", "--edge", "1280",
                                                     "--batch-size", "2", "--compile", "on"])]
    res: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.genome_rounds):
        for label, extra in plans:
            argv = [sys.executable, "-m", "tunelab.leopard", "predict", "--checkpoint",
                    str(ck), "--data", str(data), "--out", str(root / "pred.bw"), "--chroms",
                    chroms, "--device", "cpu", "--threads", str(args.threads), *extra]
            t = time.perf_counter()
            r = subprocess.run(argv, capture_output=True, text=True, check=False,
                               env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
            process_s = time.perf_counter() - t
            if r.returncode != 0:
                sys.exit(f"prediction failed:\n{r.stderr[-2000:]}")
            run = json.loads(r.stdout.strip().splitlines()[-1])
            run["bp_per_s_process"] = run["bp"] / process_s
            res.setdefault(label, []).append(run)
    print()
    print(f"genome-wide prediction, bigWig in -> bigWig out, {chroms}, {args.threads} threads "
          f"({args.genome_rounds} run(s) each, medians)")
    print("(Mbp/s: 'process' counts the whole command, Python's start and imports included; "
          "'end to end' from loading the model to the closed bigWig; 'compute' the forward "
          "passes only)")
    print(f"{'':<44} {'process':>8} {'end to end':>11} {'compute':>8}  precision, kernels")
    for label, runs in res.items():
        proc = _med([r["bp_per_s_process"] for r in runs])
        e2e = _med([r["bp_per_s_end_to_end"] for r in runs])
        comp = _med([r["bp_per_s"] for r in runs])
        print(f"  {label:<42} {proc / 1e6:8.2f} {e2e / 1e6:11.2f} {comp / 1e6:8.2f}  "
              f"{runs[0]['precision']}, {'compiled' if runs[0]['compiled'] else 'eager'} "
              f"({runs[0]['bp'] / 1e6:.1f} Mbp, process "
              f"{[round(r['bp_per_s_process'] / 1e6, 2) for r in runs]})")
    best = max(_med([r["bp_per_s_process"] for r in runs]) for runs in res.values())
    print(f"genome-wide target >= 1.5 Mbp/s end to end (whole process): {best / 1e6:.2f} "
          f"Mbp/s ({'met' if best >= 1.5e6 else 'MISSED'})")


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keras-python", default=os.environ.get("TUNELAB_KERAS_PYTHON"),
                    help="a Python with Keras 3 + TensorFlow (scripts/keras-venv.sh)")
    ap.add_argument("--keras-jit", choices=("auto", "on", "off"), default="auto",
                    help="Keras' jit_compile (XLA); auto is Keras' default")
    ap.add_argument("--window", type=int, default=10240)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--predict-batches", type=int, default=2)
    ap.add_argument("--train-steps", type=int, default=1)
    ap.add_argument("--compile", action="store_true",
                    help="also time torch.compile variants (minutes of compilation)")
    ap.add_argument("--force-bf16", action="store_true",
                    help="time bf16 even where the CPU lacks native bf16")
    ap.add_argument("--genome-mbp", type=float, default=20.0,
                    help="bp predicted genome-wide (validation + test chromosomes)")
    ap.add_argument("--genome-rounds", type=int, default=1)
    ap.add_argument("--agree-steps", type=int, default=40,
                    help="training steps per epoch (3 epochs) of the agreement model")
    ap.add_argument("--parts", default="1,2,3", help="which parts to run")
    ap.add_argument("--serve", choices=("keras", "tunelab", "tunelab-before"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve == "keras":
        return keras_server(args)
    if args.serve in ("tunelab", "tunelab-before"):
        return tunelab_server(args)
    parts = {p.strip() for p in args.parts.split(",")}
    print(f"leopard_vs_keras: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} "
          "at the start (other work on the machine slows every row; compare rows of one run)")
    if "1" in parts:
        print_fixed(fixed_shape(args), args)
    if parts & {"2", "3"}:
        with tempfile.TemporaryDirectory(prefix="leopard-vs-keras-") as tmp:
            root = Path(tmp)
            print()
            print(f"synthetic genome: 3 chromosomes, {args.genome_mbp / 2:.1f} Mbp each …",
                  flush=True)
            data = _synthetic(root, args.genome_mbp)
            ck = _train(data, root / "train", args)
            if "2" in parts:
                print("bf16 vs fp32 agreement:")
                agreement(data, ck, args)
            if "3" in parts:
                genome_wide(data, ck, root, args)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
