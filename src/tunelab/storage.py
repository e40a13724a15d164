"""Storage sizing over a study's runs: how many MB/s each accelerator needs to stay busy, how
many accelerators each data source keeps busy, and where the bottleneck moves from storage
to the network. Pure functions over the runs table (beside :mod:`tunelab.scaling`), for the
``ddp`` workload's input-pipeline figures (docs/workloads/ddp.md, "Storage"); runs on
synthetic data (the ``synthetic_data`` flag; before it, runs that read nothing) are left out,
and a study of nothing else has no storage analysis.

Per run (figures of merit of ``tunelab bench ddp``): ``au`` (accelerator utilisation of the
timed steps as MLPerf Storage defines it: compute / step time; the all-reduce not overlapped is
beside it, never inside it),
``read_Bps`` (bytes read from the dataset per second, all workers), ``read_bytes`` and
``steps`` (so bytes per worker and step B), ``busy_s``/``compute_s``/``exposed_s``/
``data_s``/``step_s`` (seconds per step). Points are (series, workers, nodes) as in
:func:`tunelab.scaling.scaling_table`: parameters other than the worker count and the
layout (data source, cache, loader processes …) make the series.

Definitions (target AU = 0.9 unless given, MLPerf Storage's threshold):

* **Needed rate per accelerator** of a run = target x B / compute_s: a step may last at most
  compute / target for AU >= target, and B bytes must arrive within it (MLPerf Storage's
  figure). ``ceiling`` = B / (busy_s - peer_s) (busy = compute + all-reduce not overlapped;
  ``peer_s``, the part of that all-reduce spent waiting for workers that are behind — for
  their data, most often — is not the all-reduce's own cost): the most an accelerator
  consumes with the all-reduce measured; below ``needed``, the all-reduce alone keeps AU
  under the target whatever the storage. Both in bytes/s, per series with the mean over its
  runs and a Student-t 95 % interval.
* **Sustained workers** of a series and layout: the largest measured worker count whose
  mean AU >= target (``confident`` when the interval's low end is too).
* **Bottleneck** of a point: ``storage`` when waiting for data (a worker's own, and the
  others' wait for it at the step's meeting, ``peer_s``) takes more of the step than the
  all-reduce's own time does (and more than ``minor``, 5 %), ``network`` when the all-reduce
  does, ``none`` when neither does; the **shift** is the smallest worker count at which a
  series and layout goes from storage to network (or back).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tunelab.scaling.tables import axis_values, mean_interval, series_key
from tunelab.stats import StatsError, fom_column

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["AU_TARGET", "Bottleneck", "NeededRate", "StorageAnalysis", "StoragePoint",
           "Sustained", "bottlenecks", "needed_rates", "storage_analysis", "storage_points",
           "sustained_workers"]

AU_TARGET = 0.90
MINOR = 0.05
_NEEDED = ("au", "step_s", "busy_s", "compute_s", "exposed_s", "data_s", "read_bytes",
           "steps", "read_Bps")


@dataclass(frozen=True)
class StoragePoint:
    """One (series, workers, nodes) point: means over its runs, 95 % t intervals."""

    series: str
    workers: int
    nodes: int
    n: int
    au: float
    au_low: float
    au_high: float
    read_Bps: float
    read_low: float
    read_high: float
    wait_share: float
    comm_share: float
    input_bound: float
    needed: float
    ceiling: float

    @property
    def read_per_worker(self) -> float:
        """Bytes/s read per worker (accelerator)."""
        return self.read_Bps / self.workers


@dataclass(frozen=True)
class NeededRate:
    """Bytes/s each accelerator of a series needs for AU >= target, mean and interval over
    the series' runs that read data; ``ceiling*``: the most it consumes with the all-reduce
    measured (B / busy)."""

    series: str
    n: int
    needed: float
    low: float
    high: float
    ceiling: float
    ceiling_low: float
    ceiling_high: float


@dataclass(frozen=True)
class Sustained:
    """The largest worker count a series and layout keeps at AU >= target (0: none)."""

    series: str
    nodes: int
    workers: int
    confident: bool
    measured_max: int


@dataclass(frozen=True)
class Bottleneck:
    """Per worker count of a series and layout, what limits it; and where that changes."""

    series: str
    nodes: int
    labels: tuple[tuple[int, str], ...]
    shift_at: int | None
    shift: str


@dataclass(frozen=True)
class StorageAnalysis:
    """Everything :func:`storage_analysis` finds."""

    target: float
    points: tuple[StoragePoint, ...]
    needed: tuple[NeededRate, ...]
    sustained: tuple[Sustained, ...]
    bottlenecks: tuple[Bottleneck, ...]


def _frame(runs: pd.DataFrame, workers: str, nodes: str) -> pd.DataFrame:
    missing = [n for n in _NEEDED if fom_column(n) not in runs.columns]
    if missing:
        raise StatsError(f"no input-pipeline figures in the runs (missing "
                         f"{', '.join(missing)}): a ddp study with --data memory or files:")
    ok = runs[(runs["status"] == "ok") & runs[fom_column("au")].notna()].copy()
    if not len(ok):
        raise StatsError("no successful run with an accelerator utilisation to analyse")
    ok = ok[_pipeline(ok)]
    if not len(ok):
        raise StatsError("no run had an input pipeline (synthetic data: one batch made once, "
                         "nothing read): no storage figures")
    ok["_workers"] = axis_values(ok, workers).astype(int)
    ok["_nodes"] = axis_values(ok, nodes, default=1).astype(int)
    ok["_series"] = [series_key(p, (workers, nodes)) for p in ok["point"].astype(str)]
    for name in _NEEDED:
        ok[f"_{name}"] = ok[fom_column(name)].astype(float)
    peer = fom_column("peer_s")  # runs recorded before it was measured apart: 0
    ok["_peer"] = ok[peer].astype(float).fillna(0.0) if peer in ok.columns else 0.0
    per_step = ok["_read_bytes"] / (ok["_workers"] * ok["_steps"]).clip(lower=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ok["_need"] = per_step / ok["_compute_s"]
        ok["_ceil"] = per_step / (ok["_busy_s"] - ok["_peer"])
        ok["_wait"] = (ok["_data_s"] + ok["_peer"]) / ok["_step_s"]
        ok["_comm"] = (ok["_exposed_s"] - ok["_peer"]) / ok["_step_s"]
    ok.loc[ok["_read_bytes"] <= 0, ["_need", "_ceil"]] = math.nan
    ib = fom_column("input_bound")
    ok["_ib"] = ok[ib].astype(float) if ib in ok.columns else (ok["_wait"] > 0.1).astype(float)
    return ok


def _pipeline(runs: pd.DataFrame) -> pd.Series:
    """Which runs fed their workers through an input pipeline (``--data memory`` or
    ``files:``), not the synthetic batch made once: the ``synthetic_data`` flag where the run
    recorded it; runs recorded before it count when they read data."""
    read = runs[fom_column("read_bytes")].astype(float) > 0
    flag = fom_column("synthetic_data")
    if flag not in runs.columns:
        return read
    synthetic = runs[flag].astype(float)
    return (synthetic == 0) | (synthetic.isna() & read)


def _interval(values: np.ndarray, bounds: tuple[float, float] = (-math.inf, math.inf),
              ) -> tuple[float, float, float]:
    """Mean and 95 % t interval, the interval cut to ``bounds`` (AU lies in [0, 1]: with two
    runs near 1 the t interval alone would reach past 100 %)."""
    values = values[np.isfinite(values)]
    if not values.size:
        return math.nan, math.nan, math.nan
    low, high = mean_interval(values, 0.95)
    if not math.isnan(low):
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return float(values.mean()), low, high


def storage_points(runs: pd.DataFrame, *, target: float = AU_TARGET, workers: str = "workers",
                   nodes: str = "nodes") -> list[StoragePoint]:
    """The per-point means (see :class:`StoragePoint`), by series, nodes, workers."""
    ok = _frame(runs, workers, nodes)
    out = []
    for (series, k, n), rows in ok.groupby(["_series", "_nodes", "_workers"], sort=True):
        au, au_low, au_high = _interval(rows["_au"].to_numpy(), bounds=(0.0, 1.0))
        rd, rd_low, rd_high = _interval(rows["_read_Bps"].to_numpy())
        out.append(StoragePoint(
            series=str(series), workers=int(n), nodes=int(k), n=len(rows), au=au,
            au_low=au_low, au_high=au_high, read_Bps=rd, read_low=rd_low, read_high=rd_high,
            wait_share=float(rows["_wait"].mean()), comm_share=float(rows["_comm"].mean()),
            input_bound=float(rows["_ib"].mean()),
            needed=target * float(np.nanmean(rows["_need"])) if rows["_need"].notna().any()
            else math.nan,
            ceiling=float(np.nanmean(rows["_ceil"])) if rows["_ceil"].notna().any()
            else math.nan))
    return out


def needed_rates(runs: pd.DataFrame, *, target: float = AU_TARGET, workers: str = "workers",
                 nodes: str = "nodes") -> list[NeededRate]:
    """Per series, bytes/s per accelerator needed for AU >= ``target`` (runs that read)."""
    ok = _frame(runs, workers, nodes)
    out = []
    for series, rows in ok.groupby("_series", sort=True):
        need, low, high = _interval(target * rows["_need"].to_numpy())
        ceil, c_low, c_high = _interval(rows["_ceil"].to_numpy())
        if math.isnan(need):
            continue
        out.append(NeededRate(str(series), int(rows["_need"].notna().sum()), need, low, high,
                              ceil, c_low, c_high))
    return out


def sustained_workers(points: Sequence[StoragePoint], *, target: float = AU_TARGET,
                      ) -> list[Sustained]:
    """Per series and layout, the largest worker count with mean AU >= ``target``."""
    groups: dict[tuple[str, int], list[StoragePoint]] = {}
    for p in points:
        groups.setdefault((p.series, p.nodes), []).append(p)
    out = []
    for (series, k), pts in sorted(groups.items()):
        good = [p for p in pts if p.au >= target]
        best = max(good, key=lambda p: p.workers) if good else None
        out.append(Sustained(series, k, best.workers if best else 0,
                             bool(best and best.n > 1 and best.au_low >= target),
                             max(p.workers for p in pts)))
    return out


def _label(p: StoragePoint, minor: float) -> str:
    if max(p.wait_share, p.comm_share) < minor:
        return "none"
    return "storage" if p.wait_share >= p.comm_share else "network"


def bottlenecks(points: Sequence[StoragePoint], *, minor: float = MINOR) -> list[Bottleneck]:
    """Per series and layout: the limit at each worker count and where it changes."""
    groups: dict[tuple[str, int], list[StoragePoint]] = {}
    for p in points:
        groups.setdefault((p.series, p.nodes), []).append(p)
    out = []
    for (series, k), pts in sorted(groups.items()):
        labels = tuple((p.workers, _label(p, minor)) for p in sorted(pts, key=lambda p: p.workers))
        shift_at, shift = None, ""
        limited = [(n, lab) for n, lab in labels if lab != "none"]
        for (_, a), (n, b) in zip(limited, limited[1:], strict=False):
            if a != b:
                shift_at, shift = n, f"{a} -> {b}"
                break
        out.append(Bottleneck(series, k, labels, shift_at, shift))
    return out


def storage_analysis(runs: pd.DataFrame, *, target: float = AU_TARGET, workers: str = "workers",
                     nodes: str = "nodes") -> StorageAnalysis:
    """Points, needed rates, sustained worker counts and bottleneck shifts together."""
    if not 0 < target <= 1:
        raise StatsError(f"the AU target must lie in (0, 1], got {target}")
    points = storage_points(runs, target=target, workers=workers, nodes=nodes)
    return StorageAnalysis(target, tuple(points),
                           tuple(needed_rates(runs, target=target, workers=workers,
                                              nodes=nodes)),
                           tuple(sustained_workers(points, target=target)),
                           tuple(bottlenecks(points)))
