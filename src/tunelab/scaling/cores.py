"""Points whose threads outnumbered the cores left free to them while they ran, from what the
noise watch recorded (:mod:`tunelab.noise`: ``noise.cpus``, ``noise.others_share``) and the
threads the runs declared (figures of merit ``cpu_demand`` x ``host_cores``: threads per host,
else ``threads`` x ``workers`` / ``hosts``).

Such a run is slowed by more than the share of the cores others took: the intra-op threads of
one process meet at every operator, so when another process takes a core they all wait for
the thread left without one (field test, 2 cores, a busy loop beside: one Leopard worker with
2 threads fell to 34-98 windows/s, two workers of 1 thread each held 129-131; ``1 -> 2
workers`` read 2.0-2.6x). A speedup against such a point, or of one, is load, not scaling:
:func:`short_of_cores` finds the points, :func:`superlinear` the speedups above the ideal
that rest on one.

A run is **short of cores** when others took more than ``contended`` of its cores (the
report passes :data:`tunelab.noise.CONTENDED_SHARE`, 10 %) and its threads on a host exceeded
the cores left free: cpus x (1 - others' share). Runs without a noise sample or a thread
count are never flagged, nor runs of emulated compute (``compute_emulated``: their workers
wait instead of computing, so their threads are no demand on the cores; field test: one
emulated ResNet-50 worker beside 81 % of load ran at 375.9 +- 0.02 images/s).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tunelab.scaling.tables import ScalingPoint, ok_runs
from tunelab.stats import fom_column

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ShortOfCores", "run_threads", "short_of_cores", "superlinear"]

_CPUS, _OTHERS = "noise.cpus", "noise.others_share"


@dataclass(frozen=True)
class ShortOfCores:
    """A (series, workers, nodes) point with runs short of cores: ``short`` of its ``n`` ok
    runs; ``threads`` per host and ``worker_threads`` per worker (NaN: not recorded), and the
    medians over those runs of the cores they might use (``cpus``), the cores others left
    free (``free``) and others' share."""

    series: str
    workers: int
    nodes: int
    n: int
    short: int
    threads: float
    worker_threads: float
    cpus: float
    free: float
    others_share: float


def _column(runs: pd.DataFrame, name: str) -> np.ndarray:
    col = fom_column(name)
    if col not in runs.columns:
        return np.full(len(runs), math.nan)
    return runs[col].to_numpy(dtype=float)


def run_threads(runs: pd.DataFrame) -> np.ndarray:
    """Threads each run ran on one host (NaN where it did not say)."""
    demand = _column(runs, "cpu_demand") * _column(runs, "host_cores")
    hosts = np.nan_to_num(_column(runs, "hosts"), nan=1.0).clip(min=1.0)
    declared = _column(runs, "threads") * _column(runs, "workers") / hosts
    return np.where(np.isfinite(demand), demand, declared)


def short_of_cores(runs: pd.DataFrame, fom: str = "throughput", *, contended: float,
                   workers: str = "workers", nodes: str = "nodes") -> list[ShortOfCores]:
    """The points with at least one ok run short of cores (see the module docstring), by
    series, workers, nodes; none where the noise watch or the thread counts are missing."""
    if _CPUS not in runs.columns or _OTHERS not in runs.columns:
        return []
    ok = ok_runs(runs, fom, workers, nodes)
    ok["_threads"] = run_threads(ok)
    ok.loc[_column(ok, "compute_emulated") == 1, "_threads"] = math.nan  # waits, no demand
    cpus = ok[_CPUS].to_numpy(dtype=float)
    others = ok[_OTHERS].to_numpy(dtype=float)
    ok["_free"] = cpus * (1.0 - others)
    with np.errstate(invalid="ignore"):
        ok["_short"] = (others > contended) & (ok["_threads"].to_numpy() > ok["_free"])
    out = []
    for (series, k, n), rows in ok.groupby(["_series", "_nodes", "_workers"], sort=True):
        short = rows[rows["_short"]]
        if not len(short):
            continue
        out.append(ShortOfCores(
            series=str(series), workers=int(n), nodes=int(k), n=len(rows), short=len(short),
            threads=float(short["_threads"].median()),
            worker_threads=float(np.nanmedian(_column(short, "threads")))
            if np.isfinite(_column(short, "threads")).any() else math.nan,
            cpus=float(short[_CPUS].astype(float).median()),
            free=float(short["_free"].median()),
            others_share=float(short[_OTHERS].astype(float).median())))
    return out


def superlinear(points: Sequence[ScalingPoint], short: Sequence[ShortOfCores],
                ) -> list[tuple[ScalingPoint, ScalingPoint]]:
    """(point, its series' baseline) for each speedup above the ideal where the point or the
    baseline had runs short of cores."""
    flagged = {(s.series, s.workers, s.nodes) for s in short}
    out = []
    for series in sorted({p.series for p in points}):
        mine = [p for p in points if p.series == series]
        base = min(mine, key=lambda p: (p.workers, p.nodes))
        base_short = (series, base.workers, base.nodes) in flagged
        for p in mine:
            if p is base or not p.speedup > p.ideal:
                continue
            if base_short or (series, p.workers, p.nodes) in flagged:
                out.append((p, base))
    return out
