#!/usr/bin/env python3
"""The DDP benchmark on one GPU (issue 27): every figure of the GPU check in one run.

Sections, most important first, each printed as soon as it is measured:

1. **device**: the GPU (or CPU), torch, torchvision, cores, NVML energy or not, GPU decode
   or the one line that refuses it;
2. **calibrate vs bench**: ``tunelab bench ddp calibrate`` and a synthetic ``bench ddp`` run of
   ResNet-50 at the same batch on the same device (one training step in both: the ratio
   should lie within 5 %); then the GPU decoder alone (nvJPEG and the crops on a batch held
   in memory): the most images/s ``--decode gpu`` can feed;
3. **storage from JPEG files**: ``make-data`` (``--samples`` ImageNet-like JPEGs), then
   ResNet-50 AMP from the files, page cache warm and cold, ``--decode on|gpu|off`` x loader
   processes per worker: AU, images/s, MB/s, data wait, GPU energy (J per image, mean W);
4. **profile measured here vs MLPerf Storage's**: calibrate ResNet-50 at batch 400 and the
   3-D U-Net at batch 7 (MLPerf Storage's H100 figures: 0.224 s and 0.323 s).

The last line is one JSON object (``"benchmark": "ddp_gpu"``) with every row. ``--budget``
seconds (data generation included) stops the remaining runs early and says how far each
section got; the storage runs stop first, so that the profiles keep their time.
The exit status is 1 when a run failed (a refusal — GPU decode without a GPU — is a
figure, not a failure). ``--tiny --device cpu`` runs every section at toy sizes on the CPU
(the test suite does, so the script never breaks between GPU sessions).

    python benchmarks/ddp_gpu.py                     # on the GPU machine: about 7 minutes
    python benchmarks/ddp_gpu.py --tiny --device cpu # CI
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MLPERF = {"resnet50/b400": 0.224, "unet3d/b7": 0.323}  # MLPerf Storage's H100 step, s


class Budget:
    """Seconds left of ``--budget``; counts runs done and skipped per section."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.done: dict[str, int] = {}
        self.skipped: dict[str, int] = {}

    def left(self) -> float:
        return self.end - time.monotonic()

    def allow(self, section: str, need: float) -> bool:
        ok = self.left() >= need
        table = self.done if ok else self.skipped
        table[section] = table.get(section, 0) + 1
        return ok

    def report(self, section: str) -> str:
        done, skipped = self.done.get(section, 0), self.skipped.get(section, 0)
        if not skipped:
            return f"{section}: all {done} run(s) done"
        return (f"{section}: {done} of {done + skipped} run(s) done; {skipped} skipped for "
                f"--budget ({max(0.0, self.left()):.0f} s left)")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = f"{ROOT / 'src'}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def tool(args: list[str], timeout: float) -> tuple[int, str, str]:
    """``python -m tunelab.bench.ddp ARGS``: exit status, stdout, stderr's last line."""
    try:
        p = subprocess.run([sys.executable, "-m", "tunelab.bench.ddp", *args],
                           capture_output=True, text=True, timeout=max(5.0, timeout),
                           env=_env())
    except subprocess.TimeoutExpired:
        return 124, "", f"stopped after {timeout:.0f} s (--budget)"
    return p.returncode, p.stdout, (p.stderr.strip().splitlines() or [""])[-1]


def bench(args: list[str], timeout: float) -> dict[str, Any]:
    """One benchmark run's JSON line, or ``{"error": line}``."""
    code, out, err = tool(args, timeout)
    if code != 0:
        return {"error": err[:200]}
    return dict(json.loads(out.strip().splitlines()[-1]))


def calibrate(model: str, batch: int, size: int, dev: list[str], out: Path,
              timeout: float, steps: int) -> dict[str, Any]:
    """``calibrate``: the profile's step seconds, precision and memory format."""
    code, text, err = tool(["calibrate", "--model", model, "--batch", str(batch),
                            "--image-size", str(size), "--steps", str(steps), "--warmup", "3",
                            "--patch", "64" if size < 64 else "128", "--output", str(out),
                            *dev], timeout)
    if code != 0:
        return {"error": err[:200]}
    sys.path.insert(0, str(ROOT / "src"))
    from tunelab.bench.ddp.profiles import load_profiles

    name = text.strip().splitlines()[-1].rsplit("emulate:", 1)[-1]
    (p,) = [p for p in load_profiles(out) if p.name == name]
    return {"step_s": p.step_s, "precision": p.precision, "memory_format": p.memory_format,
            "name": p.name}


