"""Per-run overhead of the launchers, side by side: ``local``, ``slurm per-run``, ``slurm pack``.

Every mode runs the same study — N runs of a one-second command (``sleep 1``) — through the
whole runner (prepare, launch, collect, parse, one SQLite transaction per run). Slurm runs on
a one-node virtual cluster started here (root; real munge, slurmctld, slurmd). The modes are
alternated round by round so that load from elsewhere spreads over all three; the overhead
of a mode is (wall-clock of its runs − N × the command's own second) / N, summed over rounds.
Per-run mode keeps one job in the queue at a time (``max_queued: 1``), as the local launcher
runs one command at a time, so the figures compare launch costs, not parallelism.

    .venv/bin/python benchmarks/launcher_overhead.py [--runs 100] [--rounds 5] [--poll 0.5]

Target (issue 10): ``pack`` within 2x of ``local``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tunelab.cluster.slurm import VirtualCluster, slurm_unavailable_reason
from tunelab.execute.runner import run_study
from tunelab.execute.study import prepare_study
from tunelab.spec import StudySpec

SLEEP = shutil.which("sleep") or "/bin/sleep"
MODES = {
    "local": {"type": "local"},
    "slurm per-run": {"type": "slurm", "mode": "per-run", "max_queued": 1},
    "slurm pack": {"type": "slurm", "mode": "pack"},
}


def one_round(mode: str, n: int, seconds: float, poll: float, workdir: Path) -> float:
    """Wall-clock seconds of a study of ``n`` runs of ``sleep seconds`` in ``mode``."""
    launcher = dict(MODES[mode])
    if launcher["type"] != "local":
        launcher["poll_interval"] = poll
    spec = StudySpec.from_mapping({
        "name": "overhead",
        "workload": {"name": "command", "options": {"argv": [SLEEP, str(seconds)]}},
        "parameters": {"i": {"type": "int", "min": 1, "max": n}},
        "repeats": 1,
        "timeout": 60,
        "objective": {"fom": "wall_s"},
        "launcher": launcher,
    })
    study = prepare_study(spec)
    start = time.perf_counter()
    outcome = run_study(study, workdir)
    wall = time.perf_counter() - start
    if outcome.counts != {"ok": n}:
        raise SystemExit(f"{mode}: not every run succeeded: {outcome.counts}")
    return wall


def main() -> int:
    """Print the per-run overhead of each mode and the ratios to ``local``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="runs per mode in all")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one run")
    parser.add_argument("--poll", type=float, default=0.5, help="Slurm poll interval, s")
    args = parser.parse_args()
    reason = slurm_unavailable_reason()
    if reason is not None:
        print(f"launcher_overhead: cannot run: {reason}", file=sys.stderr)
        return 2
    per_round = max(1, args.runs // args.rounds)
    totals = dict.fromkeys(MODES, 0.0)
    with VirtualCluster.start(1) as cluster, \
            tempfile.TemporaryDirectory(prefix="tunelab-overhead-") as tmp:
        os.environ.update(cluster.env)
        for r in range(args.rounds):
            for i, mode in enumerate(MODES):
                totals[mode] += one_round(mode, per_round, args.seconds, args.poll,
                                          Path(tmp) / f"r{r}-{i}")
    n = per_round * args.rounds
    load = os.getloadavg()[0]
    print(f"{n} runs of {args.seconds:g} s per mode, {args.rounds} alternating rounds, "
          f"Slurm poll {args.poll:g} s, 1 virtual node, load average {load:.1f} "
          f"on {os.cpu_count()} cores")
    local = (totals["local"] - n * args.seconds) / n
    print(f"{'mode':<15} {'wall s':>8} {'overhead/run s':>15} {'x local':>8}")
    for mode, wall in totals.items():
        overhead = (wall - n * args.seconds) / n
        ratio = overhead / local if local > 0 else float("nan")
        print(f"{mode:<15} {wall:8.1f} {overhead:15.3f} {ratio:8.2f}")
    pack = (totals["slurm pack"] - n * args.seconds) / n
    verdict = "met" if pack <= 2 * local else "missed"
    print(f"target pack within 2x of local: {verdict} ({pack / local:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
