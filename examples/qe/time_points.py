"""Time a few pw.x configurations through the qe workload, without the study engine.

A quick check of what a machine gives before starting a study, and the source of the timings
quoted in docs/workloads/qe.md::

    .venv/bin/python examples/qe/time_points.py examples/qe-si.yaml --repeats 3 \
        '{"np":1,"npool":1,"ndiag":1}' '{"np":2,"npool":2,"ndiag":1}'

Each point runs ``repeats`` times, one after the other, in a fresh directory; the table gives
pw.x's own wall time (median and range), the launch-to-exit time and the total energy.
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

import yaml

from tunelab.errors import TunelabError
from tunelab.workload import RunContext
from tunelab.workloads.qe import QEOptions, QEWorkload


def main() -> int:
    """Run the points given on the command line and print one line per point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path, help="a qe study file (for its workload options)")
    parser.add_argument("points", nargs="+", help='points as JSON, e.g. \'{"np": 2}\'')
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    study = yaml.safe_load(args.study.read_text())
    workload = QEWorkload(QEOptions(**study["workload"]["options"]), args.study.resolve())
    workload.check()
    cores = os.cpu_count() or 1
    print(f"# {args.study} on {cores} cores; nk={workload.constants()['nk']}")
    print(f"{'point':44s} {'pw.x wall s (median, min-max)':32s} {'launch-to-exit s':>16s}"
          f"  total energy Ry")
    start_all = time.perf_counter()
    for text in args.points:
        values = json.loads(text)
        walls, elapsed, energy = [], [], float("nan")
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="tunelab-qe-time-") as tmp:
                ctx = RunContext(values, {}, Path(tmp), Path(tmp), args.study, cores)
                cmd = workload.command(ctx)
                t0 = time.perf_counter()
                proc = subprocess.run(list(cmd.argv), cwd=cmd.cwd, capture_output=True,
                                      env={**os.environ, **cmd.env}, text=True, check=False)
                elapsed.append(time.perf_counter() - t0)
                try:
                    foms = workload.parse(proc.stdout, proc.stderr, ctx.run_dir)
                except TunelabError as exc:
                    print(f"{text:44s} failed: {exc}")
                    break
                walls.append(foms["pwscf_wall_s"])
                energy = foms["total_energy_ry"]
        if walls:
            spread = f"{statistics.median(walls):.2f} ({min(walls):.2f}-{max(walls):.2f})"
            print(f"{text:44s} {spread:32s} {statistics.median(elapsed):16.2f}  {energy:.8f}")
    print(f"# total {time.perf_counter() - start_all:.1f} s for "
          f"{len(args.points)} points x {args.repeats} repeats")
    return 0


if __name__ == "__main__":
    sys.exit(main())
