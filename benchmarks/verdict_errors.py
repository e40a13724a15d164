"""How often tunelab's verdicts are wrong, how often they find a real change, and how well the
noise watch tells disturbed runs from quiet ones: seeded simulations through the real
``tunelab.stats`` functions, and real runs on this machine's cores.

1. A/A, per study: a baseline and 20 points all equal to it, n rounds, 5 % noise (normal,
   lognormal, Student t with 3 df), without and with drift (the machine slows 10 % over the
   study, run by run in the interleaved order), fixed repeats and ``repeats: auto`` — the
   share of studies with *any* false faster/slower verdict and its 95 % upper bound (Wilson).
   Beside it, for reference: one point against the baseline, and 20 points of unequal noise.
2. Power: the same study with one point truly 5 % or 10 % faster, at 2 % or 5 % noise, with
   n = 3, 5, 10 fixed rounds and with ``repeats: auto`` (3 to 10 rounds): the share of
   studies calling that point faster, the median minimum detectable change the study
   reported for it, and (auto) the mean rounds per point it ran.
3. A busy machine: a bounded load started by the benchmark on the cores the runs may use
   (busy processes pinned to each core, killed at the end), or, with the runs pinned to one
   core, one process streaming memory on the cores sharing its last-level cache, or the runs
   held back with no one else on their cores (a CPU quota of their cgroup, where one can be
   made; stopped and continued by signals); a small
   real study run through the real runner and noise watch — the share of runs flagged
   disturbed; then runs on a
   quiet machine (each started after ``--wait-quiet``'s wait for quiet cores, if the machine
   gets quiet within the budget) — the share flagged.

4. Rounds not made side by side (printed after 2): a study interrupted inside a round and
   resumed on a machine 15 % slower, batch allocations that end every 7 runs, runs made
   again by ``--rerun-disturbed`` after the machine drifted 10 % — the share of studies of
   equal points with any false verdict, the median |log speedup| and interval width of the
   equal points, and the power for a 5 % change, paired by round as before and within
   sessions and rerun passes as now, on the same studies.

    .venv/bin/python benchmarks/verdict_errors.py [--studies 2000] [--power-studies 500]
        [--busy-runs 20] [--quiet-runs 50] [--quiet-budget 300] [--skip-busy]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from statistics import median

import numpy as np
import pandas as pd

from tunelab.stats import SequentialPlan, Verdict, compare_to_baseline, still_undecided

CALLS = (Verdict.BETTER, Verdict.WORSE)
BASE = json.dumps({"p": 0})
PLAN = SequentialPlan(3, 10)


# ---------------------------------------------------------------- simulated studies


def noise(kind: str, rng: np.random.Generator, shape: tuple[int, ...], cv: float) -> np.ndarray:
    """Multiplicative run-to-run noise around 1 with sd ``cv``."""
    if kind == "normal":
        return 1.0 + rng.normal(0.0, cv, shape)
    if kind == "lognormal":
        return np.exp(rng.normal(0.0, cv, shape))
    return np.exp(cv * rng.standard_t(3, shape) / math.sqrt(3))  # t, 3 df, sd cv


def drift(rng: np.random.Generator, points: int, rounds: int, total: float) -> np.ndarray:
    """The slowdown of each (point, round) run: ``total`` over the study, run by run in the
    interleaved order (round by round, points shuffled within a round)."""
    order = np.empty((points, rounds))
    for r in range(rounds):
        order[rng.permutation(points), r] = r * points + np.arange(points)
    return 1.0 + total * order / (points * rounds)


def values(rng: np.random.Generator, kind: str, cv: float | np.ndarray, points: int = 21,
           rounds: int = 10, drifts: float = 0.0) -> np.ndarray:
    """Run times (s) of a study: ``values[point, round]``, point 0 the baseline."""
    cvs = np.broadcast_to(np.asarray(cv, dtype=float), (points,))
    raw = np.stack([noise(kind, rng, (rounds,), float(c)) for c in cvs])
    return 10.0 * raw * (drift(rng, points, rounds, drifts) if drifts else 1.0)


def table(v: np.ndarray, mask: np.ndarray) -> pd.DataFrame:
    """The runs table of the (point, round) runs in ``mask``."""
    pi, ri = np.nonzero(mask)
    return pd.DataFrame({"point": [json.dumps({"p": int(i)}) for i in pi], "status": "ok",
                         "repeat": ri, "fom.wall_s": v[pi, ri]})


def fixed(v: np.ndarray, n: int) -> tuple[pd.DataFrame, SequentialPlan | None]:
    mask = np.zeros(v.shape, dtype=bool)
    mask[:, :n] = True
    return table(v, mask), None


def auto(v: np.ndarray) -> tuple[pd.DataFrame, SequentialPlan]:
    """What the runner does for ``repeats: auto``: every point for the first rounds, then
    the baseline and the points still undecided, round by round, up to the budget."""
    mask = np.zeros(v.shape, dtype=bool)
    mask[:, : PLAN.min_rounds] = True
    for r in range(PLAN.min_rounds, PLAN.max_rounds):
        undecided = still_undecided(table(v, mask), "wall_s", "minimize", BASE, PLAN)
        if not undecided:
            break
        mask[0, r] = True
        mask[[json.loads(k)["p"] for k in undecided], r] = True
    return table(v, mask), PLAN


def judged(runs: pd.DataFrame, plan: SequentialPlan | None) -> dict[int, object]:
    out = compare_to_baseline(runs, "wall_s", "minimize", BASE, plan=plan)
    return {pc.summary.params["p"]: pc.comparison for pc in out if not pc.is_baseline}


def wilson_upper(hits: int, trials: int, z: float = 1.959964) -> float:
    """Upper end of the Wilson 95 % interval of a proportion."""
    p = hits / trials
    centre = p + z * z / (2 * trials)
    spread = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return (centre + spread) / (1 + z * z / trials)


def aa_row(label: str, studies: int, seed: int,
           make: Callable[[np.random.Generator], tuple[pd.DataFrame, SequentialPlan | None]]
           ) -> None:
    rng = np.random.default_rng(seed)
    false = calls = 0
    started = time.perf_counter()
    for _ in range(studies):
        runs, plan = make(rng)
        k = sum(c.verdict in CALLS for c in judged(runs, plan).values())  # type: ignore[attr-defined]
        false += k > 0
        calls += k
    upper = wilson_upper(false, studies)
    print(f"   {label:44s} {false / studies:6.3f}  {upper:6.3f}  "
          f"{'meets' if upper <= 0.05 else 'MISSES'}  ({calls / studies:.3f} false calls "
          f"per study, {time.perf_counter() - started:.0f} s)", flush=True)


def section_aa(studies: int) -> None:
    print(f"1. A/A: baseline + 20 equal points, 5 % noise; share of {studies} studies with "
          "any false verdict")
    print(f"   {'case':44s} {'rate':>6s}  {'95% UB':>6s}  target <= 0.05")
    seed = 100
    for kind in ("normal", "lognormal", "t3"):
        for d in (0.0, 0.10):
            for n in (3, 5):
                seed += 1
                label = f"{kind}, n = {n}" + (", drift +10 %" if d else "")
                aa_row(label, studies, seed, lambda rng, k=kind, d=d, n=n:
                       fixed(values(rng, k, 0.05, rounds=n, drifts=d), n))
    for kind, d in (("normal", 0.0), ("normal", 0.10), ("t3", 0.10)):
        seed += 1
        label = f"{kind}, repeats: auto 3-10" + (", drift +10 %" if d else "")
        aa_row(label, studies, seed, lambda rng, k=kind, d=d:
               auto(values(rng, k, 0.05, drifts=d)))
    print("   reference (not targets):")
    aa_row("one point vs baseline, normal, n = 5", studies, 200,
           lambda rng: fixed(values(rng, "normal", 0.05, points=2, rounds=5), 5))
    aa_row("20 points of unequal noise (2-8 %), n = 5", studies, 201,
           lambda rng: fixed(values(rng, "normal", np.linspace(0.02, 0.08, 21), rounds=5), 5))


def section_power(studies: int) -> None:
    print(f"\n2. Power: baseline + 20 points, one truly faster; share of {studies} studies "
          "calling it faster [median detectable change reported for it; auto: mean rounds "
          "per point]")
    print(f"   {'change, noise':16s} {'n = 3':>16s} {'n = 5':>16s} {'n = 10':>16s} "
          f"{'auto (3-10)':>24s}")
    seed = 300
    for change in (0.05, 0.10):
        for cv in (0.02, 0.05):
            cells = []
            for n in (3, 5, 10, 0):
                seed += 1
                rng = np.random.default_rng(seed)
                found, rounds, seen = 0, 0, []
                for _ in range(studies):
                    v = values(rng, "normal", cv)
                    v[7] /= 1 + change
                    runs, plan = auto(v) if n == 0 else fixed(v, n)
                    c = judged(runs, plan)[7]
                    found += c.verdict is Verdict.BETTER  # type: ignore[attr-defined]
                    seen.append(c.detectable)  # type: ignore[attr-defined]
                    rounds += len(runs)
                text = f"{found / studies:.2f} [{median(seen):.1%}]"
                if n == 0:
                    text += f" {rounds / studies / 21:4.1f} rds"
                cells.append(text)
            print(f"   {change:.0%}, CV {cv:.0%}     {cells[0]:>16s} {cells[1]:>16s} "
                  f"{cells[2]:>16s} {cells[3]:>24s}", flush=True)


# ---------------------------------------------------------------- rounds not made side by side


def broken_study(rng: np.random.Generator, *, points: int, rounds: int, cv: float,
                 cut: str, faster: float = 0.0) -> pd.DataFrame:
    """A study whose rounds are not all made side by side, as the store reads it (columns
    ``session`` and ``rerun``): ``cut`` is ``"once"`` (interrupted at a random run inside a
    round, resumed on a machine 15 % slower), ``"chunks"`` (a batch allocation that ends
    every 7 runs, each new one on a machine of its own speed, sd 10 %) or ``"rerun"`` (the
    machine slows 10 % over the study; each run is disturbed with probability 0.2 — 0.6 for
    point 1, which takes more of the cores — and ``--rerun-disturbed`` makes it again after
    the last round). Point 0 is the baseline; point 1 is ``faster`` (a share), the others
    equal to it."""
    order = [(int(p), r) for r in range(rounds) for p in rng.permutation(points)]
    total = len(order)
    if cut == "once":
        at = int(rng.choice([i for i in range(1, total) if i % points]))
        session = np.array([1 if i < at else 2 for i in range(total)])
        speed = {1: 1.0, 2: 1.15}
    elif cut == "chunks":
        session = 1 + np.arange(total) // 7
        speed = {int(s): float(np.exp(rng.normal(0, 0.10))) for s in np.unique(session)}
    else:
        session = np.ones(total, dtype=int)
        speed = {1: 1.0}
    rows = []
    for i, (p, r) in enumerate(order):
        slow = 1 + 0.10 * i / total if cut == "rerun" else speed[int(session[i])]
        again = cut == "rerun" and rng.random() < (0.6 if p == 1 else 0.2)
        if again:  # made again after the last round, where the drift has reached 10 %
            slow = 1.10
        value = 10.0 * slow * math.exp(rng.normal(0, cv)) / (1 + faster * (p == 1))
        rows.append((json.dumps({"p": p}), "ok", r, value, int(session[i]),
                     "end" if again else ""))
    return pd.DataFrame(rows, columns=["point", "status", "repeat", "fom.wall_s", "session",
                                       "rerun"])


def section_unpaired(studies: int) -> None:
    """Rounds split across sessions and runs made again: the verdicts paired by round (as
    before: the table without ``session``/``rerun``) and by block (now), side by side on
    the same simulated studies."""
    print(f"\n4. Rounds not made side by side: baseline + 5 points, 1 % noise; {studies} "
          "studies per row; paired by round (before) | paired within sessions and rerun "
          "passes (now)")
    print(f"   {'case':50s} {'any false verdict':>23s} {'median |log speedup|':>23s} "
          f"{'median CI width':>21s}")
    cases = (("interrupted once in a round, +15 % after, n = 5", "once", 5),
             ("interrupted once in a round, +15 % after, n = 10", "once", 10),
             ("allocation ends every 7 runs, sd 10 %, n = 10", "chunks", 10),
             ("rerun-disturbed, drift +10 %, n = 10", "rerun", 10))
    seed = 400
    for label, cut, n in cases:
        seed += 1
        rng = np.random.default_rng(seed)
        false = {"before": 0, "now": 0}
        est: dict[str, list[float]] = {"before": [], "now": []}
        width: dict[str, list[float]] = {"before": [], "now": []}
        for _ in range(studies):
            runs = broken_study(rng, points=6, rounds=n, cv=0.01, cut=cut)
            for way, table in (("before", runs.drop(columns=["session", "rerun"])),
                               ("now", runs)):
                calls = judged(table, None).values()
                false[way] += any(c.verdict in CALLS for c in calls)  # type: ignore[attr-defined]
                est[way] += [abs(math.log(c.speedup)) for c in calls]  # type: ignore[attr-defined]
                width[way] += [c.ci_high / c.ci_low - 1 for c in calls]  # type: ignore[attr-defined]
        cells = [f"{false[w] / studies:.3f} (UB {wilson_upper(false[w], studies):.3f})"
                 for w in ("before", "now")]
        print(f"   {label:50s} {cells[0]:>11s} | {cells[1]:<11s} "
              f"{median(est['before']):9.2%} | {median(est['now']):<9.2%}  "
              f"{median(width['before']):8.1%} | {median(width['now']):<8.1%}", flush=True)
    print("   power: point 1 truly 5 % faster; share of studies calling it faster")
    for label, cut, n in cases:
        seed += 1
        rng = np.random.default_rng(seed)
        found = {"before": 0, "now": 0}
        for _ in range(studies):
            runs = broken_study(rng, points=6, rounds=n, cv=0.01, cut=cut, faster=0.05)
            for way, table in (("before", runs.drop(columns=["session", "rerun"])),
                               ("now", runs)):
                found[way] += judged(table, None)[1].verdict is Verdict.BETTER  # type: ignore[attr-defined]
        print(f"   {label:50s} {found['before'] / studies:11.3f} | "
              f"{found['now'] / studies:<.3f}", flush=True)


# ---------------------------------------------------------------- a real busy machine


SPIN = """\
import sys, time
t = time.process_time()
while time.process_time() - t < 0.3:
    pass
