"""The fitted step-time model of data-parallel training (see :mod:`tunelab.scaling` for the
formula), fitted to the per-point means of a study (:func:`observations`): compute and its
contention from the measured compute times, then the all-reduce terms by non-negative least
squares on relative errors. Its checks and forecasts are in :mod:`tunelab.scaling.validity`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from tunelab.scaling.tables import axis_values, ok_runs
from tunelab.stats import StatsError, fom_column

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Observation", "StepModel", "features", "fit_step_model", "observations",
           "ring_factor", "sharing_count"]


def ring_factor(workers: int | float) -> float:
    """Bytes a ring all-reduce sends over each worker's link per byte reduced: 2(N−1)/N."""
    return 2.0 * (workers - 1) / workers


@dataclass(frozen=True)
class Observation:
    """The mean of one (workers, nodes) point's runs, as the model sees it."""

    workers: int
    nodes: int
    n: int
    step_s: float
    compute_s: float
    grad_bytes: float
    samples_per_step: float
    throughput: float
    hosts: int
    host_cores: float
    gpu: bool
    link_limit_bw: float


def observations(runs: pd.DataFrame, *, workers: str = "workers", nodes: str = "nodes",
                 series: str | None = None) -> list[Observation]:
    """Per (workers, nodes) point, the means the model needs (``step_s``, ``compute_s``,
    ``grad_bytes``, samples per step, ``hosts``, ``host_cores``, ``gpu``, ``link_gbit``
    FOMs; missing ones: 1 host, no core count, CPU, no limit). With several
    series, pass the one to use (``series``: its key as in :class:`ScalingPoint`)."""
    ok = ok_runs(runs, "step_s", workers, nodes)
    keys = sorted(ok["_series"].unique())
    if series is None and len(keys) > 1:
        raise StatsError(f"the runs hold several series ({'; '.join(keys)}): name one")
    if series is not None:
        if series not in keys:
            raise StatsError(f"no series {series!r}; the runs hold: {'; '.join(keys)}")
        ok = ok[ok["_series"] == series]
    for name in ("compute_s", "grad_bytes", "throughput"):
        if fom_column(name) not in ok.columns:
            raise StatsError(f"the model needs the figure of merit {name!r}")
    ok = ok.assign(
        _hosts=axis_values(ok, "hosts", default=1), _cores=axis_values(ok, "host_cores", default=0),
        _gpu=axis_values(ok, "gpu", default=0), _link=axis_values(ok, "link_gbit", default=0),
        _samples=ok[fom_column("throughput")].astype(float) * ok["_value"])
    out = []
    for (n, k), rows in ok.groupby(["_workers", "_nodes"], sort=True):
        def mean(col: str, rows: pd.DataFrame = rows) -> float:
            value = float(rows[col].astype(float).mean())
            return value if math.isfinite(value) else 0.0

        out.append(Observation(
            workers=int(n), nodes=int(k), n=len(rows), step_s=mean("_value"),
            compute_s=mean(fom_column("compute_s")), grad_bytes=mean(fom_column("grad_bytes")),
            samples_per_step=mean("_samples"), throughput=mean(fom_column("throughput")),
            hosts=max(1, round(mean("_hosts"))), host_cores=mean("_cores"),
            gpu=bool(mean("_gpu") > 0.5),
            link_limit_bw=mean("_link") * 1e9 / 8 if mean("_link") > 0 else math.inf))
    return out


