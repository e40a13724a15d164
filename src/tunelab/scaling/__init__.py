"""Scaling analysis over a study's runs: speedup, efficiency, Karp–Flatt, scale-up vs
scale-out, and a fitted step-time model that predicts worker counts not measured.

Pure functions over the runs table of :mod:`tunelab.store` (one row per run; parameters as
columns; figures of merit as ``fom.<name>``), reusable by every workload with a worker-count
axis. The worker count and the layout (nodes) are read from the parameters ``workers`` and
``nodes`` when the study sweeps them, else from the figures of merit of the same names.
Runs that differ in other parameters form separate *series*.

Definitions (N workers, baseline = the series' smallest worker count N0, usually 1):

* **speedup** S(N) = X(N) / X(N0) for a throughput X (maximised), t(N0) / t(N) for a time;
  its 95 % interval is :func:`tunelab.stats.compare`'s (Welch t of the log ratio of
  means, see docs/statistics.md). **Efficiency** E = S / (N / N0). **Karp–Flatt** serial fraction
  e = (1/S − 1/p) / (1 − 1/p) with p = N / N0 (undefined for p = 1).
* **Scale-up vs scale-out** at equal N: each layout with more nodes compared with the layout
  with the fewest (ratio of means, > 1: more nodes is faster), with a verdict.
* **Step-time model** (:class:`StepModel`), N workers on k nodes, S gradient bytes per step::

      t_step(N, k) = compute(N, k) + overhead · h(N) + max( t_ring(N, k), ring(N) · S / L )
      compute(N, k) = c · (1 + m · (u − 1))   u = workers sharing a host: N on one host
                                            (virtual nodes), else N / k
      ring(N)      = 2 (N − 1) / N        bytes over each ring edge per byte reduced
      t_ring(N, k) = ring(N) · S / B      B = B_link when the ring crosses nodes (k > 1),
                                          else B_host (the critical path: the slowest edge)

  ``B_host`` is the all-reduce bandwidth inside a node (shared memory, loopback, NVLink),
  ``B_link`` between nodes; both are fitted. ``L`` is a configured link limit (``tc tbf``
  rate), a floor and not fitted. When every worker shares the CPU of one machine (gloo on
  virtual nodes: ``hosts == 1``) and there are more workers than its C cores, the edges no
  longer run in parallel: the CPU serves all N of them, so ``t_ring`` becomes
  ring(N) · S · ((N − e) / B_host + e / B_link) / C with e = k edges crossing nodes
  (none for k = 1), and the per-worker ``overhead`` is shared likewise: h(N) = max(1, N / C)
  (h = 1 on GPUs or separate hosts). ``overhead``, 1/B_host and 1/B_link are fitted by
  non-negative least squares (relative errors) to the measured step times minus the
  modelled compute. Compute is fitted first, to the measured compute times: c at one
  worker per host and the contention m ≥ 0 — how much slower a worker computes per other
  worker sharing its host's memory bandwidth and cores (0 for emulated accelerators) —
  with c / N under strong scaling (fixed global batch). Throughput = samples per step /
  t_step.
* **Validity** (:mod:`~tunelab.scaling.validity`): the model is checked on sizes held out
  of the fit — the largest worker count (extrapolation) and each interior one
  (interpolation); a forecast carries a prediction interval, is refused beyond the
  measured sizes when the extrapolation check missed by more than 15 % (or could not be
  made), and warns beyond 2x the largest measured size. It never returns NaN.

Modules: :mod:`~tunelab.scaling.tables` (speedup tables, layout gaps),
:mod:`~tunelab.scaling.model` (observations, the model, its fit),
:mod:`~tunelab.scaling.validity` (checks, forecasts).
"""

from __future__ import annotations

from tunelab.scaling.model import (
    Observation,
    StepModel,
    fit_step_model,
    observations,
    ring_factor,
    sharing_count,
)
from tunelab.scaling.tables import (
    LayoutGap,
    ScalingPoint,
    karp_flatt,
    layout_gaps,
    scaling_table,
)
from tunelab.scaling.validity import (
    MAX_FACTOR,
    TOLERANCE,
    Forecast,
    Holdout,
    Prediction,
    Validation,
    forecast,
    holdout,
    validate,
)

__all__ = [
    "MAX_FACTOR",
    "TOLERANCE",
    "Forecast",
    "Holdout",
    "LayoutGap",
    "Observation",
    "Prediction",
    "ScalingPoint",
    "StepModel",
    "Validation",
    "fit_step_model",
    "forecast",
    "holdout",
    "karp_flatt",
    "layout_gaps",
    "observations",
    "ring_factor",
    "scaling_table",
    "sharing_count",
    "validate",
]
