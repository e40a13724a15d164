"""How close a run's real training comes to the machine's compute bound, measured in the run.

Every worker of real compute, at the same moments (each measurement holds collectives):

* times a GEMM in the precision the step computes in
  (:func:`tunelab.bench.ddp.step.gemm_precision`: fp32 on a CPU, fp16 under ``--amp``, TF32
  on a GPU otherwise) with the threads the step runs with: the best of a few ``n x n``
  products of :func:`tunelab.bounds.compute.gemm_rates` (``tunelab bounds``' own measurement,
  at the quick profile's size: 2048 on a CPU, 4096 on a GPU) -- once **before** the warm-up
  (:func:`gemm_before`; the warm-up steps run after it, so the timed steps find the caches
  as they would without it) and once **after** the timed steps and after the data loaders
  have stopped (nothing the steps time waits for either);
* counts the FLOPs of one training step of its model at its local batch
  (:func:`tunelab.bench.ddp.models.flops_per_sample`: ``torch.utils.flop_counter`` on the
  meta device, nothing computed; kept per model, shape and batch).

Each measurement sums the workers' rates (the throughput is every worker's). On a shared
machine the rate moves with what else runs: a GEMM timed while others took the cores and the
steps had them made ResNet-18 "run at 2.40 of its bound". The **highest** rate measured counts
(:func:`highest`: the least disturbed; a bound under what the run reached is no bound), and
while the run's rate stays above it the GEMM is measured once more after the steps
(``AFTER_TRIES`` in all). ``bound_fraction`` = throughput x FLOPs per sample / that rate; one
still above 1 is recorded as it is (``gemm_under_load``: the steps outran the GEMM every time
it was measured -- others' load slowed the GEMM more than the steps, as a load that stayed
can: on the shared 2-core EPYC a GEMM of both threads fell to a third of its rate beside two
busy loops, the steps far less; or the model's kernels beat the GEMM: oneDNN's convolutions
ran ResNet-18 at 152 GFLOP/s beside ``torch.matmul``'s 126-134 with no load) and said so
wherever it is shown. Emulated compute does no arithmetic: nothing is measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunelab.bench.ddp.config import DDPConfig

__all__ = ["AFTER_TRIES", "GemmProbe", "InRunBound", "gemm_before", "highest", "inrun_record",
           "measure_inrun_bound", "probe_gemm"]

#: timed products (after one warm-up) and the seconds after which no further one starts
REPEATS = 3
SECONDS = 2.0
#: measurements of the GEMM rate after the timed steps, at most: the second only while the
#: run's rate stays above every rate measured so far
AFTER_TRIES = 2


@dataclass(frozen=True)
class GemmProbe:
    """One measurement of the GEMM rate, every worker's at the same moment, summed."""

    when: str  # "before" (the warm-up) or "after" (the timed steps)
    flops_per_s: float
    method: str
    seconds: float  # what the measurement took


def highest(probes: Sequence[GemmProbe]) -> GemmProbe:
    """The bound's rate: the highest of ``probes`` (the least disturbed by others' load: a
    GEMM can only be slowed by them, never sped up); the first of equal rates."""
    return max(probes, key=lambda p: p.flops_per_s)


@dataclass(frozen=True)
class InRunBound:
    """The work of a sample and the GEMM rate of all workers, measured in the run."""

    precision: str  # fp32, tf32, fp16: the arithmetic of the step, as tunelab.bounds names it
    flops_per_sample: float
    local_batch: int
    workers: int
    gemm_flops_per_s: float  # the highest of the probes: every worker's rate, summed
    method: str
    seconds: float  # what counting and timing took, before and after the timed steps
    probes: tuple[GemmProbe, ...] = ()

    def achieved(self, throughput: float) -> float:
        """The training FLOP/s of ``throughput`` samples/s."""
        return throughput * self.flops_per_sample

    def fraction(self, throughput: float) -> float:
        """``throughput`` as a fraction of the bound (1 = the GEMM rate)."""
        return self.achieved(throughput) / self.gemm_flops_per_s

    def _rate(self, when: str) -> float | None:
        rates = [p.flops_per_s for p in self.probes if p.when == when]
        return max(rates) if rates else None

    def record(self, throughput: float) -> dict[str, Any]:
        """The figures of merit: the work of a step, the rates and their fraction; the
        highest rate before and after the timed steps and how many times it was measured;
        ``gemm_under_load`` (1) where the fraction is still above 1."""
        fraction = self.fraction(throughput)
        chosen = highest(self.probes).when if self.probes else "after"
        return {"flops_per_sample": self.flops_per_sample,
                "flops_per_step": self.flops_per_sample * self.local_batch * self.workers,
                "achieved_flops_per_s": self.achieved(throughput),
                "gemm_flops_per_s": self.gemm_flops_per_s,
                "gemm_before_flops_per_s": self._rate("before"),
                "gemm_after_flops_per_s": self._rate("after"),
                "gemm_measurements": len(self.probes), "gemm_chosen": chosen,
                "bound_fraction": fraction, "gemm_under_load": fraction > 1,
                "gemm_precision": self.precision, "bound_method": self.method,
                "bound_s": self.seconds}


