#!/usr/bin/env python3
"""Every bound of ``tunelab bounds`` beside a reference tool, on the same machine, in one run.

Each round measures, one after the other (the order flips every round, so a busy moment of
the machine does not always hit the same side):

* **GEMM** — tunelab's ``gemm_rates`` (``torch.matmul``; for fp32 the faster of it and numpy's
  BLAS) against numpy's ``matmul`` (its own
  BLAS, in a process of its own with ``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS`` set) for
  fp32, and against ``torch.utils.benchmark.Timer`` for every precision tunelab keeps;
* **memory** — tunelab's triad against a STREAM-style triad in C (``a[i] = b[i] + 3 c[i]``,
  ``gcc -O3 -march=native -fopenmp``, the same array length, 24 bytes per element);
* **link** — tunelab's link probe (mpi4py) against the same two patterns written in C with
  ``mpicc`` (a ping-pong; an all-to-all of one message per peer, every exchange timed after
  a barrier; buffers allocated as numpy allocates them: transparent huge pages asked for
  from 4 MiB on), over ob1 and the UCX PML, and ``ucx_perftest -t tag_bw`` (one way, streaming:
  a different definition, shown for scale);
* **storage** — tunelab's cold and warm reads of a directory against ``dd`` (the page cache
  dropped with ``dd iflag=nocache count=0``, then ``dd bs=1M`` to ``/dev/null``).

It prints the medians over rounds of each side (each round's figure is the median of its
samples, as a bound's value is) and the ratio tunelab / reference, with the CPU model and the
load average before and after: on a shared machine compare ratios of one run only.

    python benchmarks/bounds_vs_reference.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from reference_tools import cpu_model, ucx_perftest  # noqa: E402

from tunelab.bounds.compute import (  # noqa: E402
    cpu_threads,
    gemm_rates,
    precisions_for,
    triad_rates,
)
from tunelab.bounds.disk import read_rates  # noqa: E402
from tunelab.bounds.link import link_rates, stack_env  # noqa: E402
from tunelab.bounds.linkprobe import buffer_sets, default_working_set  # noqa: E402
from tunelab.cluster.mpi import mpirun_argv  # noqa: E402

TRIAD_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
int main(int argc, char **argv) {
    long n = atol(argv[1]); int reps = atoi(argv[2]);
    double *a = malloc(n * sizeof(double)), *b = malloc(n * sizeof(double)),
           *c = malloc(n * sizeof(double));
    #pragma omp parallel for
    for (long i = 0; i < n; i++) { a[i] = 0.0; b[i] = 1.0; c[i] = 2.0; }
    for (int r = 0; r <= reps; r++) {
        double t = omp_get_wtime();
        #pragma omp parallel for
        for (long i = 0; i < n; i++) a[i] = b[i] + 3.0 * c[i];
        t = omp_get_wtime() - t;
        if (r > 0) printf("%.6e\n", 24.0 * n / t);  /* the first pass is a warm-up */
    }
    return a[n / 2] == 7.0 ? 0 : 1;
}
"""

