#!/usr/bin/env python3
"""tunelab's merge benchmark against its peers, on the same machine and sizes, side by side.

Runs, one after the other:

1. ``python -m tunelab.bench.merge`` on every transport available (tcp, mpi with ob1 and with
   the UCX PML, dask, and ucxx when an interpreter with UCXX is given or found);
2. dask-cuda's ``local_cudf_merge -t cpu`` against a local Dask cluster started with the
   ``dask scheduler`` / ``dask worker`` command lines (dask-cuda's own cluster needs a GPU);
   skipped with a message when dask-cuda does not import;
3. the link's upper bound: ``ucx_perftest -t tag_bw`` and an mpi4py ping-pong (ob1 and UCX
   PML), at the size of one partition message.

and prints throughput and bandwidth per row plus the ratios that matter: each tunelab
transport's bandwidth as a share of the link bound, and tunelab's Dask merge against
dask-cuda's (same data volume, same cluster shape, throughput defined identically: all chunks'
data ÷ wall clock).

    python benchmarks/merge_vs_peers.py --chunk-size 1000000 --iterations 5 \
        --ucxx-python /tmp/ucxvenv/bin/python --dask-cuda-python /tmp/ucxvenv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MiB = 1 << 20


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{path}" if path else str(SRC)}
    env.update(extra or {})
    return env


def _imports(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True,
                          env=_env()).returncode == 0


def tunelab_run(python: str, transport: str, args: argparse.Namespace,
                extra: list[str], env: dict[str, str] | None = None) -> dict | None:
    """One tunelab merge run; its JSON figures of merit, or None (reason printed)."""
    argv = [python, "-m", "tunelab.bench.merge", "-t", transport, "-n", str(args.workers),
            "-c", str(args.chunk_size), "-i", str(args.iterations), "--warmup", "1",
            "--verify", "count", "--timeout", "300", *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, env=_env(env), timeout=1800)
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


def ucx_perftest(size: int) -> float | None:
    """ucx_perftest tag_bw between two local processes, bytes/s (UCX's MB = 2^20 bytes)."""
    if shutil.which("ucx_perftest") is None:
        print("  - ucx_perftest not installed (apt-get install ucx-utils); skipped")
        return None
    port = "13411"
    server = subprocess.Popen(["ucx_perftest", "-p", port], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        proc = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", port, "-t", "tag_bw",
                               "-s", str(size), "-n", "200", "-w", "20"],
                              capture_output=True, text=True, timeout=300)
    finally:
        server.wait(timeout=30) if server.poll() is not None else server.kill()
    m = re.search(r"^Final:\s+\d+\s+\S+\s+\S+\s+\S+\s+([\d.]+)", proc.stdout, re.M)
    return float(m.group(1)) * MiB if m else None


PINGPONG = """
import sys, time
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
size, iters = int(sys.argv[1]), int(sys.argv[2])
buf = np.zeros(size, dtype=np.uint8)
other = 1 - comm.rank
for phase in ("warm", "timed"):
    n = 3 if phase == "warm" else iters
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(n):
        if comm.rank == 0:
            comm.Send(buf, dest=other); comm.Recv(buf, source=other)
        else:
            comm.Recv(buf, source=other); comm.Send(buf, dest=other)
    elapsed = time.perf_counter() - t
if comm.rank == 0:
    print(2 * size * iters / elapsed)
"""