@dataclass(frozen=True)
class StepModel:
    """``t_step(N, k)`` (see the module docstring) with its parameters.

    ``compute_s`` is one worker's compute time per step at ``compute_ref_workers`` workers
    when it has a host to itself; with ``strong`` scaling it shrinks as 1/N, else it is
    fixed. ``contention`` is how much slower one worker computes per other worker sharing
    its host (memory bandwidth, shared cores: compute × (1 + contention × (u − 1)) with u
    the workers sharing a host, :func:`sharing_count`), fitted from the measured compute
    times. ``samples_per_worker`` (weak) or ``samples_per_step`` (strong) turn step times
    into throughput. ``shared_cores`` > 0: every worker shares the CPU of one machine with
    that many cores (gloo on virtual nodes); 0: each worker has its own (GPUs, separate
    hosts). ``shared_host``: every worker runs on one host (virtual nodes).
    ``link_limit_bw`` is a configured link rate (bytes/s, a floor; inf for none).
    ``residual_sd`` is the sd of the fit's relative (log) errors on ``fitted_on`` with
    ``residual_df`` degrees of freedom (NaN, 0 when the fit has none to spare).
    """

    overhead_s: float
    host_bw: float
    link_bw: float
    compute_s: float
    grad_bytes: float
    samples_per_worker: float
    shared_cores: float = 0.0
    link_limit_bw: float = math.inf
    strong: bool = False
    compute_ref_workers: int = 1
    samples_per_step: float = 0.0
    fitted_on: tuple[tuple[int, int], ...] = ()
    residual_pct: float = math.nan
    contention: float = 0.0
    shared_host: bool = False
    residual_sd: float = math.nan
    residual_df: int = 0

    def sharing(self, workers: int) -> float:
        """h(N): workers per core of the shared machine (>= 1; 1 when not shared)."""
        if self.shared_cores <= 0:
            return 1.0
        return max(1.0, workers / self.shared_cores)

    def compute(self, workers: int, nodes: int = 1) -> float:
        """Compute seconds per step at ``workers`` on ``nodes``."""
        slower = 1.0 + self.contention * (sharing_count(workers, nodes, self.shared_host) - 1)
        if self.strong:
            return self.compute_s * slower * self.compute_ref_workers / workers
        return self.compute_s * slower

    def allreduce_s(self, workers: int, nodes: int) -> float:
        """Modelled all-reduce seconds per step."""
        host, link = _per_byte_weights(workers, nodes, self.shared_cores)
        per_byte = host * _inverse(self.host_bw) + link * _inverse(self.link_bw)
        t = ring_factor(workers) * self.grad_bytes * per_byte
        if nodes > 1 and math.isfinite(self.link_limit_bw) and self.link_limit_bw > 0:
            t = max(t, ring_factor(workers) * self.grad_bytes / self.link_limit_bw)
        return t

    def step_s(self, workers: int, nodes: int = 1) -> float:
        """Modelled seconds per step."""
        return (self.compute(workers, nodes) + self.overhead_s * self.sharing(workers)
                + self.allreduce_s(workers, nodes))

    def throughput(self, workers: int, nodes: int = 1) -> float:
        """Modelled samples per second."""
        samples = self.samples_per_step if self.strong else self.samples_per_worker * workers
        return samples / self.step_s(workers, nodes)

    def with_(self, **changes: Any) -> StepModel:
        """A copy with some parameters changed (e.g. another cluster's bandwidths)."""
        return replace(self, **changes)


def sharing_count(workers: int, nodes: int, shared_host: bool) -> float:
    """Workers that share one host's cores and memory: all of them on one host (virtual
    nodes), else the workers per node."""
    return float(workers) if shared_host else workers / max(1, nodes)


def _inverse(bw: float) -> float:
    return 0.0 if math.isinf(bw) else 1.0 / bw


def _per_byte_weights(workers: int, nodes: int, shared_cores: float) -> tuple[float, float]:
    """Weights of 1/B_host and 1/B_link per ring byte (see the module docstring)."""
    crossing = nodes if nodes > 1 else 0
    if shared_cores > 0 and workers > shared_cores:
        return (workers - crossing) / shared_cores, crossing / shared_cores
    return (0.0, 1.0) if crossing else (1.0, 0.0)


def features(workers: int, nodes: int, grad_bytes: float, shared_cores: float) -> list[float]:
    """The fitted terms' multipliers at (workers, nodes): overhead, 1/B_host, 1/B_link."""
    host, link = _per_byte_weights(workers, nodes, shared_cores)
    ring_bytes = ring_factor(workers) * grad_bytes
    sharing = max(1.0, workers / shared_cores) if shared_cores > 0 else 1.0
    return [sharing, ring_bytes * host, ring_bytes * link]


_NO_CONTENTION = 1e-9
"""Contention (a share of compute per extra worker on a host) below which the fit's value is
taken for zero: nnls leaves rounding residues where the compute times are all equal."""


