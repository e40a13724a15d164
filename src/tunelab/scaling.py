"""Scaling analysis over a study's runs: speedup, efficiency, Karp–Flatt, scale-up vs
scale-out, and a fitted step-time model that predicts worker counts not measured.

Pure functions over the runs table of :mod:`tunelab.store` (one row per run; parameters as
columns; figures of merit as ``fom.<name>``), reusable by every workload with a worker-count
axis. The worker count and the layout (nodes) are read from the parameters ``workers`` and
``nodes`` when the study sweeps them, else from the figures of merit of the same names.
Runs that differ in other parameters form separate *series*.

Definitions (N workers, baseline = the series' smallest worker count N0, usually 1):

* **speedup** S(N) = X(N) / X(N0) for a throughput X (maximised), t(N0) / t(N) for a time;
  its 95 % interval is :func:`tunelab.stats.compare`'s (bootstrap ∪ Welch, see
  docs/statistics.md). **Efficiency** E = S / (N / N0). **Karp–Flatt** serial fraction
  e = (1/S − 1/p) / (1 − 1/p) with p = N / N0 (undefined for p = 1).
* **Scale-up vs scale-out** at equal N: each layout with more nodes compared with the layout
  with the fewest (ratio of means, > 1: more nodes is faster), with a verdict.
* **Step-time model** (:class:`StepModel`), N workers on k nodes, S gradient bytes per step::

      t_step(N, k) = compute(N) + overhead · h(N) + max( t_ring(N, k), ring(N) · S / L )
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
  measured compute; compute is the measured mean (weak scaling, fixed batch per worker) or
  c / N (strong scaling, fixed global batch). Throughput = samples per step / t_step. The
  fit's error is reported on measured points held back from it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from tunelab.stats import DEFAULT_RESAMPLES, StatsError, Verdict, compare, fom_column

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "LayoutGap",
    "ModelCheck",
    "ScalingPoint",
    "StepModel",
    "fit_step_model",
    "karp_flatt",
    "layout_gaps",
    "model_check",
    "observations",
    "ring_factor",
    "scaling_table",
]


def ring_factor(workers: int | float) -> float:
    """Bytes a ring all-reduce sends over each worker's link per byte reduced: 2(N−1)/N."""
    return 2.0 * (workers - 1) / workers


def karp_flatt(speedup: float, p: float) -> float:
    """Experimentally determined serial fraction; NaN for p <= 1 or a non-positive speedup."""
    if p <= 1 or not speedup > 0 or not math.isfinite(speedup):
        return math.nan
    return (1.0 / speedup - 1.0 / p) / (1.0 - 1.0 / p)


# ------------------------------------------------------------------------------ tables


@dataclass(frozen=True)
class ScalingPoint:
    """One (series, workers, nodes) point against its series' baseline: the mean of the
    figure of merit with its t interval, speedup and efficiency with the intervals of
    :func:`tunelab.stats.compare`, Karp–Flatt."""

    series: str
    workers: int
    nodes: int
    n: int
    mean: float
    mean_low: float
    mean_high: float
    speedup: float
    speedup_low: float
    speedup_high: float
    ideal: float
    efficiency: float
    efficiency_low: float
    efficiency_high: float
    karp_flatt: float
    karp_flatt_low: float
    karp_flatt_high: float

    @property
    def workers_per_node(self) -> int:
        """Workers on each node."""
        return self.workers // max(1, self.nodes)


@dataclass(frozen=True)
class LayoutGap:
    """Scale-out (``nodes``) against scale-up (``ref_nodes``) at equal ``workers``.

    ``ratio`` > 1 means the layout with more nodes is better; ``gap_pct`` = (1 − ratio) x 100
    is how much it loses (the seed's "8.5 % difference").
    """

    series: str
    workers: int
    ref_nodes: int
    nodes: int
    ratio: float
    ci_low: float
    ci_high: float
    verdict: Verdict
    n_ref: int
    n: int

    @property
    def gap_pct(self) -> float:
        """Loss of the scale-out layout, percent."""
        return (1.0 - self.ratio) * 100.0