def mpi_pingpong(size: int, pml: str) -> float | None:
    """One-direction bandwidth of an mpi4py ping-pong between two ranks, bytes/s."""
    if shutil.which("mpirun") is None:
        print("  - mpirun not installed; skipped")
        return None
    from tunelab.cluster.mpi import mpirun_argv

    env = {"OMPI_MCA_pml": pml}
    if pml == "ucx":
        env.update(OMPI_MCA_pml_ucx_tls="any", OMPI_MCA_pml_ucx_devices="any")
    argv = mpirun_argv(2) + [sys.executable, "-c", PINGPONG, str(size), "50"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=_env(env), timeout=300)
    try:
        return float(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        print(f"  ! MPI ping-pong ({pml}) failed: {proc.stderr.strip()[-300:]}")
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunk-size", type=int, default=1_000_000)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--ucxx-python", default=os.environ.get("TUNELAB_UCXX_PYTHON"),
                        help="a Python with ucxx (and tunelab's deps) for the ucxx transport")
    parser.add_argument("--dask-cuda-python", default=os.environ.get("TUNELAB_UCXX_PYTHON"),
                        help="a Python with dask-cuda for its merge benchmark")
    args = parser.parse_args()
    py = sys.executable
    ucxx_py = args.ucxx_python or (py if _imports(py, "ucxx") else None)
    dc_py = args.dask_cuda_python or py

    n, c = args.workers, args.chunk_size
    part = 16 * c // n  # bytes of one partition message (int64 key + payload per row)
    print(f"merge_vs_peers: {n} workers, {c} rows per chunk, {args.iterations} timed "
          f"iterations, partition message ~{part / MiB:.2f} MiB, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f}")

    rows: list[tuple[str, float | None, float | None]] = []
    plan = [("tunelab tcp", "tcp", [], None),
            ("tunelab mpi ob1", "mpi", ["--mpi-pml", "ob1"], None),
            ("tunelab mpi ucx", "mpi", ["--mpi-pml", "ucx"], None),
            ("tunelab dask tcp", "dask", [], None)]
    for label, transport, extra, env in plan:
        print(f"  running {label} …", flush=True)
        res = tunelab_run(py, transport, args, extra, env)
        rows.append((label, res and res["throughput"], res and res["bandwidth"]))
    if ucxx_py:
        print("  running tunelab ucxx …", flush=True)
        res = tunelab_run(ucxx_py, "ucxx", args, [], {"UCX_WARN_UNUSED_ENV_VARS": "n"})
        rows.append(("tunelab ucxx", res and res["throughput"], res and res["bandwidth"]))
    else:
        print("  - ucxx: no interpreter with ucxx (--ucxx-python); skipped")
    print("  running dask-cuda local_cudf_merge -t cpu …", flush=True)
    dc = dask_cuda_run(dc_py, args)
    rows.append(("dask-cuda merge (cpu)", dc and dc["throughput"], dc and dc["bandwidth"]))
    print("  measuring link bounds …", flush=True)
    perf = ucx_perftest(part)
    pp_ob1 = mpi_pingpong(part, "ob1")
    pp_ucx = mpi_pingpong(part, "ucx")
    rows += [("ucx_perftest tag_bw", None, perf), ("MPI ping-pong ob1", None, pp_ob1),
             ("MPI ping-pong ucx", None, pp_ucx)]

    def fmt(v: float | None) -> str:
        return "—" if v is None else f"{v / MiB:10.1f}"

    bound = max((v for v in (perf, pp_ob1, pp_ucx) if v), default=None)
    print(f"  load average at the end {os.getloadavg()[0]:.2f} (other work on the machine "
          "skews every figure: compare rows of one run only)")
    print()
    print(f"{'run':<24} {'throughput MiB/s':>17} {'bandwidth MiB/s':>16} {'bw / link bound':>16}")
    print("-" * 76)
    for label, tp, bw in rows:
        share = f"{bw / bound:16.2f}" if bw and bound else f"{'—':>16}"
        print(f"{label:<24} {fmt(tp):>17} {fmt(bw):>16} {share}")
    print("-" * 76)
    by = {label: (tp, bw) for label, tp, bw in rows}
    tl_dask, dcuda = by["tunelab dask tcp"][0], by["dask-cuda merge (cpu)"][0]
    if tl_dask and dcuda:
        print(f"throughput tunelab dask / dask-cuda merge:   {tl_dask / dcuda:6.2f}")
    best = max((tp, label) for label, tp, _ in rows if tp and label.startswith("tunelab"))
    if dcuda:
        print(f"throughput best tunelab ({best[1]}) / dask-cuda: {best[0] / dcuda:6.2f}")
    mpi_ucx = by["tunelab mpi ucx"][1]
    if mpi_ucx and pp_ucx:
        print(f"bandwidth tunelab mpi ucx / MPI ping-pong ucx: {mpi_ucx / pp_ucx:6.2f}")
    tcp_bw = by["tunelab tcp"][1]
    if tcp_bw and perf:
        print(f"bandwidth tunelab tcp / ucx_perftest:         {tcp_bw / perf:6.2f}")


if __name__ == "__main__":
    main()
