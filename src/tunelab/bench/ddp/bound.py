"""How close a run's real training comes to the machine's compute bound, measured in the run.

After the timed steps (nothing they time waits for it) and after the data loaders have
stopped, every worker of real compute, at the same moment:

* counts the FLOPs of one training step of its model at its local batch
  (:func:`tunelab.bench.ddp.models.flops_per_sample`: ``torch.utils.flop_counter`` on the
  meta device, nothing computed; kept per model, shape and batch);
* times a GEMM in the precision the step computes in
  (:func:`tunelab.bench.ddp.step.gemm_precision`: fp32 on a CPU, fp16 under ``--amp``, TF32
  on a GPU otherwise) with the threads the step ran with: the best of a few ``n x n``
  products of :func:`tunelab.bounds.compute.gemm_rates` (``tunelab bounds``' own measurement,
  at the quick profile's size: 2048 on a CPU, 4096 on a GPU).

The workers' GEMM rates are summed (the throughput is every worker's), and
``bound_fraction`` = throughput x FLOPs per sample / that sum. A fraction above 1 (the
machine was busier while the GEMM ran than during the steps) has its rate measured again, up
to twice, the highest counting: a bound under what the run reached is no bound. Emulated
compute does no arithmetic: nothing is measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunelab.bench.ddp.config import DDPConfig

__all__ = ["InRunBound", "inrun_record", "measure_inrun_bound"]

#: timed products (after one warm-up) and the seconds after which no further one starts
REPEATS = 3
SECONDS = 2.0
#: measurements of the GEMM rate in all, while the run's rate stays above it
TRIES = 3


@dataclass(frozen=True)
class InRunBound:
    """The work of a sample and the GEMM rate of all workers, measured in the run."""

    precision: str  # fp32, tf32, fp16: the arithmetic of the step, as tunelab.bounds names it
    flops_per_sample: float
    local_batch: int
    workers: int
    gemm_flops_per_s: float  # every worker's rate, measured at the same moment, summed
    method: str
    seconds: float  # what counting and timing took (after the timed steps)

    def achieved(self, throughput: float) -> float:
        """The training FLOP/s of ``throughput`` samples/s."""
        return throughput * self.flops_per_sample

    def fraction(self, throughput: float) -> float:
        """``throughput`` as a fraction of the bound (1 = the GEMM rate)."""
        return self.achieved(throughput) / self.gemm_flops_per_s

    def record(self, throughput: float) -> dict[str, Any]:
        """The figures of merit: the work of a step, the rates and their fraction."""
        return {"flops_per_sample": self.flops_per_sample,
                "flops_per_step": self.flops_per_sample * self.local_batch * self.workers,
                "achieved_flops_per_s": self.achieved(throughput),
                "gemm_flops_per_s": self.gemm_flops_per_s,
                "bound_fraction": self.fraction(throughput),
                "gemm_precision": self.precision, "bound_method": self.method,
                "bound_s": self.seconds}


def inrun_record(cfg: DDPConfig, throughput: float, device: str, amp: bool) -> dict[str, Any]:
    """The figures of merit of :func:`measure_inrun_bound` for the run ``cfg`` of real compute
    on ``device`` (``cpu`` or ``cuda``), ``amp`` or not; ``{"bound_error": …}`` where it
    cannot be measured (a model the counter cannot trace, a GEMM out of memory): it never
    fails the run."""
    from tunelab.bench.ddp.step import gemm_precision

    shape = {"image_size": cfg.image_size, "window": cfg.window, "patch": cfg.patch}
    try:
        found = measure_inrun_bound(cfg.model, shape, cfg.local_batch, throughput,
                                    gemm_precision(device, amp), device)
    except Exception as exc:
        return {"bound_error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"}
    return found.record(throughput)


def measure_inrun_bound(model: str, shape: dict[str, int], local_batch: int,
                        throughput: float, precision: str, device: str) -> InRunBound:
    """Count the work of a sample of ``model`` (``shape``: ``image_size``, ``window``,
    ``patch``) at ``local_batch`` and time the GEMM rate in ``precision`` on ``device``
    (``cpu`` or ``cuda``), summed over the workers of the process group; every worker calls
    it at the same point (it holds collectives). Errors of the count or the GEMM propagate:
    the caller decides that the run stands without the bound."""
    import torch.distributed as dist

    from tunelab.bench.ddp.models import flops_per_sample

    t0 = time.perf_counter()
    per_sample = flops_per_sample(model, batch=local_batch, **shape)
    world = dist.get_world_size() if dist.is_initialized() else 1
    rate, method = 0.0, ""
    for _ in range(TRIES):
        now, how = _summed_gemm(precision, device, world)
        if now > rate:
            rate, method = now, how
        if throughput * per_sample <= rate:
            break
    return InRunBound(precision, per_sample, local_batch, world, rate, method,
                      time.perf_counter() - t0)


def _summed_gemm(precision: str, device: str, world: int) -> tuple[float, str]:
    """Every worker's best GEMM rate, measured at once (a barrier first) and summed."""
    import torch
    import torch.distributed as dist

    from tunelab.bounds.compute import gemm_rates, quick_gemm_n

    if world > 1:
        dist.barrier()
    rates = gemm_rates(precision, n=quick_gemm_n(device), device=device, repeats=REPEATS,
                       seconds=SECONDS, numpy_too=False)
    best = max(rates.samples)
    if world == 1:
        return best, rates.method
    where = f"cuda:{torch.cuda.current_device()}" if device == "cuda" else "cpu"
    total = torch.tensor([best], dtype=torch.float64, device=where)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return float(total.item()), f"{world} workers x {rates.method}, summed"