LINK_C = r"""
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
/* buffers as numpy allocates them (and so the probe and the merge's columns): transparent
   huge pages asked for from 4 MiB on, not below (they made this copy up to 1.9x faster) */
static char *big(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n)) return NULL;
    if (n >= (1 << 22)) madvise(p, n, MADV_HUGEPAGE);
    return p;
}
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n; MPI_Comm_rank(MPI_COMM_WORLD, &rank); MPI_Comm_size(MPI_COMM_WORLD, &n);
    long size = atol(argv[1]); int iters = atoi(argv[2]), reps = atoi(argv[3]);
    /* as the probe: one send buffer (hot), receive buffer sets cycled through (from memory) */
    int sets = atoi(argv[4]);
    char *s0 = big(size), **r = malloc(sets * sizeof(char *));
    memset(s0, rank, size);
    for (int j = 0; j < sets; j++) { r[j] = big(size * (n - 1)); memset(r[j], 0, size * (n - 1)); }
    MPI_Request *q = malloc(2 * n * sizeof(MPI_Request));
    for (int rep = -1; rep < reps; rep++) {           /* rep -1: warm-up */
        MPI_Barrier(MPI_COMM_WORLD);
        double t = MPI_Wtime();
        for (int i = 0; i < iters; i++) {
            char *ri = r[i % sets];
            if (rank == 0) {
                MPI_Send(s0, size, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
                MPI_Recv(ri, size, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else if (rank == 1) {
                MPI_Recv(ri, size, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(s0, size, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
            }
        }
        t = MPI_Wtime() - t;
        if (rank == 0 && rep >= 0) printf("oneway %.6e\n", 2.0 * size * iters / t);
    }
    for (int rep = -1; rep < reps; rep++) {
        double busy = 0.0;
        for (int i = 0; i < iters; i++) {
            char *ri = r[i % sets];
            MPI_Barrier(MPI_COMM_WORLD);
            double t = MPI_Wtime(); int k = 0;
            for (int p = 1; p < n; p++)
                MPI_Irecv(ri + (p - 1) * size, size, MPI_BYTE, (rank + p) % n, 0,
                          MPI_COMM_WORLD, &q[k++]);
            for (int p = 1; p < n; p++)
                MPI_Isend(s0, size, MPI_BYTE, (rank + p) % n, 0, MPI_COMM_WORLD, &q[k++]);
            MPI_Waitall(k, q, MPI_STATUSES_IGNORE);
            busy += MPI_Wtime() - t;
        }
        double mine = (double)(n - 1) * size * iters / busy, inv = 1.0 / mine, sum = 0.0;
        MPI_Reduce(&inv, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0 && rep >= 0) printf("alltoall %.6e\n", n / sum);  /* harmonic mean */
    }
    MPI_Finalize();
    return 0;
}
"""


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _compile(tmp: Path, name: str, source: str, cc: str, flags: list[str]) -> Path | None:
    if shutil.which(cc) is None:
        print(f"  - {cc} not installed: the {name} reference is skipped")
        return None
    src, exe = tmp / f"{name}.c", tmp / name
    src.write_text(source)
    proc = subprocess.run([cc, *flags, str(src), "-o", str(exe)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        print(f"  ! {cc} {name}: {proc.stderr.strip()[-300:]}")
        return None
    return exe


def numpy_gemm(n: int, threads: int, repeats: int) -> float:
    """numpy fp32 matmul FLOP/s (median), in a fresh process with its BLAS's threads set."""
    code = ("import sys, time, numpy as np\n"
            "n, k = int(sys.argv[1]), int(sys.argv[2])\n"
            "a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)\n"
            "b = a.copy(); c = np.empty_like(a); np.matmul(a, b, out=c)\n"
            "for _ in range(k):\n"
            "    t = time.perf_counter(); np.matmul(a, b, out=c)\n"
            "    print(2 * n**3 / (time.perf_counter() - t))\n")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads),
           "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, "-c", code, str(n), str(repeats)], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    return statistics.median(float(x) for x in out)


def torch_timer_gemm(precision: str, n: int, threads: int) -> float:
    """``torch.utils.benchmark.Timer`` on a plain ``a @ b``: FLOP/s of its median."""
    import torch
    import torch.utils.benchmark as tb

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    timer = tb.Timer("a @ b", globals={"a": a, "b": b}, num_threads=threads)
    return 2 * n**3 / timer.blocked_autorange(min_run_time=2.0).median


def c_link(exe: Path, stack: str, size: int, iters: int, reps: int) -> dict[str, float]:
    """The C reference over ``stack``, cycling through as many receive sets as the probe."""
    sets = buffer_sets(size, 2, default_working_set(2))
    argv = [*mpirun_argv(2), str(exe), str(size), str(iters), str(reps), str(sets)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600,
                         env={**os.environ, **stack_env(stack)}).stdout
    found: dict[str, list[float]] = {}
    for line in out.splitlines():
        name, _, value = line.partition(" ")
        found.setdefault(name, []).append(float(value))
    return {k: statistics.median(v) for k, v in found.items()}


def dd_reads(directory: Path) -> tuple[float, float]:
    """Cold and warm MB/s of ``dd`` over the largest file in ``directory``, in bytes/s."""
    target = max((p for p in directory.iterdir() if p.is_file()),
                 key=lambda p: p.stat().st_size)

    def rate() -> float:
        err = subprocess.run(["dd", f"if={target}", "of=/dev/null", "bs=1M"],
                             capture_output=True, text=True, check=True).stderr
        m = re.search(r"(\d+) bytes.*copied, ([\d.e+-]+) s", err)
        if m is None:
            raise RuntimeError(f"dd said: {err.strip()}")
        return int(m.group(1)) / float(m.group(2))

    subprocess.run(["dd", f"if={target}", "iflag=nocache", "count=0"], capture_output=True,
                   check=True)
    cold = rate()
    return cold, rate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=cpu_threads())
    parser.add_argument("--gemm-n", type=int, default=2048)
    parser.add_argument("--triad-elements", type=int, default=1 << 25)
    parser.add_argument("--message-bytes", type=int, default=4_000_000)
    parser.add_argument("--storage-bytes", type=int, default=512 << 20)
    parser.add_argument("--kinds", default="gemm,memory,link,storage",
                        help="the bounds to compare (comma-separated)")
    args = parser.parse_args()
    kinds = set(args.kinds.split(","))
    t, n = args.threads, args.gemm_n
    print(f"bounds_vs_reference: {cpu_model()}, {os.cpu_count()} cores, {t} threads, "
          f"{args.rounds} rounds, load average {os.getloadavg()[0]:.2f}", flush=True)
    ours: dict[str, list[float]] = {}
    ref: dict[str, list[float]] = {}

    def add(table: dict[str, list[float]], key: str, value: float | None) -> None:
        if value:
            table.setdefault(key, []).append(value)

    with tempfile.TemporaryDirectory(prefix="bounds-ref-") as tmp_name:
        tmp = Path(tmp_name)
        triad_exe = _compile(tmp, "triad", TRIAD_C, "gcc", ["-O3", "-march=native", "-fopenmp"])
        link_exe = _compile(tmp, "link", LINK_C, "mpicc", ["-O2"])
        data = tmp / "storage"
        data.mkdir()
        with open(data / "blob", "wb") as fh:  # one file: dd and tunelab read the same bytes
            for _ in range(args.storage_bytes >> 20):
                fh.write(os.urandom(1 << 20))
            fh.flush()
            os.fsync(fh.fileno())
        # one untimed read first: the first read of a new file also fills caches below this
        # machine (a virtual disk's host), which would favour whichever side reads second
        read_rates(data, nbytes=args.storage_bytes, repeats=1)
        iters = max(3, (256 << 20) // args.message_bytes)
        precisions, why = precisions_for("cpu", t)
        for line in why:
            print(f"  - {line}")
        for r in range(args.rounds):
            print(f"  round {r + 1} …", flush=True)
            steps: list[tuple[Callable[[], None], Callable[[], None]]] = []

            def gemm_ours() -> None:
                for p in precisions:
                    value = statistics.median(gemm_rates(p, n=n, threads=t, repeats=5).samples)
                    add(ours, f"gemm {p} vs torch.utils.benchmark", value)
                    if p == "fp32":
                        add(ours, "gemm fp32 vs numpy.matmul", value)

            def gemm_ref() -> None:
                add(ref, "gemm fp32 vs numpy.matmul", numpy_gemm(n, t, 5))
                for p in precisions:
                    add(ref, f"gemm {p} vs torch.utils.benchmark", torch_timer_gemm(p, n, t))

            if "gemm" in kinds:
                steps.append((gemm_ours, gemm_ref))

            def triad_ours() -> None:
                add(ours, "memory triad", statistics.median(
                    triad_rates(elements=args.triad_elements, threads=t, repeats=10).samples))

            def triad_ref() -> None:
                if triad_exe is not None:
                    out = subprocess.run([str(triad_exe), str(args.triad_elements), "10"],
                                         capture_output=True, text=True, check=True,
                                         env={**os.environ, "OMP_NUM_THREADS": str(t)})
                    add(ref, "memory triad",
                        statistics.median(float(x) for x in out.stdout.split()))

            if "memory" in kinds:
                steps.append((triad_ours, triad_ref))

            def link_ours() -> None:
                for stack in ("mpi-ob1", "mpi-ucx"):
                    run = link_rates(stack, patterns=["oneway", "alltoall"],
                                     sizes=[args.message_bytes], ranks=2, repeats=5,
                                     block_bytes=iters * args.message_bytes)
                    for res in run.results:
                        add(ours, f"link {stack} {res.pattern}", statistics.median(res.samples))

            def link_ref() -> None:
                if link_exe is not None:
                    for stack in ("mpi-ob1", "mpi-ucx"):
                        for pattern, v in c_link(link_exe, stack, args.message_bytes, iters,
                                                 5).items():
                            add(ref, f"link {stack} {pattern}", v)
                add(ref, "ucx_perftest tag_bw (one way, streaming)",
                    ucx_perftest(args.message_bytes, 13417))

            if "link" in kinds:
                steps.append((link_ours, link_ref))

            def storage_ours() -> None:
                res = read_rates(data, nbytes=args.storage_bytes, repeats=1)
                add(ours, "storage cold", res.cold[0])
                add(ours, "storage warm", res.warm[0])

            def storage_ref() -> None:
                cold, warm = dd_reads(data)
                add(ref, "storage cold", cold)
                add(ref, "storage warm", warm)

            if "storage" in kinds:
                steps.append((storage_ours, storage_ref))
            for a, b in steps:
                for fn in ((a, b) if r % 2 == 0 else (b, a)):
                    fn()
    print(f"  load average at the end {os.getloadavg()[0]:.2f}")
    print()
    print(f"{'bound (median of rounds)':<42} {'tunelab':>14} {'reference':>14} {'ratio':>7}  "
          "rounds: tunelab | reference")
    print("-" * 118)
    for key in dict.fromkeys([*ours, *ref]):
        a, b = _median(ours.get(key, [])), _median(ref.get(key, []))
        unit, scale = ("GFLOP/s", 1e9) if key.startswith("gemm") else ("GB/s", 1e9)
        ratio = f"{a / b:7.2f}" if a and b else f"{'—':>7}"
        fa = f"{a / scale:10.2f} {unit}" if a else "—"
        fb = f"{b / scale:10.2f} {unit}" if b else "—"
        runs = (", ".join(f"{x / scale:.2f}" for x in ours.get(key, [])) + " | "
                + ", ".join(f"{x / scale:.2f}" for x in ref.get(key, [])))
        print(f"{key:<42} {fa:>14} {fb:>14} {ratio}  {runs}")
    print("-" * 118)
    within = [k for k in ours if k in ref and abs(_median(ours[k]) / _median(ref[k]) - 1) <= 0.1]
    print(f"within 10% of the reference: {len(within)} of "
          f"{sum(1 for k in ours if k in ref)} bounds")


if __name__ == "__main__":
    main()
