"""The ddp in-run fraction of bound under the load of a shared machine.

Runs the same ``tunelab bench ddp`` of real compute (default: ResNet-18, batch 8, 5 timed
steps on the CPU) ``--rounds`` times under three loads, interleaved round by round so that
whatever else the machine runs hits them alike:

* ``quiet``: nothing started beside it;
* ``hog``: ``--hogs`` busy loops (``python -c 'while 1: pass'``) through the whole run;
* ``hog at bound``: the same busy loops started only once the run's worker says it is
  measuring its bound (its status file, ``phase: bound``, after the timed steps), and stopped
  when the run ends: others take the cores during the GEMM but not during the steps.

With ``--src NAME=DIR`` (repeatable) every load runs once per source tree, interleaved in
the same rounds (``PYTHONPATH=DIR``), the first of each round taking turns: the code before
and after a change side by side. ``--loads`` keeps some of the loads.

Per run it prints the fraction of bound, the GEMM rate(s) the run timed, what the bound cost
(``bound_s``) and the load average; per load the fractions' range and how many exceeded 1;
``top -bn1`` is logged before every round. Every busy loop it starts is stopped before it
exits.

Usage::

    python benchmarks/ddp_bound_load.py --rounds 3
    python benchmarks/ddp_bound_load.py --src before=/tmp/old/src --src after=src
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

LOADS = ("quiet", "hog", "hog at bound")


def _hogs(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(n)]


def _stop(hogs: list[subprocess.Popen[bytes]]) -> None:
    for h in hogs:
        h.terminate()
    for h in hogs:
        h.wait()


def _phase(tmp: str) -> str | None:
    for path in glob.glob(os.path.join(tmp, "tunelab-ddp-*", "status", "rank-0.json")):
        try:
            with open(path, encoding="utf-8") as f:
                return str(json.loads(f.read().strip() or "{}").get("phase"))
        except (OSError, ValueError):
            return None
    return None


def run(argv: list[str], load: str, hogs: int, src: str | None) -> dict[str, Any]:
    """One benchmark run under ``load`` (the code of ``src``, or the importable one); its
    JSON record and the load average around it."""
    started: list[subprocess.Popen[bytes]] = _hogs(hogs) if load == "hog" else []
    with tempfile.TemporaryDirectory(prefix="bound-load-") as tmp:
        env = {**os.environ, "TMPDIR": tmp}
        if src is not None:
            env["PYTHONPATH"] = os.path.abspath(src)
        load0 = os.getloadavg()[0]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env)
        try:
            when: Callable[[], bool] = lambda: _phase(tmp) == "bound"  # noqa: E731
            while load == "hog at bound" and not started and proc.poll() is None:
                if when():
                    started = _hogs(hogs)
                time.sleep(0.02)
            out, err = proc.communicate(timeout=600)
        finally:
            _stop(started)
    if proc.returncode != 0:
        raise SystemExit(f"the run failed ({proc.returncode}): {err.strip()[-400:]}")
    record = json.loads(out.strip().splitlines()[-1])
    record["load_before"], record["load_after"] = load0, os.getloadavg()[0]
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch", default="8")
    parser.add_argument("--src", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--loads", nargs="+", choices=LOADS, default=list(LOADS))
    args = parser.parse_args()
    sources: list[tuple[str, str | None]] = [
        (s.split("=", 1)[0], s.split("=", 1)[1]) for s in args.src] or [("", None)]
    argv = [sys.executable, "-m", "tunelab", "bench", "ddp", "--model", args.model,
            "-b", args.batch, "--steps", "5", "--warmup", "2", "--device", "cpu"]
    found: dict[str, list[dict[str, Any]]] = {
        f"{name} {load}".strip(): [] for name, _ in sources for load in args.loads}
    for r in range(args.rounds):
        print(f"--- round {r + 1}: top -bn1 | head -12", flush=True)
        top = subprocess.run(["top", "-bn1"], capture_output=True, text=True).stdout
        print("\n".join(top.splitlines()[:12]), flush=True)
        turn = sources[r % len(sources):] + sources[:r % len(sources)]  # who goes first
        for load, (name, src) in ((ld, s) for ld in args.loads for s in turn):
            rec = run(argv, load, args.hogs, src)
            load = f"{name} {load}".strip()
            found[load].append(rec)
            gemm = ", ".join(f"{k.split('_')[1]} {rec[k] / 1e9:.0f}" for k in
                             ("gemm_before_flops_per_s", "gemm_after_flops_per_s") if k in rec)
            print(f"{load:>20}: fraction {rec.get('bound_fraction', float('nan')):.2f}  "
                  f"{rec['throughput']:.2f} {rec['unit']}/s  achieved "
                  f"{rec.get('achieved_flops_per_s', 0) / 1e9:.0f} GFLOP/s  GEMM "
                  f"{rec.get('gemm_flops_per_s', 0) / 1e9:.0f} GFLOP/s"
                  f"{f' ({gemm})' if gemm else ''}  bound_s {rec.get('bound_s', 0):.2f}  "
                  f"load {rec['load_before']:.2f}->{rec['load_after']:.2f}", flush=True)
    print("--- per load: fractions, lowest-highest, above 1, mean bound_s")
    for load, recs in found.items():
        fr = [r["bound_fraction"] for r in recs if "bound_fraction" in r]
        cost = sum(r.get("bound_s", 0.0) for r in recs) / max(len(recs), 1)
        print(f"{load:>20}: {' '.join(f'{f:.2f}' for f in fr)}  "
              f"{min(fr):.2f}-{max(fr):.2f}  {sum(f > 1 for f in fr)} of {len(fr)} above 1  "
              f"bound_s {cost:.2f}")


if __name__ == "__main__":
    main()
