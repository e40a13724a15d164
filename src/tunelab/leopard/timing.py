"""Timing candidates side by side: windows per second of callables (forward passes, training
steps), called back to back in alternating order over a few rounds, so that a busy moment of a
shared machine hits them alike; :func:`speedup` compares two of them round by round. What
:mod:`tunelab.leopard.runtime` chooses threads, precision, kernels and the training layout by.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["medians", "probe_rates", "rate", "speedup", "sync"]


def rate(fn: Callable[[torch.Tensor], Any], x: torch.Tensor, reps: int) -> float:
    """Windows per second of ``fn`` on ``x``: the best of ``reps`` timed calls."""
    best = float("inf")
    for _ in range(reps):
        sync(x)
        t = time.perf_counter()
        fn(x)
        sync(x)
        best = min(best, time.perf_counter() - t)
    return x.shape[0] / best


def sync(x: torch.Tensor) -> None:
    """Wait for the device's queued work (a GPU runs asynchronously)."""
    if x.is_cuda:
        torch.cuda.synchronize(x.device)


def probe_rates(fns: Mapping[str, Callable[[torch.Tensor], Any]], x: torch.Tensor,
                rounds: int = 3, grad: bool = False) -> dict[str, list[float]]:
    """Windows/s of several candidates in every round, called back to back (so a busy moment
    of the machine hits them alike; compare them with :func:`speedup`). ``grad``: the
    candidates are training steps (no inference mode)."""
    with contextlib.nullcontext() if grad else torch.inference_mode():
        for fn in fns.values():
            fn(x)  # warm-up: oneDNN picks and caches its kernels
        rates: dict[str, list[float]] = {k: [] for k in fns}
        order = list(fns.items())
        for r in range(rounds):
            for k, fn in order if r % 2 == 0 else order[::-1]:  # neither always goes first
                rates[k].append(rate(fn, x, 1))
    return rates


def speedup(rates: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of ``a``'s rate over ``b``'s in the same round."""
    return statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True))


def medians(rates: dict[str, list[float]]) -> dict[str, float]:
    """The median over rounds of each candidate's rate."""
    return {k: statistics.median(v) for k, v in rates.items()}
