"""The up-front memory estimate of a ``tunelab bench ddp`` worker against its real peak RSS.

For each ``MODEL:SIZE:LOCAL_BATCH[:WORKERS]`` given, runs ``tunelab bench ddp`` (1 thread per
worker, 3 steps, 1 of them warm-up) in a child process of its own and prints a table row:
the peak RSS (the largest ``ru_maxrss`` of the processes it waited for: the worker with the
most, torchrun passes its children's on) and :func:`tunelab.bench.ddp.memory.worker_bytes`
with its ratio to the peak (docs/workloads/ddp.md, "Memory"). Each case runs in a fresh
process, so one case's peak never hides another's.

Usage::

    python benchmarks/ddp_memory_estimate.py resnet18:112:8 resnet18:112:128 leopard:512:16
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys


def _case(model: str, size: int, batch: int, workers: int) -> str:
    """One table row (run in a child of its own: see :func:`main`)."""
    from tunelab.bench.ddp.config import DDPConfig
    from tunelab.bench.ddp.memory import worker_bytes

    resnet = model.startswith("resnet")
    kw = {"image_size": size} if resnet else {"window": size}
    cfg = DDPConfig(model=model, workers=workers, batch_size=batch * workers, **kw).validate()
    est = worker_bytes(cfg)
    cmd = [sys.executable, "-m", "tunelab", "bench", "ddp", "--model", model,
           "--image-size" if resnet else "--window", str(size), "--workers", str(workers),
           "-b", str(batch * workers), "--steps", "3", "--warmup", "1", "--threads", "1"]
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if run.returncode:
        return f"| {model} | {size} | {batch} | {workers} | failed ({run.returncode}) | |"
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return (f"| {model} | {size} | {batch} | {workers} | {peak / 1e9:.3f} | "
            f"{est / 1e9:.3f} ({est / peak:.2f}x) |")


def main() -> None:
    """Print the table, one child process per case."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+", help="MODEL:SIZE:LOCAL_BATCH[:WORKERS]")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        model, size, batch, *rest = args.cases[0].split(":")
        print(_case(model, int(size), int(batch), int(rest[0]) if rest else 1), flush=True)
        return
    print("| model | size | local batch | workers | peak RSS GB | estimate GB |")
    print("|---|---:|---:|---:|---:|---:|", flush=True)
    for case in args.cases:
        subprocess.run([sys.executable, __file__, "--one", case], check=False)


if __name__ == "__main__":
    main()