def _compute_fit(used: Sequence[Observation], strong: bool, ref: Observation,
                 shared_host: bool) -> tuple[float, float]:
    """(compute at one worker per host, contention) from the measured compute times: a
    non-negative least squares line of compute (normalised to ``ref``'s workers under
    strong scaling) against the workers sharing a host, relative errors."""
    from scipy.optimize import nnls

    per = np.array([o.compute_s * (o.workers / ref.workers if strong else 1.0) for o in used])
    u = np.array([sharing_count(o.workers, o.nodes, shared_host) for o in used])
    if not np.all(per > 0):
        return float(np.mean(per)), 0.0
    a = np.column_stack([np.ones(u.size), u - 1.0]) / per[:, None]
    coef, _ = nnls(a, np.ones(u.size))
    if coef[0] <= 0:
        return float(np.mean(per)), 0.0
    contention = float(coef[1] / coef[0])
    # a rounding residue (5e-17 for compute times all equal, on one CPU and not another)
    # is no contention, nor a parameter of the fit
    return float(coef[0]), contention if contention > _NO_CONTENTION else 0.0


def fit_step_model(obs: Sequence[Observation], *,
                   exclude: Iterable[tuple[int, int]] = (),
                   shared_cores: float | None = None) -> StepModel:
    """Fit compute and its contention (from the measured compute times), then overhead,
    1/B_host and 1/B_link (non-negative least squares, relative errors) to the observations
    except the (workers, nodes) pairs in ``exclude``. ``shared_cores`` overrides the core
    count of the shared machine read from the runs (0: not shared)."""
    from scipy.optimize import nnls

    skip = set(exclude)
    used = [o for o in obs if (o.workers, o.nodes) not in skip]
    if len(used) < 2:
        raise StatsError(f"the step-time model needs at least 2 measured points to fit, "
                         f"got {len(used)}")
    shared = all(o.hosts == 1 and not o.gpu for o in used)
    cores = max(o.host_cores for o in used) if shared else 0.0
    if shared_cores is not None:
        cores = float(shared_cores)
    limit = min(o.link_limit_bw for o in used)
    local = {round(o.samples_per_step / o.workers, 6) for o in used}
    strong = len(local) > 1 and len({round(o.samples_per_step, 6) for o in used}) == 1
    ref = min(used, key=lambda o: (o.workers, o.nodes))
    one_host = all(o.hosts == 1 for o in used)
    c, contention = _compute_fit(used, strong, ref, one_host)
    compute = StepModel(0.0, math.inf, math.inf, c, 0.0, 0.0, strong=strong,
                        compute_ref_workers=ref.workers, contention=contention,
                        shared_host=one_host)
    a = np.array([features(o.workers, o.nodes, o.grad_bytes, cores) for o in used])
    y = np.array([o.step_s - compute.compute(o.workers, o.nodes) for o in used])
    w = 1.0 / np.array([o.step_s for o in used])  # relative error: every point counts alike
    if not any(o.nodes > 1 for o in used):
        a = a[:, :2]  # no scale-out point: the link is not identifiable
    coef, _ = nnls(a * w[:, None], y * w)
    coef = np.concatenate([coef, np.zeros(3 - coef.size)])
    model = StepModel(
        overhead_s=float(coef[0]),
        host_bw=1.0 / coef[1] if coef[1] > 0 else math.inf,
        link_bw=1.0 / coef[2] if coef[2] > 0 else math.inf,
        # one worker all-reduces nothing (grad_bytes 0): the model's bytes from the others
        compute_s=c, grad_bytes=float(max(o.grad_bytes for o in used)),
        samples_per_worker=float(np.mean([o.samples_per_step / o.workers for o in used])),
        shared_cores=cores, link_limit_bw=limit, strong=strong,
        compute_ref_workers=ref.workers, samples_per_step=ref.samples_per_step,
        fitted_on=tuple((o.workers, o.nodes) for o in used), contention=contention,
        shared_host=one_host)
    logs = np.array([math.log(model.step_s(o.workers, o.nodes) / o.step_s) for o in used])
    fitted = int(np.count_nonzero(coef)) + 1 + (contention > 0)  # the compute terms too
    df = len(used) - fitted
    return replace(model, residual_pct=100.0 * float(np.mean(np.abs(np.expm1(logs)))),
                   residual_sd=float(np.sqrt(logs @ logs / df)) if df > 0 else math.nan,
                   residual_df=max(df, 0))
