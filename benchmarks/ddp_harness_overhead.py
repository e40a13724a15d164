"""The harness's own overhead at a 50 ms emulated step on 2 workers (issue 15, item 5).

Runs ``tunelab bench ddp`` with emulated compute (``--compute emulate:0.05``, the Leopard
U-Net's 1.9 MB of gradients, so the all-reduce is small and the step is nearly all emulated
compute) from three sources, alternating round by round so a change of load hits them alike:

* ``synthetic``: one batch made once (no data loader at all): the loop's own cost;
* ``memory``, ``--loader-workers 0``: batches assembled from RAM in the worker;
* ``memory``, ``--loader-workers 2``: the same through two loader processes (shared-memory
  hand-over).

It prints, per source, the median over the rounds of AU (busy / step time), the data wait
and the harness overhead per step (the step minus data wait minus busy: the loop, its
status file), and each memory source's AU as a ratio of synthetic's measured in the same
rounds — nothing subtracted. The target: AU >= 0.99 with the memory source.

Usage::

    python benchmarks/ddp_harness_overhead.py --rounds 3 --steps 60
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

SOURCES = {
    "synthetic": ["--data", "synthetic"],
    "memory, 0 loaders": ["--data", "memory", "--loader-workers", "0"],
    "memory, 2 loaders": ["--data", "memory", "--loader-workers", "2"],
}


def run(extra: list[str], steps: int) -> dict[str, float]:
    """One benchmark run; its JSON line."""
    argv = [sys.executable, "-m", "tunelab.bench.ddp", "--model", "leopard", "--window", "256",
            "--compute", "emulate:0.05", "--workers", "2", "-b", "8", "--steps", str(steps),
            "--warmup", "3", *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit(f"benchmark failed: {proc.stderr.strip().splitlines()[-1:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> int:
    """Measure and print."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    load = os.getloadavg()
    results: dict[str, list[dict[str, float]]] = {name: [] for name in SOURCES}
    for r in range(args.rounds):
        for name, extra in SOURCES.items():
            results[name].append(run(extra, args.steps))
            print(f"round {r + 1}: {name}: AU {results[name][-1]['au']:.4f}", file=sys.stderr)
    print(f"2 workers, emulated 50 ms step, Leopard (1,896,068 gradient bytes), {args.steps} "
          f"timed steps, {args.rounds} rounds; load average at start {load[0]:.1f} on "
          f"{os.cpu_count()} cores")
    print(f"{'source':<20} {'AU':>8} {'data wait ms':>13} {'harness ms':>11} {'step ms':>9} "
          f"{'AU / synthetic':>15}")
    base = [r["au"] for r in results["synthetic"]]
    for name, rs in results.items():
        au = statistics.median(r["au"] for r in rs)
        ratio = statistics.median(r["au"] / b for r, b in zip(rs, base, strict=True))
        print(f"{name:<20} {au:>8.4f} {statistics.median(r['data_s'] for r in rs) * 1e3:>13.3f}"
              f" {statistics.median(r['overhead_s'] for r in rs) * 1e3:>11.3f}"
              f" {statistics.median(r['step_s'] for r in rs) * 1e3:>9.2f} {ratio:>15.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
