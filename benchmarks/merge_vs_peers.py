#!/usr/bin/env python3
"""tunelab's merge benchmark against its peers, on the same machine and sizes, side by side.

Every round runs, one after the other (so a busy moment of the machine hits every row):

1. ``python -m tunelab.bench.merge`` on every transport available (tcp, mpi with ob1 and with
   the UCX PML, dask, and ucxx when an interpreter with UCXX is given or found), and the same
   from another source tree with ``--compare-src`` (for example the code before a change);
2. dask-cuda's ``local_cudf_merge -t cpu`` against a local Dask cluster started with the
   ``dask scheduler`` / ``dask worker`` command lines (dask-cuda's own cluster needs a GPU);
   skipped with a message when dask-cuda does not import;
3. the link's limits at the size of one exchanged message (one column of one partition,
   8 bytes x rows for that worker), measured by ``tunelab bounds``' own link probes over the
   same stack (ob1, the UCX PML, plain TCP sockets): one way (a ping-pong) and both ways at
   once (an all-to-all exchange of one message per peer, every exchange timed after a
   barrier as the merge times its own), and ``ucx_perftest -t tag_bw`` (one way, UCX alone).

The bounds of a stack are measured right after the merge run over that stack, so the two
see the same moment of a shared machine. It prints medians over the rounds: throughput and
bandwidth per row, each bandwidth as a fraction of its own bound (the mpi and tcp rows of
the both-ways bound of their stack, the others of the best one-way bound), and the ratios
of the targets: exchange / both-ways bound (also per round, each ratio of one round's run
and bound), beside the old ratio to the one-way ping-pong, the transfer part of the
exchange (after every peer arrived) / both-ways bound, and merge throughput / dask-cuda's.
The CPU model and load average are printed with them: compare ratios measured on different
machines, never raw rates.

    python benchmarks/merge_vs_peers.py --chunk-size 1000000 --iterations 5 --rounds 3 \
        --ucxx-python ~/.cache/tunelab/ucx-venv/bin/python \
        --dask-cuda-python ~/.cache/tunelab/ucx-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reference_tools, run as a script
from reference_tools import cpu_model, ucx_perftest  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"
MiB = 1 << 20


def _env(extra: dict[str, str] | None = None, src: Path = SRC) -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{path}" if path else str(src)}
    env.update(extra or {})
    return env


def _imports(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True,
                          env=_env()).returncode == 0


def tunelab_run(python: str, transport: str, args: argparse.Namespace,
                extra: list[str], env: dict[str, str] | None = None,
                src: Path = SRC) -> dict | None:
    """One tunelab merge run; its JSON figures of merit, or None (reason printed)."""
    argv = [python, "-m", "tunelab.bench.merge", "-t", transport, "-n", str(args.workers),
            "-c", str(args.chunk_size), "-i", str(args.iterations), "--warmup", "1",
            "--verify", "count", "--timeout", "300", *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, env=_env(env, src),
                          timeout=1800)
    if proc.returncode != 0:
        print(f"  ! {transport} {' '.join(extra)} failed: {proc.stderr.strip()[-300:]}")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def dask_cuda_run(python: str, args: argparse.Namespace) -> dict | None:
    """dask-cuda's CPU merge benchmark on a local tcp cluster started by command line."""
    if not _imports(python, "dask_cuda"):
        print(f"  - dask-cuda: does not import in {python}; skipped "
              "(pip install dask-cuda in a venv, then --dask-cuda-python)")
        return None
    with tempfile.TemporaryDirectory() as tmp:
        sfile = Path(tmp) / "scheduler.json"
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        sched = subprocess.Popen([python, "-m", "dask", "scheduler", "--protocol", "tcp",
                                  "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                  "--scheduler-file", str(sfile)], **quiet)
        workers = None
        try:
            for _ in range(300):
                if sfile.exists():
                    break
                time.sleep(0.1)
            workers = subprocess.Popen([python, "-m", "dask", "worker", "--scheduler-file",
                                        str(sfile), "--nworkers", str(args.workers),
                                        "--nthreads", "1", "--host", "127.0.0.1",
                                        "--no-dashboard"], **quiet)
            proc = subprocess.run(
                [python, "-m", "dask_cuda.benchmarks.local_cudf_merge", "-t", "cpu",
                 "-c", str(args.chunk_size), "--runs", str(args.iterations),
                 "--scheduler-file", str(sfile), "--no-show-p2p-bandwidth"],
                capture_output=True, text=True, timeout=1800, env=_env())
        finally:
            for p in (workers, sched):
                if p is not None:
                    p.terminate()
                    p.wait(timeout=30)
    out = proc.stdout
    tp = re.search(r"^Throughput\s+\|\s+([\d.]+)\s+(\w+)/s", out, re.M)
    bw = re.search(r"^Bandwidth\s+\|\s+([\d.]+)\s+(\w+)/s", out, re.M)
    if proc.returncode != 0 or tp is None:
        print(f"  ! dask-cuda failed: {(proc.stderr or out).strip()[-300:]}")
        return None
    return {"throughput": _to_bytes(tp), "bandwidth": _to_bytes(bw) if bw else float("nan")}


def _to_bytes(m: re.Match[str]) -> float:
    value, unit = float(m.group(1)), m.group(2).lower()
    scale = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30,
             "kb": 1e3, "mb": 1e6, "gb": 1e9}[unit]
    return value * scale


def link_bounds(size: int, stack: str) -> dict[str, float]:
    """The link's limits over one stack (``mpi-ob1``, ``mpi-ucx``, ``tcp``) at one message
    size, by the code of ``tunelab bounds`` (:mod:`tunelab.bounds.link`): one way (a
    ping-pong) and both ways at once (an all-to-all of one message per peer, each exchange
    timed on its own after a barrier, as the merge times its exchange), bytes/s per rank,
    medians of 5 blocks."""
    if stack != "tcp" and shutil.which("mpirun") is None:
        print("  - mpirun not installed; skipped")
        return {}
    sys.path.insert(0, str(SRC))
    from tunelab.bounds.link import link_rates
    from tunelab.errors import TunelabError

    try:
        run = link_rates(stack, patterns=["oneway", "alltoall"], sizes=[size], ranks=2,
                         repeats=5, block_bytes=256 << 20)
    except TunelabError as exc:
        print(f"  ! link bounds ({stack}) failed: {exc}")
        return {}
    return {r.pattern: statistics.median(r.samples) for r in run.results}


_STACKS = {"tunelab mpi ob1": "mpi-ob1", "tunelab mpi ucx": "mpi-ucx", "tunelab tcp": "tcp"}
"""The link stack of each row the both-ways bound judges, measured right after its run."""


def _med(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunk-size", type=int, default=1_000_000)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds over all contenders (medians are reported)")
    parser.add_argument("--ucxx-python", default=os.environ.get("TUNELAB_UCXX_PYTHON"),
                        help="a Python with ucxx (and tunelab's deps) for the ucxx transport")
    parser.add_argument("--dask-cuda-python", default=os.environ.get("TUNELAB_UCXX_PYTHON"),
                        help="a Python with dask-cuda for its merge benchmark")
    parser.add_argument("--compare-src", type=Path,
                        help="another tunelab src/ directory to run as 'before' rows")
    args = parser.parse_args()
    py = sys.executable
    ucxx_py = args.ucxx_python or (py if _imports(py, "ucxx") else None)
    dc_py = args.dask_cuda_python or py

    n, c = args.workers, args.chunk_size
    msg = 8 * c // n  # bytes of one exchanged message: one int64 column of one partition
    print(f"merge_vs_peers: {n} workers, {c} rows per chunk, {args.iterations} timed "
          f"iterations x {args.rounds} rounds, exchanged message ~{msg / MiB:.2f} MiB "
          f"(one column of one partition), {cpu_model()}, {os.cpu_count()} cores, load "
          f"average {os.getloadavg()[0]:.2f}")
    plan: list[tuple[str, str, list[str], dict[str, str] | None, str, Path]] = [
        ("tunelab tcp", "tcp", [], None, py, SRC),
        ("tunelab mpi ob1", "mpi", ["--mpi-pml", "ob1"], None, py, SRC),
        ("tunelab mpi ucx", "mpi", ["--mpi-pml", "ucx"], None, py, SRC),
        ("tunelab dask tcp", "dask", [], None, py, SRC)]
    if ucxx_py:
        plan.append(("tunelab ucxx", "ucxx", [], {"UCX_WARN_UNUSED_ENV_VARS": "n"}, ucxx_py,
                     SRC))
    else:
        print("  - ucxx: no interpreter with ucxx (--ucxx-python); skipped")
    if args.compare_src:
        plan += [(f"before: {label[8:]}", t, e, env, p, args.compare_src)
                 for label, t, e, env, p, _ in plan if t in ("tcp", "mpi")]
    tp: dict[str, list[float]] = {}
    bw: dict[str, list[float]] = {}
    transfer: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for label, transport, extra, env, python, src in plan:
            print(f"  round {r + 1}: {label} …", flush=True)
            res = tunelab_run(python, transport, args, extra, env, src)
            if res:
                tp.setdefault(label, []).append(res["throughput"])
                bw.setdefault(label, []).append(res["bandwidth"])
                if "bandwidth_transfer" in res:
                    transfer.setdefault(label, []).append(res["bandwidth_transfer"])
            stack = _STACKS.get(label)
            if stack and res:  # the bound of its own stack, right after the run it judges
                limits = link_bounds(msg, stack)
                prefix = "TCP" if stack == "tcp" else "MPI"
                for pattern, name in (("oneway", "one way"), ("alltoall", "both ways")):
                    if pattern in limits:
                        bw.setdefault(f"{prefix} {name} {stack[-3:]}", []).append(
                            limits[pattern])
        print(f"  round {r + 1}: dask-cuda local_cudf_merge -t cpu …", flush=True)
        dc = dask_cuda_run(dc_py, args)
        if dc:
            tp.setdefault("dask-cuda merge (cpu)", []).append(dc["throughput"])
            bw.setdefault("dask-cuda merge (cpu)", []).append(dc["bandwidth"])
        print(f"  round {r + 1}: ucx_perftest …", flush=True)
        value = ucx_perftest(msg, 13411)
        if value:
            bw.setdefault("ucx_perftest tag_bw", []).append(value)

    def fmt(v: float | None) -> str:
        return "—" if v is None else f"{v / MiB:10.1f}"

    bound_names = ("ucx_perftest tag_bw", "MPI one way ob1", "MPI both ways ob1",
                   "MPI one way ucx", "MPI both ways ucx", "TCP one way tcp",
                   "TCP both ways tcp")
    bounds = {k: _med(bw.get(k, [])) for k in bound_names}
    best_bound = max((v for k, v in bounds.items() if v and "both" not in k), default=None)

    def bound_of(label: str, kind: str = "both ways") -> float | None:
        for pml in ("ob1", "ucx"):
            if label.endswith(f"mpi {pml}"):
                return bounds[f"MPI {kind} {pml}"]
        if label.endswith(" tcp") and "dask" not in label:
            return bounds[f"TCP {kind} tcp"]
        return best_bound

    print(f"  load average at the end {os.getloadavg()[0]:.2f} (other work on the machine "
          "skews every figure: compare rows of one run only)")
    print()
    print(f"{'run (median of rounds)':<26} {'throughput MiB/s':>17} {'bandwidth MiB/s':>16} "
          f"{'bw / bound':>11}  bandwidth runs MiB/s")
    print("-" * 100)
    labels = [p[0] for p in plan] + ["dask-cuda merge (cpu)", *bounds]
    for label in labels:
        t, b = _med(tp.get(label, [])), _med(bw.get(label, []))
        bound = None if label in bounds else bound_of(label)
        share = f"{b / bound:11.2f}" if b and bound else f"{'—':>11}"
        runs = [round(v / MiB) for v in bw.get(label, [])]
        print(f"{label:<26} {fmt(t):>17} {fmt(b):>16} {share}  {runs}")
    print("-" * 100)
    dcuda = _med(tp.get("dask-cuda merge (cpu)", []))
    for label in ("tunelab mpi ob1", "tunelab mpi ucx", "tunelab tcp"):
        pml = label[-3:]
        b, both, one = _med(bw.get(label, [])), bound_of(label), bound_of(label, "one way")
        if not (b and both):
            continue
        stack = "TCP" if pml == "tcp" else "MPI"
        rounds = [x / y for x, y in zip(bw.get(label, []),
                                        bw.get(f"{stack} both ways {pml}", []), strict=False)]
        print(f"bandwidth {label} / {stack} both-ways bound {pml}: {b / both:5.2f} "
              f"(target >= 0.70: {'met' if b >= 0.7 * both else 'MISSED'}; per round "
              f"{', '.join(f'{x:.2f}' for x in rounds)})"
              + (f"; / one-way ping-pong {pml}: {b / one:5.2f}" if one else ""))
        t = _med(transfer.get(label, []))
        if t:
            print(f"  its transfer (after every peer arrived) / {stack} both-ways bound {pml}: "
                  f"{t / both:5.2f}; the rest of the exchange waited for the slower peer")
    if dcuda:
        for label in [p[0] for p in plan if p[0].startswith("tunelab")]:
            t = _med(tp.get(label, []))
            if t:
                print(f"throughput {label} / dask-cuda merge: {t / dcuda:5.2f}"
                      + (f" (target >= 1.5: {'met' if t >= 1.5 * dcuda else 'MISSED'})"
                         if label != "tunelab dask tcp" else ""))


if __name__ == "__main__":
    main()