print("x=" + sys.argv[1])
"""

STUDY = """\
name: {name}
workload:
  name: command
  options:
    argv: [{python}, {spin}, "{{x}}"]
    foms: {{x: 'x=(?P<value>[0-9]+)'}}
parameters: {{x: [{xs}]}}
repeats: 1
objective: {{fom: wall_s, direction: minimize}}
"""


def _spin(cpu: int | None, duty: float) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    while True:
        start = time.perf_counter()
        while time.perf_counter() - start < 0.01 * duty:
            pass
        if duty < 1:
            time.sleep(0.01 * (1 - duty))


def _stream(cpu: int | None, duty: float) -> None:
    """Copy 256 MiB arrays to and fro: memory bandwidth, far beyond any last-level cache."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    a = np.ones(32 * 1024 * 1024)
    b = np.empty_like(a)
    while True:
        np.copyto(b, a)
        np.copyto(a, b)


@contextlib.contextmanager
def load(cpus: list[int | None], duty: float = 1.0, *, stream: bool = False,
         run_on: int | None = None) -> Iterator[None]:
    """A bounded load: one busy process per entry of ``cpus`` (pinned to that core, or free
    to move for None), busy ``duty`` of the time, or streaming memory (``stream``); this
    process, whose runs inherit its cores, pinned to core ``run_on`` meanwhile (None: left
    as it is); killed and restored on the way out."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_stream if stream else _spin, args=(cpu, duty), daemon=True)
             for cpu in cpus]
    own = os.sched_getaffinity(0)
    for p in procs:
        p.start()
    try:
        if run_on is not None:
            os.sched_setaffinity(0, {run_on})
        time.sleep(0.5)
        yield
    finally:
        os.sched_setaffinity(0, own)
        for p in procs:
            p.kill()
        for p in procs:
            p.join(5)


@contextlib.contextmanager
def stopping(marker: str, every_s: float = 0.1) -> Iterator[None]:
    """The runs held back with no load on their cores: a thread that stops the process
    group of every process whose command line holds ``marker`` for ``every_s`` seconds,
    then lets it go on for as long (``SIGSTOP``/``SIGCONT``, as ``cpulimit`` does)."""
    import signal
    import threading

    done = threading.Event()

    def cycle() -> None:
        while not done.is_set():
            groups = set()
            for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
                with contextlib.suppress(OSError):
                    if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                        groups.add(os.getpgid(pid))
            for sig in (signal.SIGSTOP, signal.SIGCONT):
                for group in groups:
                    with contextlib.suppress(OSError):
                        os.killpg(group, sig)
                done.wait(every_s if groups else 0.01)

    thread = threading.Thread(target=cycle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5)


def _quota_box(share: float) -> tuple[Path, Path] | None:
    """A new version-1 cpu cgroup allowed ``share`` of one CPU, beside this process's own:
    (its own, the new one); None where none can be made (not root, no such hierarchy)."""
    from tunelab.cpustat import quota_cgroups

    home = next((p for p in quota_cgroups(None) if (p / "cpu.cfs_quota_us").is_file()), None)
    if home is None:
        return None
    box = home / f"tunelab-bench-{os.getpid()}"
    try:
        box.mkdir()
        (box / "cpu.cfs_quota_us").write_text(str(int(share * 100000)))
    except OSError:
        with contextlib.suppress(OSError):
            box.rmdir()
        return None
    return home, box


@contextlib.contextmanager
def quota(share: float) -> Iterator[bool]:
    """This process (and so its runs) in a version-1 cpu cgroup allowed ``share`` of one CPU
    (yields False, doing nothing, where none can be made)."""
    made = _quota_box(share)
    if made is None:
        yield False
        return
    home, box = made
    (box / "cgroup.procs").write_text(str(os.getpid()))
    try:
        yield True
    finally:
        (home / "cgroup.procs").write_text(str(os.getpid()))
        box.rmdir()


def study_runs(tmp: Path, name: str, runs: int, *, wait_quiet: bool = False) -> pd.DataFrame:
    """Run a small real study of ``runs`` CPU-bound runs through the real runner and noise
    watch; its runs table."""
    from tunelab.execute.runner import run_study
    from tunelab.execute.study import prepare_study
    from tunelab.spec import load_study
    from tunelab.store import open_store

    (tmp / "spin.py").write_text(SPIN)
    path = tmp / f"{name}.yaml"
    path.write_text(STUDY.format(name=name, python=sys.executable, spin=tmp / "spin.py",
                                 xs=", ".join(str(i) for i in range(1, runs + 1))))
    run_study(prepare_study(load_study(path)), tmp / name, wait_quiet=wait_quiet)
    with open_store(tmp / name) as store:
        return store.runs_frame()


def section_busy(runs: int, quiet_runs: int, quiet_budget: float) -> None:
    from tunelab.cpustat import cpu_list_text
    from tunelab.noise import DISTURB_SHARE, QUIET_SHARE, NoiseWatch

    watch = NoiseWatch()
    cores = watch.cpu_list
    print(f"\n3. A busy machine: runs of 0.3 CPU-s on cores {cores} through the real runner; "
          f"flagged when others took more than {DISTURB_SHARE:.0%} of the run's cores")
    before = watch.others_now(2.0)
    print(f"   before the benchmark's load, others took "
          f"{'?' if before is None else f'{before:.0%}'} of cores {cores} (2 s)")
    own = sorted(os.sched_getaffinity(0))
    loads: list[tuple[str, list[int | None], float, bool, int | None]] = [
        ("2 busy processes pinned to each core", [c for c in own for _ in range(2)], 1.0,
         False, None),
        ("1 busy process pinned to each core", list(own), 1.0, False, None),
        ("1 busy process, free to move", [None], 1.0, False, None),
        ("1 process per core busy half the time", list(own), 0.5, False, None)]
    beside = sorted(set(NoiseWatch([own[-1]]).llc_cpus) - {own[-1]}) if own else []
    if beside:  # the runs pinned to one core, memory streamed on the others of its cache
        loads.append((f"runs on core {own[-1]}, memory streamed on {cpu_list_text(beside)}",
                      list(beside), 1.0, True, own[-1]))
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, cpus, duty, stream, run_on) in enumerate(loads):
            with load(cpus, duty, stream=stream, run_on=run_on):
                frame = study_runs(Path(tmp), f"busy{i}", runs)
            flags = frame["noise.disturbed"].to_numpy(dtype=float)
            column = "noise.llc_others_share" if stream else "noise.others_share"
            shares = frame[column].to_numpy(dtype=float)
            print(f"   {label:40s} flagged {int(flags.sum()):3d} of {len(flags):3d} "
                  f"({flags.mean():.0%}; target >= 95 %), others took a median "
                  f"{np.nanmedian(shares):.0%} of the cores"
                  f"{' sharing its last-level cache' if stream else ''}", flush=True)
        # held back with no other process on their cores: a CPU quota, stopped by signals
        for label, column, held in (
                ("runs under a CPU quota of 30 % of a CPU", "noise.throttled", quota(0.3)),
                ("runs stopped 100 ms of every 200 ms", "noise.stopped",
                 stopping(str(Path(tmp) / "spin.py")))):
            with held as made:
                if made is False:
                    print(f"   {label:40s} not measured: no cpu cgroup can be made here")
                    continue
                frame = study_runs(Path(tmp), f"held{len(label)}", runs)
            flags = frame["noise.disturbed"].to_numpy(dtype=float)
            print(f"   {label:40s} flagged {int(flags.sum()):3d} of {len(flags):3d} "
                  f"({flags.mean():.0%}; target >= 95 %), held back a median "
                  f"{np.nanmedian(frame[column].to_numpy(dtype=float)):.0%} "
                  f"({column.split('.')[1]}), others took a median "
                  f"{np.nanmedian(frame['noise.others_share'].to_numpy(dtype=float)):.0%}",
                  flush=True)
        flagged = total = 0
        waited = time.monotonic()
        shares_q: list[float] = []
        while total < quiet_runs and time.monotonic() - waited < quiet_budget:
            share = watch.others_now(1.0)
            if share is None or share > QUIET_SHARE:
                continue
            frame = study_runs(Path(tmp), f"quiet{total}", 1)
            total += 1
            flagged += int(frame["noise.disturbed"].sum())
            shares_q.extend(frame["noise.others_share"].to_list())
        if total == 0:
            print(f"   quiet machine: not measured: in {quiet_budget:.0f} s the cores were "
                  f"never quiet (others took more than {QUIET_SHARE:.0%} in every 1 s window)")
        else:
            print(f"   quiet machine (runs started after 1 s with others <= {QUIET_SHARE:.0%}): "
                  f"flagged {flagged} of {total} ({flagged / total:.0%}; target <= 1 %), "
                  f"others took a median {median(shares_q):.1%} during them")


def main() -> None:
    """Print every figure."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--studies", type=int, default=2000, help="studies per A/A cell")
    parser.add_argument("--power-studies", type=int, default=500, help="studies per power cell")
    parser.add_argument("--busy-runs", type=int, default=20, help="runs per load")
    parser.add_argument("--quiet-runs", type=int, default=50)
    parser.add_argument("--quiet-budget", type=float, default=300.0,
                        help="seconds to look for quiet cores")
    parser.add_argument("--skip-busy", action="store_true", help="simulations only")
    args = parser.parse_args()
    section_aa(args.studies)
    section_power(args.power_studies)
    section_unpaired(args.power_studies)
    if not args.skip_busy:
        section_busy(args.busy_runs, args.quiet_runs, args.quiet_budget)


if __name__ == "__main__":
    main()