def gemm_before(cfg: DDPConfig, device: str, amp: bool) -> GemmProbe | None:
    """The GEMM rate before the warm-up of the run ``cfg`` of real compute on ``device``
    (``cpu`` or ``cuda``), ``amp`` or not; None where it cannot be measured (the measurement
    after the steps then says why): it never fails the run. Every worker calls it."""
    from tunelab.bench.ddp.step import gemm_precision

    try:
        return probe_gemm("before", gemm_precision(device, amp), device)
    except Exception:
        return None


def inrun_record(cfg: DDPConfig, throughput: float, device: str, amp: bool,
                 before: GemmProbe | None = None) -> dict[str, Any]:
    """The figures of merit of :func:`measure_inrun_bound` for the run ``cfg`` of real compute
    on ``device`` (``cpu`` or ``cuda``), ``amp`` or not, ``before`` the rate
    :func:`gemm_before` measured; ``{"bound_error": …}`` where it cannot be measured (a model
    the counter cannot trace, a GEMM out of memory): it never fails the run."""
    from tunelab.bench.ddp.step import gemm_precision

    shape = {"image_size": cfg.image_size, "window": cfg.window, "patch": cfg.patch}
    try:
        found = measure_inrun_bound(cfg.model, shape, cfg.local_batch, throughput,
                                    gemm_precision(device, amp), device, before=before)
    except Exception as exc:
        return {"bound_error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"}
    return found.record(throughput)


def measure_inrun_bound(model: str, shape: dict[str, int], local_batch: int,
                        throughput: float, precision: str, device: str,
                        before: GemmProbe | None = None,
                        probe: Callable[[str, str, str], GemmProbe] | None = None,
                        ) -> InRunBound:
    """Count the work of a sample of ``model`` (``shape``: ``image_size``, ``window``,
    ``patch``) at ``local_batch`` and time the GEMM rate in ``precision`` on ``device``
    (``cpu`` or ``cuda``), summed over the workers of the process group, after the timed
    steps: up to ``AFTER_TRIES`` times while ``throughput`` stays above the highest rate,
    ``before`` (the rate measured before the warm-up) counting as one of them. ``probe``
    (``when, precision, device``; default :func:`probe_gemm`) is the seam that measures.
    Every worker calls it at the same point (it holds collectives). Errors of the count or
    the GEMM propagate: the caller decides that the run stands without the bound."""
    import torch.distributed as dist

    from tunelab.bench.ddp.models import flops_per_sample

    measure = probe or probe_gemm
    t0 = time.perf_counter()
    per_sample = flops_per_sample(model, batch=local_batch, **shape)
    counted_s = time.perf_counter() - t0
    world = dist.get_world_size() if dist.is_initialized() else 1
    probes = [before] if before is not None else []
    for _ in range(AFTER_TRIES):
        probes.append(measure("after", precision, device))
        if throughput * per_sample <= highest(probes).flops_per_s:
            break
    best = highest(probes)
    return InRunBound(precision, per_sample, local_batch, world, best.flops_per_s,
                      best.method, counted_s + sum(p.seconds for p in probes), tuple(probes))


def probe_gemm(when: str, precision: str, device: str) -> GemmProbe:
    """Every worker's best GEMM rate, measured at once (a barrier first) and summed;
    ``when``: ``before`` or ``after`` the timed steps."""
    import torch
    import torch.distributed as dist

    from tunelab.bounds.compute import gemm_rates, quick_gemm_n

    t0 = time.perf_counter()
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world > 1:
        dist.barrier()
    rates = gemm_rates(precision, n=quick_gemm_n(device), device=device, repeats=REPEATS,
                       seconds=SECONDS, numpy_too=False)
    best = max(rates.samples)
    if world == 1:
        return GemmProbe(when, best, rates.method, time.perf_counter() - t0)
    where = f"cuda:{torch.cuda.current_device()}" if device == "cuda" else "cpu"
    total = torch.tensor([best], dtype=torch.float64, device=where)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return GemmProbe(when, float(total.item()), f"{world} workers x {rates.method}, summed",
                     time.perf_counter() - t0)