def decode_alone(data: Path, batch: int, size: int, device: str = "cuda",
                 batches: int = 8) -> dict[str, Any]:
    """Images/s of ``gpudecode.decode_batch`` (one batched nvJPEG call, the crops) on
    ``batch`` of the data set's JPEGs held in memory, after two warm-up batches."""
    import torch

    from tunelab.bench.ddp.gpudecode import decode_batch
    from tunelab.bench.ddp.samples import Encoded

    paths = sorted(data.rglob("*.JPEG"))[:batch]
    files = [torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8) for p in paths]
    encoded = Encoded.join(files)
    dev = torch.device(device)
    for _ in range(2):
        decode_batch(encoded, size, dev)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t = time.perf_counter()
    for _ in range(batches):
        out = decode_batch(encoded, size, dev)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    assert out.shape == (len(files), 3, size, size)
    return {"section": "decode alone", "batch": len(files), "batches": batches,
            "images_per_s": batches * len(files) / (time.perf_counter() - t)}


def main() -> int:
    """Measure and print."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--budget", type=float, default=450.0,
                    help="seconds for everything, data generation included")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "ddp-gpu")
    ap.add_argument("--samples", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--loaders", default="8,4,12", help="loader processes per worker; the "
                                                       "first is also used cold")
    ap.add_argument("--tiny", action="store_true", help="toy sizes (CI on the CPU)")
    a = ap.parse_args()
    budget = Budget(a.budget)
    t_start = time.monotonic()
    if a.tiny:
        model, size, batch, samples, steps, scale = "resnet18", 32, 4, 24, 2, 0.05
        loaders = [1]
        profiles = [("resnet18", 4, 32, None)]
    else:
        model, size, batch, samples, steps, scale = "resnet50", 224, a.batch, a.samples, 10, 1.0
        loaders = [int(x) for x in a.loaders.split(",")]
        profiles = [("resnet50", 400, 224, "resnet50/b400"), ("unet3d", 7, 224, "unet3d/b7")]
    dev = ["--device", a.device] + (["--amp", "on"] if a.device == "cuda" else [])
    a.dir.mkdir(parents=True, exist_ok=True)
    acc = a.dir / "accelerators.yaml"
    rows: list[dict[str, Any]] = []

    # 1. device -------------------------------------------------------------------------
    import torch

    sys.path.insert(0, str(ROOT / "src"))
    from tunelab.bench.ddp.energy import open_meter
    from tunelab.bench.ddp.gpudecode import gpu_decode_unavailable

    cuda = a.device == "cuda" and torch.cuda.is_available()
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    try:
        import torchvision

        tv = torchvision.__version__
    except Exception as exc:  # the CPU wheel's failed import: the benchmark copes with it
        tv = f"({type(exc).__name__})"
    no_decode = gpu_decode_unavailable()
    energy = "NVML energy: " + ("yes" if cuda and open_meter(0) is not None else "no")
    print(f"device: {name}; torch {torch.__version__}, torchvision {tv}, {os.cpu_count()} "
          f"cores; {energy}; GPU decode: {'yes' if not no_decode else 'refused: ' + no_decode}",
          flush=True)

    # data (in the budget) ----------------------------------------------------------------
    data = a.dir / f"jpeg-{samples}-{scale:g}"
    if not (data / "tunelab-dataset.json").is_file():
        code, _, err = tool(["make-data", str(data), "--like", "imagenet", "--samples",
                             str(samples), "--sample-scale", str(scale)], budget.left())
        if code != 0:
            print(f"make-data failed: {err}")
            return 1
    print(f"data: {samples} JPEGs in {data}, ready after {time.monotonic() - t_start:.0f} s",
          flush=True)

    # 2. calibrate vs bench ---------------------------------------------------------------
    print(f"calibrate vs bench ({model}, batch {batch}, {a.device}):", flush=True)
    if budget.allow("calibrate vs bench", 60):
        cal = calibrate(model, batch, size, dev, acc, budget.left(), 10 if not a.tiny else 2)
        syn = bench(["--model", model, "--image-size", str(size), "-b", str(batch),
                     "--steps", str(20 if not a.tiny else steps), "--warmup", "3", *dev],
                    budget.left())
        row: dict[str, Any] = {"section": "calibrate", "model": model, "batch": batch}
        if "error" in cal or "error" in syn:
            row["error"] = cal.get("error") or syn.get("error")
            print(f"  error: {row['error']}")
        else:
            cal_ips = batch / cal["step_s"]
            row.update(calibrate_ips=cal_ips, bench_ips=syn["throughput"],
                       ratio=syn["throughput"] / cal_ips, precision=cal["precision"],
                       memory_format=cal["memory_format"])
            print(f"  calibrate {cal_ips:,.0f} images/s ({cal['step_s']:.4f} s, "
                  f"{cal['precision']}, {cal['memory_format']}); bench {syn['throughput']:,.0f}"
                  f" images/s (AU {syn['au']:.1%}); bench / calibrate {row['ratio']:.3f}",
                  flush=True)
        rows.append(row)
    print(f"  ({budget.report('calibrate vs bench')})")

    # 2b. the GPU decoder alone: the rate --decode gpu can feed at most ---------------------
    if cuda and not no_decode and budget.allow("decode alone", 20):
        rows.append(decode_alone(data, batch, size))
        r = rows[-1]
        print(f"GPU decode alone (nvJPEG + crop, batch {batch}, files in memory): "
              f"{r['images_per_s']:,.0f} images/s over {r['batches']} batches", flush=True)

    # 3. storage from JPEG files ----------------------------------------------------------
    print(f"storage from JPEG files ({model}, batch {batch}, 1 worker, {steps} steps):")
    print(f"  {'cache':<5} {'decode':<6} {'loaders':>7} {'AU':>7} {'images/s':>9} {'MB/s':>8} "
          f"{'wait ms':>8} {'J/image':>8} {'mean W':>7}", flush=True)
    # the first loader count warm, then cold, then the other counts warm: a short budget
    # keeps both caches' rows of the first count
    decodes = ("gpu", "on", "off")
    runs = [("warm", d, loaders[0]) for d in decodes]
    runs += [("cold", d, loaders[0]) for d in (("gpu", "off") if a.tiny else decodes)]
    runs += [("warm", d, n) for n in loaders[1:] for d in decodes]
    # the profiles (section 4) keep their time: storage rows are the ones a short budget cuts
    per_profile = 40 if not a.tiny else 5
    for cache, decode, n in runs:
        label = f"  {cache:<5} {decode:<6} {n:>7}"
        if decode == "gpu" and (no_decode or not cuda):
            print(f"{label}  decode gpu refused: {no_decode or 'not a CUDA device'}")
            rows.append({"section": "storage", "cache": cache, "decode": decode, "loaders": n,
                         "error": f"refused: {no_decode}"})
            continue
        if not budget.allow("storage", (25 if not a.tiny else 5)
                            + per_profile * len(profiles)):
            continue
        r = bench(["--model", model, "--image-size", str(size), "-b", str(batch), "--steps",
                   str(steps), "--warmup", "2", "--data", f"files:{data}", "--cache", cache,
                   "--decode", decode, "--loader-workers", str(n), *dev], budget.left())
        row = {"section": "storage", "cache": cache, "decode": decode, "loaders": n}
        if "error" in r:
            row["error"] = r["error"]
            print(f"{label}  error: {r['error']}", flush=True)
        else:
            row.update(au=r["au"], images_per_s=r["throughput"], MBps=r["read_MBps"],
                       wait_ms=r["data_s"] * 1e3, J_per_image=r.get("energy_J_per_sample"),
                       W=r.get("power_W"), input_bound=r["input_bound"])
            jpi = f"{row['J_per_image']:.3f}" if row["J_per_image"] else "-"
            watts = f"{row['W']:.0f}" if row["W"] else "-"
            print(f"{label} {r['au']:>7.1%} {r['throughput']:>9,.0f} {r['read_MBps']:>8,.1f} "
                  f"{row['wait_ms']:>8.1f} {jpi:>8} {watts:>7}", flush=True)
        rows.append(row)
    print(f"  ({budget.report('storage')})")

    # 4. profiles -------------------------------------------------------------------------
    print("profile measured here vs MLPerf Storage's (H100):")
    for m, b, s, key in profiles:
        if not budget.allow("profiles", per_profile):
            continue
        cal = calibrate(m, b, s, dev, acc, budget.left(), 10 if not a.tiny else 2)
        row = {"section": "profile", "model": m, "batch": b}
        if "error" in cal:
            row["error"] = cal["error"]
            print(f"  {m} b{b}: error: {cal['error']}")
        else:
            ref = MLPERF.get(key) if key else None
            row.update(step_s=cal["step_s"], mlperf_s=ref, precision=cal["precision"])
            vs = f"; MLPerf Storage {ref:.3f} s (here / MLPerf {cal['step_s'] / ref:.2f})" \
                if ref else "; no MLPerf Storage figure"
            print(f"  {cal['name']}: {cal['step_s']:.4f} s per step{vs}", flush=True)
        rows.append(row)
    print(f"  ({budget.report('profiles')})")
    print(f"total {time.monotonic() - t_start:.0f} s of a {a.budget:.0f} s budget")
    print(json.dumps({"benchmark": "ddp_gpu", "device": name, "rows": rows}))
    # a refusal (GPU decode without a GPU) is a figure; any other error fails the check
    return 1 if any(not str(r.get("error", "refused")).startswith("refused") for r in rows) \
        else 0


if __name__ == "__main__":
    raise SystemExit(main())
