"""The arithmetic bound of a run's windows/s, measured in that run.

At a fixed shape the work of a window is fixed (``flops_per_window``: about 1.0 GFLOP
forward and 3.0 with the backward pass per 10,240-bp window), so windows/s cannot exceed
the device's GEMM rate in the precision the run computes in, divided by that work. The rate
is measured here, in the same process, with the threads the run uses and at the moment it
runs (a constant for "this CPU" would be wrong on the next machine and on a busy one): the
best of a few ``torch.matmul`` products of ``n x n`` matrices, measured again at the end
(:meth:`Bound.remeasured`: the higher rate counts). :meth:`Bound.fraction` is what every
windows/s figure is printed beside. On a CPU only: the CUDA paths are measured
by ``benchmarks/leopard_gpu.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Bound", "measure_bound"]

#: matrix size and timed repeats of the CPU's GEMM (17 GFLOP each, ~0.3 s in all on 2 cores;
#: 1024^3 ran at half the rate of 2048^3 on a 2-core EPYC: no bound)
GEMM_N = 2048
REPEATS = 3
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Bound:
    """A GEMM rate measured in this run and the work of one window."""

    precision: str  # fp32, bf16 or fp16: the arithmetic the run computes in
    flops_per_s: float
    flops_per_window: float
    threads: int
    workers: int = 1  # data-parallel workers whose rates (measured at once) are summed

    def fraction(self, windows_per_s: float) -> float:
        """``windows_per_s`` as a fraction of the bound (1 = the GEMM rate)."""
        return windows_per_s * self.flops_per_window / self.flops_per_s

    def beside(self, windows_per_s: float) -> str:
        """``0.43 of bound``: what follows a windows/s figure."""
        return f"{self.fraction(windows_per_s):.2f} of bound"

    def remeasured(self, repeats: int = REPEATS,
                   together: Callable[[Bound], Bound] | None = None) -> Bound:
        """The higher of this rate and one measured now: on a shared machine the rate moves
        with the load, and a bound under what the run reached is no bound. ``together``
        turns the rate measured now into the bound this one is (the DDP workers' rates
        summed, see ``tunelab.leopard.train``)."""
        now = measure_bound(self.precision, self.flops_per_window, self.threads,
                            repeats=repeats)
        if together is not None:
            now = together(now)
        return self if self.flops_per_s >= now.flops_per_s else now

    def describe(self) -> str:
        """How the bound was measured, in one phrase."""
        return (f"{self.precision} GEMM bound {self.flops_per_s / 1e9:,.1f} GFLOP/s "
                f"(torch.matmul {GEMM_N}^3, "
                f"{f'{self.workers} workers x ' if self.workers > 1 else ''}{self.threads} "
                f"thread{'s' if self.threads != 1 else ''}, this run) / "
                f"{self.flops_per_window / 1e9:.3f} GFLOP a window = "
                f"{self.flops_per_s / self.flops_per_window:,.1f} windows/s")


def measure_bound(precision: str, flops_per_window: float, threads: int | None = None,
                  n: int = GEMM_N, repeats: int = REPEATS) -> Bound:
    """The best rate of ``repeats`` ``n x n`` products in ``precision`` (fp32, bf16 or
    fp16) on the CPU with ``threads`` (default: torch's current count)."""
    dtype = _DTYPES.get(precision, torch.float32)
    before = torch.get_num_threads()
    # resize torch's thread pool only when asked to: a set_num_threads while the run's loader
    # thread uses the pool aborted a DDP worker at its end ("terminate called without an
    # active exception", 1 run in 6 of test_two_process_ddp_matches_one_process)
    change = threads if threads and threads != before else None
    if change is not None:
        torch.set_num_threads(change)
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(n, n, generator=gen).to(dtype)
        b = torch.randn(n, n, generator=gen).to(dtype)
        c = torch.empty(n, n, dtype=dtype)
        torch.matmul(a, b, out=c)  # warm-up: the library picks its kernel
        best = float("inf")
        for _ in range(max(1, repeats)):
            t = time.perf_counter()
            torch.matmul(a, b, out=c)
            best = min(best, time.perf_counter() - t)
        used = torch.get_num_threads()
    finally:
        if change is not None:
            torch.set_num_threads(before)
    return Bound(precision if precision in _DTYPES else "fp32",
                 2.0 * n ** 3 / max(best, 1e-9), flops_per_window, used)