def _axis(runs: pd.DataFrame, name: str, default: float | None = None) -> np.ndarray:
    """Values of parameter ``name``, else of FOM ``name``, else ``default``."""
    for col in (name, fom_column(name)):
        if col in runs.columns:
            values = runs[col].to_numpy(dtype=float)
            if not np.isnan(values).all():
                return values
    if default is None:
        raise StatsError(f"the runs have no parameter or figure of merit {name!r}")
    return np.full(len(runs), float(default))


def _series_key(point: str, skip: Iterable[str]) -> str:
    try:
        params = json.loads(point)
    except (TypeError, ValueError):
        return ""
    if not isinstance(params, dict):
        return ""
    rest = {k: v for k, v in sorted(params.items()) if k not in set(skip)}
    return ", ".join(f"{k}={v}" for k, v in rest.items())


def _ok(runs: pd.DataFrame, column: str, workers: str, nodes: str) -> pd.DataFrame:
    if fom_column(column) not in runs.columns:
        have = sorted(c.removeprefix("fom.") for c in runs.columns if c.startswith("fom."))
        raise StatsError(f"no figure of merit {column!r} in the runs; available: "
                         f"{', '.join(have) or 'none'}")
    ok = runs[(runs["status"] == "ok") & runs[fom_column(column)].notna()].copy()
    if not len(ok):
        raise StatsError("no successful run to analyse")
    ok["_workers"] = _axis(ok, workers).astype(int)
    ok["_nodes"] = _axis(ok, nodes, default=1).astype(int)
    ok["_series"] = [_series_key(p, (workers, nodes)) for p in ok["point"].astype(str)]
    ok["_value"] = ok[fom_column(column)].astype(float)
    return ok


def _mean_interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    """Student-t interval of the mean (NaN with fewer than two values)."""
    if values.size < 2:
        return math.nan, math.nan
    from scipy import stats

    half = float(stats.t.ppf(0.5 + confidence / 2, values.size - 1)
                 * values.std(ddof=1) / math.sqrt(values.size))
    return float(values.mean()) - half, float(values.mean()) + half


