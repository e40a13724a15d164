"""A real study interrupted inside a round and resumed on a slower machine: its verdicts
paired by round (as before: the runs table without ``session`` and ``rerun``) and paired
within sessions (now), side by side from the same store.

Five equal points (``command``: a sleep of 250 ms times a factor read from a file, the
"machine speed"), 4 rounds; ``tunelab run`` gets SIGINT (what Ctrl-C sends) once ``--after``
runs have started, the factor becomes ``1 + --slower``, and the same command resumes.

    PYTHONPATH=src .venv/bin/python benchmarks/split_round.py [--after 12] [--slower 0.15]
"""

from __future__ import annotations

import argparse
import math
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tunelab.report.load import load_results
from tunelab.report.results import results_from_frame

PROGRAM = """\
import pathlib, sys, time
factor = float((pathlib.Path(__file__).parent / "factor").read_text())
t = time.perf_counter()
time.sleep(0.25 * factor)
print("x=%s t=%f" % (sys.argv[1], time.perf_counter() - t))
"""

STUDY = """\
name: split-round
workload:
  name: command
  options:
    argv: [{python}, {program}, "{{x}}"]
    foms: {{t: 't=(?P<value>[0-9.]+)'}}
parameters:
  x: [1, 2, 3, 4, 5]
repeats: 4
baseline: {{x: 1}}
objective: {{fom: t, direction: minimize}}
"""


def run(study: Path, directory: Path, stop_after: int | None) -> int:
    """``tunelab run``; with ``stop_after``, SIGINT once that many runs have finished."""
    argv = [sys.executable, "-m", "tunelab", "run", str(study), "--dir", str(directory), "-q"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if stop_after is not None:
        while proc.poll() is None:  # a run's directory is made as it starts
            if len(list(directory.glob("runs/*/r*"))) > stop_after:
                proc.send_signal(signal.SIGINT)
                break
            time.sleep(0.01)
    return proc.wait(timeout=600)


def main() -> None:
    """Run the study in two sessions and print both ways of pairing it."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--after", type=int, default=12, help="runs before the interruption")
    parser.add_argument("--slower", type=float, default=0.15,
                        help="how much slower the machine is after it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="split-round-") as tmp:
        base = Path(tmp)
        (base / "slow.py").write_text(PROGRAM)
        (base / "factor").write_text("1.0")
        study = base / "study.yaml"
        study.write_text(STUDY.format(python=sys.executable, program=base / "slow.py"))
        first = run(study, base / "d", args.after)
        (base / "factor").write_text(str(1 + args.slower))
        second = run(study, base / "d", None)
        results = load_results(base / "d")
        runs = results.runs
        print(f"first session: exit {first}, {int((runs['session'] == 1).sum())} runs; "
              f"resumed {1 + args.slower:g}x slower: exit {second}, "
              f"{int((runs['session'] == 2).sum())} runs")
        before = results_from_frame(runs.drop(columns=["session", "rerun"]),
                                    results.objective, results.baseline)
        for label, res in (("paired by round (before)", before), ("paired now", results)):
            noise = res.noise
            print(f"{label}: noise {noise.sd_log:.1%}, " if noise else f"{label}: ", end="")
            print("; ".join(
                f"{pc.summary.params['x']}: {pc.comparison.speedup:.3f}x "
                f"[{pc.comparison.ci_low:.3f}, {pc.comparison.ci_high:.3f}] "
                f"{pc.comparison.verdict}" for pc in res.comparisons
                if not pc.is_baseline and math.isfinite(pc.comparison.speedup)))
        print(*[n for n in results.trust if "paired." in n] or ["(no round split)"])


if __name__ == "__main__":
    main()
