"""tunelab's per-run overhead against a bare subprocess loop, measured side by side.

Both run the same trivial command (``/bin/true``) N times; tunelab through the full runner
(argv build, process group, output capture to files, parsing, one SQLite transaction per run,
progress callback). The two are alternated over several rounds and the medians compared.

    .venv/bin/python benchmarks/overhead.py [--runs 200] [--rounds 5]

Target (issue 2): under 15 ms of overhead per run.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from tunelab.execute.runner import run_study
from tunelab.execute.study import prepare_study
from tunelab.spec import StudySpec

TRUE = shutil.which("true") or "/bin/true"


def bare_loop(n: int) -> float:
    """Seconds per run of a plain subprocess loop."""
    start = time.perf_counter()
    for _ in range(n):
        subprocess.run([TRUE], check=True)
    return (time.perf_counter() - start) / n


def tunelab_loop(n: int, workdir: Path) -> tuple[float, float]:
    """(seconds per run inside the study loop, fixed start-up seconds) of tunelab."""
    spec = StudySpec.from_mapping({
        "name": "overhead",
        "workload": {"name": "command", "options": {"argv": [TRUE, "{i}"]}},
        "parameters": {"i": {"type": "int", "min": 1, "max": n}},
        "repeats": 1,
        "objective": {"fom": "wall_s"},
    })
    marks: dict[str, float] = {}
    t0 = time.perf_counter()
    study = prepare_study(spec)
    run_study(study, workdir, on_start=lambda done, total: marks.setdefault(
        "loop", time.perf_counter()))
    end = time.perf_counter()
    return (end - marks["loop"]) / n, marks["loop"] - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    bare, tl, startup = [], [], []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            bare.append(bare_loop(args.runs))
            per_run, fixed = tunelab_loop(args.runs, Path(tmp) / f"study{r}")
            tl.append(per_run)
            startup.append(fixed)
    b, t = statistics.median(bare), statistics.median(tl)
    print(f"runs per loop: {args.runs}, rounds: {args.rounds} (medians)")
    print(f"bare subprocess loop : {b * 1e3:8.2f} ms/run")
    print(f"tunelab runner loop  : {t * 1e3:8.2f} ms/run")
    print(f"overhead per run     : {(t - b) * 1e3:8.2f} ms (target < 15 ms)")
    print(f"ratio tunelab / bare : {t / b:8.2f}")
    print(f"one-off start-up     : {statistics.median(startup) * 1e3:8.1f} ms "
          "(study preparation and machine snapshot)")


if __name__ == "__main__":
    main()
