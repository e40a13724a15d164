"""Arithmetic and memory limits: GEMM FLOP/s per precision and a STREAM-style triad.

The device is chosen by one capability check, :func:`cuda_available`. On a CPU the GEMM runs
``torch.matmul`` with the thread count a study will use (``fp32``, and ``bf16`` when a
measurement at run time shows it is not slower than fp32: CPUs without native bf16 emulate
it 10-40x slower, and no constant can say which kind this one is). fp32 is also measured with
numpy's ``matmul`` (its own BLAS, in a child process whose BLAS runs the same thread count),
and the faster library's rate is the bound: on the project's AMD EPYC numpy's OpenBLAS ran
fp32 at 202 GFLOP/s where torch ran 179, and a bound under what a library reaches is no
bound. Without torch, numpy's ``matmul`` alone gives fp32. On a CUDA device: ``fp32`` (TF32
off), ``tf32``, ``bf16`` and ``fp16``, timed with CUDA events. The triad is ``a = b + s*c``
over float64 arrays much larger than the caches, counted as STREAM counts it: 24 bytes per
element (two reads, one write). Torch and numpy are imported on use.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Rates", "bf16_worth_it", "cpu_threads", "cuda_available", "device_precisions",
           "gemm_rates", "precisions_for", "quick_gemm_n", "triad_rates"]

_FLOP_PER_FMA = 2


@dataclass(frozen=True)
class Rates:
    """Samples of one measurement (FLOP/s or bytes/s) and how they were taken."""

    samples: tuple[float, ...]
    method: str


def cpu_threads() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _threads(n: int) -> str:
    return f"{n} thread{'' if n == 1 else 's'}"


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def cuda_available() -> bool:
    """The one capability check: a CUDA device that torch can use."""
    torch = _torch()
    return bool(torch is not None and torch.cuda.is_available())


def device_precisions(device: str) -> tuple[str, ...]:
    """The precisions worth measuring on ``device`` (``cpu`` or ``cuda``)."""
    return ("fp32", "tf32", "bf16", "fp16") if device == "cuda" else ("fp32", "bf16")


_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _timed_samples(step: Callable[[], float], repeats: int, seconds: float) -> list[float]:
    """Run ``step`` (returns the seconds one timed unit took) ``repeats`` times, or fewer
    when ``seconds`` run out after the first."""
    out: list[float] = []
    end = time.perf_counter() + seconds
    for _ in range(max(1, repeats)):
        out.append(step())
        if time.perf_counter() > end:
            break
    return out


def quick_gemm_n(device: str) -> int:
    """The matrix size of a quick GEMM measurement on ``device`` (``cpu`` or ``cuda``): 2048
    on a CPU (1024 ran at half the 2048 rate on a 2-core EPYC: too small to be a bound), 4096
    on a GPU."""
    return 4096 if device == "cuda" else 2048


def gemm_rates(precision: str, *, n: int, device: str = "cpu", threads: int | None = None,
               repeats: int = 5, seconds: float = 10.0, numpy_too: bool = True) -> Rates:
    """FLOP/s samples of an ``n x n`` by ``n x n`` product (2 n^3 FLOPs each): on a CPU in
    fp32 those of the faster of torch and numpy (``numpy_too=False``: torch's alone)."""
    rates = _torch_gemm(precision, n, device, threads, repeats, seconds)
    if not (numpy_too and device == "cpu" and precision == "fp32" and _torch() is not None):
        return rates
    other = _numpy_gemm_child(n, threads or cpu_threads(), repeats, seconds)
    if other is None or statistics.median(other.samples) <= statistics.median(rates.samples):
        return rates
    return Rates(other.samples, f"{other.method}; torch.matmul: "
                                f"{statistics.median(rates.samples) / 1e9:,.1f} GFLOP/s")


def _torch_gemm(precision: str, n: int, device: str, threads: int | None, repeats: int,
                seconds: float) -> Rates:
    torch = _torch()
    if torch is None:
        if precision != "fp32" or device != "cpu":
            raise RuntimeError(f"{precision} on {device} needs torch")
        return _numpy_gemm(n, repeats, seconds)
    flops = _FLOP_PER_FMA * float(n) ** 3
    if device == "cuda":
        return _cuda_gemm(torch, precision, n, flops, repeats, seconds)
    if threads:
        torch.set_num_threads(threads)
    dtype = getattr(torch, _DTYPES[precision])
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(dtype)
    b = torch.randn(n, n, generator=gen).to(dtype)
    c = torch.empty(n, n, dtype=dtype)
    torch.matmul(a, b, out=c)  # warm-up: the library picks its kernel

    def step() -> float:
        t = time.perf_counter()
        torch.matmul(a, b, out=c)
        return time.perf_counter() - t

    samples = [flops / s for s in _timed_samples(step, repeats, seconds)]
    return Rates(tuple(samples), f"torch.matmul {n}^3 {precision}, "
                                 f"{_threads(torch.get_num_threads())}")


def _cuda_gemm(torch: Any, precision: str, n: int, flops: float, repeats: int,
               seconds: float) -> Rates:
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    matmul.allow_tf32 = precision == "tf32"
    try:
        dtype = getattr(torch, _DTYPES[precision])
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        c = torch.empty(n, n, device="cuda", dtype=dtype)
        inner = 10
        for _ in range(3):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()

        def step() -> float:
            start, stop = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            for _ in range(inner):
                torch.matmul(a, b, out=c)
            stop.record()
            stop.synchronize()
            return float(start.elapsed_time(stop)) / 1e3 / inner

        samples = [flops / s for s in _timed_samples(step, repeats, seconds)]
    finally:
        matmul.allow_tf32 = before
    return Rates(tuple(samples), f"torch.matmul {n}^3 {precision} on "
                                 f"{torch.cuda.get_device_name()}")


_BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _numpy_gemm_child(n: int, threads: int, repeats: int, seconds: float) -> Rates | None:
    """:func:`_numpy_gemm` in a child process whose BLAS runs ``threads`` threads (a BLAS
    reads its thread count when numpy is imported); None when the child fails."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, **dict.fromkeys(_BLAS_THREAD_VARIABLES, str(threads))}
    code = ("import sys\n"
            "from tunelab.bounds.compute import _numpy_gemm\n"
            "r = _numpy_gemm(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))\n"
            "print(*r.samples)\n")
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(n), str(repeats), str(seconds)],
                              env=env, capture_output=True, text=True, timeout=60 + 3 * seconds)
        samples = tuple(float(x) for x in proc.stdout.split())
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    if proc.returncode != 0 or not samples:
        return None
    return Rates(samples, f"numpy.matmul {n}^3 fp32, {_threads(threads)} of its BLAS")


def _numpy_gemm(n: int, repeats: int, seconds: float) -> Rates:
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)
    np.matmul(a, b, out=c)

    def step() -> float:
        t = time.perf_counter()
        np.matmul(a, b, out=c)
        return time.perf_counter() - t

    flops = _FLOP_PER_FMA * float(n) ** 3
    samples = [flops / s for s in _timed_samples(step, repeats, seconds)]
    return Rates(tuple(samples), f"numpy.matmul {n}^3 fp32 (its BLAS's threads)")


def triad_rates(*, elements: int, device: str = "cpu", threads: int | None = None,
                repeats: int = 10, seconds: float = 10.0) -> Rates:
    """Bytes/s samples of ``a = b + 3 c`` over ``elements`` float64 values (24 bytes each)."""
    torch = _torch()
    moved = 24.0 * elements
    if torch is None:
        if device != "cpu":
            raise RuntimeError("a triad on a device needs torch")
        return _numpy_triad(elements, moved, repeats, seconds)
    if threads and device == "cpu":
        torch.set_num_threads(threads)
    a, b, c = (torch.full((elements,), v, dtype=torch.float64, device=device)
               for v in (0.0, 1.0, 2.0))
    sync: Callable[[], None] = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.add(b, c, alpha=3.0, out=a)
    sync()

    def step() -> float:
        t = time.perf_counter()
        torch.add(b, c, alpha=3.0, out=a)
        sync()
        return time.perf_counter() - t

    samples = [moved / s for s in _timed_samples(step, repeats, seconds)]
    who = _threads(torch.get_num_threads()) if device == "cpu" else device
    return Rates(tuple(samples), f"triad a = b + 3c, {elements:,} float64 "
                                 f"({moved / 2**20:,.0f} MiB a pass), torch.add, {who}")


def _numpy_triad(elements: int, moved: float, repeats: int, seconds: float) -> Rates:
    """One thread: the product ``3 c`` of a cache-sized block goes to scratch that stays in
    the cache, so memory sees the triad's own traffic only."""
    import numpy as np

    a, b, c = (np.full(elements, v) for v in (0.0, 1.0, 2.0))
    block = 1 << 15
    tmp = np.empty(block)

    def step() -> float:
        t = time.perf_counter()
        for lo in range(0, elements, block):
            hi = min(lo + block, elements)
            np.multiply(c[lo:hi], 3.0, out=tmp[:hi - lo])
            np.add(b[lo:hi], tmp[:hi - lo], out=a[lo:hi])
        return time.perf_counter() - t

    step()
    samples = [moved / s for s in _timed_samples(step, repeats, seconds)]
    return Rates(tuple(samples), f"triad a = b + 3c, {elements:,} float64, numpy, 1 thread")


def bf16_worth_it(threads: int | None, n: int = 512) -> tuple[bool, float]:
    """Whether bf16 GEMM may be as fast as fp32 here, from small trials at run time
    (``(verdict, best bf16 / fp32)``), so a CPU that emulates bf16 does not spend the quick
    budget on a product 40x slower than fp32. A trial under 0.5x is tried once more (a busy
    machine can stall one), and the full measurement decides in the end."""
    if _torch() is None:
        return False, 0.0
    ratio = 0.0
    for _ in range(2):
        fp32 = max(gemm_rates("fp32", n=n, threads=threads, repeats=5, seconds=1.0,
                              numpy_too=False).samples)
        bf16 = max(gemm_rates("bf16", n=n, threads=threads, repeats=5, seconds=1.0).samples)
        ratio = max(ratio, bf16 / fp32)
        if ratio >= 0.5:
            break
    return ratio >= 0.5, ratio


def precisions_for(device: str, threads: int | None,
                   trial: Callable[[int | None], tuple[bool, float]] = bf16_worth_it,
                   ) -> tuple[list[str], list[str]]:
    """The precisions to measure on ``device`` and notes on any left out."""
    wanted: Sequence[str] = device_precisions(device)
    if device == "cuda" or _torch() is None:
        return (list(wanted) if _torch() is not None else ["fp32"]), (
            [] if _torch() is not None else ["bf16: torch is not installed (numpy fp32 only)"])
    ok, ratio = trial(threads)
    if ok:
        return list(wanted), []
    return ["fp32"], [f"bf16 left out: a trial ran it at {ratio:.2f}x the fp32 rate (this CPU "
                      "does not do bf16 arithmetic natively)"]