def scaling_table(
    runs: pd.DataFrame,
    fom: str = "throughput",
    direction: str = "maximize",
    *,
    workers: str = "workers",
    nodes: str = "nodes",
    noise_threshold: float = 0.02,
    confidence: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> list[ScalingPoint]:
    """Speedup, efficiency and Karp–Flatt of every (series, workers, nodes) point against
    the series' baseline: its smallest worker count on the fewest nodes. Sorted by series,
    workers, nodes."""
    ok = _ok(runs, fom, workers, nodes)
    out: list[ScalingPoint] = []
    for series, group in ok.groupby("_series", sort=True):
        base_n = int(group["_workers"].min())
        base_rows = group[group["_workers"] == base_n]
        base_k = int(base_rows["_nodes"].min())
        base = base_rows[base_rows["_nodes"] == base_k]["_value"].to_numpy()
        for (n, k), rows in group.groupby(["_workers", "_nodes"], sort=True):
            values = rows["_value"].to_numpy()
            c = compare(base, values, direction, noise_threshold=noise_threshold,
                        confidence=confidence, n_resamples=n_resamples, seed=seed)
            p = int(n) / base_n
            lo, hi = _mean_interval(values, confidence)
            out.append(ScalingPoint(
                series=str(series), workers=int(n), nodes=int(k), n=int(values.size),
                mean=float(values.mean()), mean_low=lo, mean_high=hi, speedup=c.speedup,
                speedup_low=c.ci_low, speedup_high=c.ci_high, ideal=p, efficiency=c.speedup / p,
                efficiency_low=c.ci_low / p, efficiency_high=c.ci_high / p,
                karp_flatt=karp_flatt(c.speedup, p),
                # e falls as S rises: the interval's ends swap
                karp_flatt_low=karp_flatt(c.ci_high, p),
                karp_flatt_high=karp_flatt(c.ci_low, p),
            ))
    return out


def layout_gaps(
    runs: pd.DataFrame,
    fom: str = "throughput",
    direction: str = "maximize",
    *,
    workers: str = "workers",
    nodes: str = "nodes",
    noise_threshold: float = 0.02,
    confidence: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> list[LayoutGap]:
    """Every layout with more nodes against the one with the fewest, at equal workers."""
    ok = _ok(runs, fom, workers, nodes)
    out: list[LayoutGap] = []
    for (series, n), group in ok.groupby(["_series", "_workers"], sort=True):
        layouts = sorted(int(k) for k in group["_nodes"].unique())
        if len(layouts) < 2:
            continue
        ref = group[group["_nodes"] == layouts[0]]["_value"].to_numpy()
        for k in layouts[1:]:
            values = group[group["_nodes"] == k]["_value"].to_numpy()
            c = compare(ref, values, direction, noise_threshold=noise_threshold,
                        confidence=confidence, n_resamples=n_resamples, seed=seed)
            out.append(LayoutGap(str(series), int(n), layouts[0], k, c.speedup, c.ci_low,
                                 c.ci_high, c.verdict, c.n_a, c.n_b))
    return out


# ------------------------------------------------------------------------------- model


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
    ok = _ok(runs, "step_s", workers, nodes)
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
        _hosts=_axis(ok, "hosts", default=1), _cores=_axis(ok, "host_cores", default=0),
        _gpu=_axis(ok, "gpu", default=0), _link=_axis(ok, "link_gbit", default=0),
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

    ``compute_s`` is one worker's compute time per step at ``compute_ref_workers`` workers;
    with ``strong`` scaling it shrinks as 1/N, else it is fixed. ``samples_per_worker``
    (weak) or ``samples_per_step`` (strong) turn step times into throughput.
    ``shared_cores`` > 0: every worker shares the CPU of one machine with that many cores
    (gloo on virtual nodes); 0: each worker has its own (GPUs, separate hosts).
    ``link_limit_bw`` is a configured link rate (bytes/s, a floor; inf for none).
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

    def sharing(self, workers: int) -> float:
        """h(N): workers per core of the shared machine (>= 1; 1 when not shared)."""
        if self.shared_cores <= 0:
            return 1.0
        return max(1.0, workers / self.shared_cores)

    def compute(self, workers: int) -> float:
        """Compute seconds per step at ``workers``."""
        if self.strong:
            return self.compute_s * self.compute_ref_workers / workers
        return self.compute_s

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
        return (self.compute(workers) + self.overhead_s * self.sharing(workers)
                + self.allreduce_s(workers, nodes))

    def throughput(self, workers: int, nodes: int = 1) -> float:
        """Modelled samples per second."""
        samples = self.samples_per_step if self.strong else self.samples_per_worker * workers
        return samples / self.step_s(workers, nodes)

    def with_(self, **changes: Any) -> StepModel:
        """A copy with some parameters changed (e.g. another cluster's bandwidths)."""
        return replace(self, **changes)


def _inverse(bw: float) -> float:
    return 0.0 if math.isinf(bw) else 1.0 / bw


def _per_byte_weights(workers: int, nodes: int, shared_cores: float) -> tuple[float, float]:
    """Weights of 1/B_host and 1/B_link per ring byte (see the module docstring)."""
    crossing = nodes if nodes > 1 else 0
    if shared_cores > 0 and workers > shared_cores:
        return (workers - crossing) / shared_cores, crossing / shared_cores
    return (0.0, 1.0) if crossing else (1.0, 0.0)


def _features(o: Observation, shared_cores: float) -> list[float]:
    host, link = _per_byte_weights(o.workers, o.nodes, shared_cores)
    ring_bytes = ring_factor(o.workers) * o.grad_bytes
    sharing = max(1.0, o.workers / shared_cores) if shared_cores > 0 else 1.0
    return [sharing, ring_bytes * host, ring_bytes * link]


def fit_step_model(obs: Sequence[Observation], *,
                   exclude: Iterable[tuple[int, int]] = (),
                   shared_cores: float | None = None) -> StepModel:
    """Fit overhead, 1/B_host and 1/B_link (non-negative least squares, relative errors)
    to the observations except the (workers, nodes) pairs in ``exclude``. ``shared_cores``
    overrides the core count of the shared machine read from the runs (0: not shared)."""
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
    if strong:
        c = float(np.mean([o.compute_s * o.workers / ref.workers for o in used]))
    else:
        c = float(np.mean([o.compute_s for o in used]))
    a = np.array([_features(o, cores) for o in used])
    y = np.array([o.step_s - (c * ref.workers / o.workers if strong else c) for o in used])
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
        fitted_on=tuple((o.workers, o.nodes) for o in used))
    errors = [abs(model.step_s(o.workers, o.nodes) / o.step_s - 1.0) for o in used]
    return replace(model, residual_pct=100.0 * float(np.mean(errors)))


@dataclass(frozen=True)
class Prediction:
    """Model against measurement at one (workers, nodes) point (``measured`` NaN if none)."""

    workers: int
    nodes: int
    predicted: float
    measured: float
    held_out: bool

    @property
    def error_pct(self) -> float:
        """(predicted − measured) / measured, percent."""
        return 100.0 * (self.predicted / self.measured - 1.0) if self.measured > 0 else math.nan


@dataclass(frozen=True)
class ModelCheck:
    """A fit with some points held out, and how well it predicts them.

    ``points`` covers every measured point (``held_out`` marks those not in the fit) plus
    the ``extrapolate`` sizes; ``ratios`` compares scale-out/scale-up throughput ratios,
    measured vs predicted, at every worker count measured in several layouts.
    """

    model: StepModel
    points: tuple[Prediction, ...]
    ratios: tuple[tuple[int, int, int, float, float], ...] = field(default=())

    @property
    def held_out_error_pct(self) -> float:
        """Mean absolute error of throughput on the held-out points, percent."""
        errs = [abs(p.error_pct) for p in self.points if p.held_out and p.measured > 0]
        return float(np.mean(errs)) if errs else math.nan

    @property
    def held_out_max_error_pct(self) -> float:
        """Largest absolute error on a held-out point, percent."""
        errs = [abs(p.error_pct) for p in self.points if p.held_out and p.measured > 0]
        return float(max(errs)) if errs else math.nan


def model_check(obs: Sequence[Observation], *, hold_out: Iterable[int] | None = None,
                extrapolate: Iterable[tuple[int, int]] = (),
                shared_cores: float | None = None) -> ModelCheck:
    """Fit without the worker counts ``hold_out`` (default: the largest measured one),
    predict them and ``extrapolate`` ((workers, nodes) pairs), and compare scale-out/
    scale-up ratios (``ratios``: workers, ref nodes, nodes, measured, predicted)."""
    counts = sorted({o.workers for o in obs})
    held = set(hold_out) if hold_out is not None else ({counts[-1]} if len(counts) > 2
                                                          else set())
    model = fit_step_model(obs, exclude=[(o.workers, o.nodes) for o in obs
                                         if o.workers in held], shared_cores=shared_cores)
    points = [Prediction(o.workers, o.nodes, model.throughput(o.workers, o.nodes),
                         o.throughput, o.workers in held) for o in obs]
    measured = {(o.workers, o.nodes) for o in obs}
    points += [Prediction(n, k, model.throughput(n, k), math.nan, True)
               for n, k in extrapolate if (n, k) not in measured]
    ratios = []
    by = {(o.workers, o.nodes): o for o in obs}
    for n in counts:
        layouts = sorted(k for (m, k) in by if m == n)
        for k in layouts[1:]:
            ref = layouts[0]
            ratios.append((n, ref, k, by[(n, k)].throughput / by[(n, ref)].throughput,
                           model.throughput(n, k) / model.throughput(n, ref)))
    return ModelCheck(model, tuple(points), tuple(ratios))
