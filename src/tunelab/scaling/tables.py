"""Scaling tables over a study's runs: speedup, efficiency and Karp–Flatt with intervals
against each series' baseline, and scale-out against scale-up at equal workers (see
:mod:`tunelab.scaling` for the definitions).

The worker count and the layout (nodes) are read from the parameters ``workers`` and
``nodes`` when the study sweeps them, else from the figures of merit of the same names; runs
that differ in other parameters form separate *series*.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tunelab.stats import Comparison, StatsError, Verdict, compare, fom_column, holm_family

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["LayoutGap", "ScalingPoint", "axis_values", "karp_flatt", "layout_gaps",
           "mean_interval", "ok_runs", "scaling_table", "series_key"]


def karp_flatt(speedup: float, p: float) -> float:
    """Experimentally determined serial fraction; NaN for p <= 1 or a non-positive speedup."""
    if p <= 1 or not speedup > 0 or not math.isfinite(speedup):
        return math.nan
    return (1.0 / speedup - 1.0 / p) / (1.0 - 1.0 / p)


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
    adjusted: bool = False
    """Whether the verdict and interval are Holm's over the study's gaps (more than one)."""

    @property
    def gap_pct(self) -> float:
        """Loss of the scale-out layout, percent."""
        return (1.0 - self.ratio) * 100.0


def axis_values(runs: pd.DataFrame, name: str, default: float | None = None) -> np.ndarray:
    """Values of parameter ``name``, else of FOM ``name``, else ``default``."""
    for col in (name, fom_column(name)):
        if col in runs.columns:
            values = runs[col].to_numpy(dtype=float)
            if not np.isnan(values).all():
                return values
    if default is None:
        raise StatsError(f"the runs have no parameter or figure of merit {name!r}")
    return np.full(len(runs), float(default))


def series_key(point: str, skip: Iterable[str]) -> str:
    try:
        params = json.loads(point)
    except (TypeError, ValueError):
        return ""
    if not isinstance(params, dict):
        return ""
    rest = {k: v for k, v in sorted(params.items()) if k not in set(skip)}
    return ", ".join(f"{k}={v}" for k, v in rest.items())


def ok_runs(runs: pd.DataFrame, column: str, workers: str, nodes: str) -> pd.DataFrame:
    if fom_column(column) not in runs.columns:
        have = sorted(c.removeprefix("fom.") for c in runs.columns if c.startswith("fom."))
        raise StatsError(f"no figure of merit {column!r} in the runs; available: "
                         f"{', '.join(have) or 'none'}")
    ok = runs[(runs["status"] == "ok") & runs[fom_column(column)].notna()].copy()
    if not len(ok):
        raise StatsError("no successful run to analyse")
    ok["_workers"] = axis_values(ok, workers).astype(int)
    ok["_nodes"] = axis_values(ok, nodes, default=1).astype(int)
    ok["_series"] = [series_key(p, (workers, nodes)) for p in ok["point"].astype(str)]
    ok["_value"] = ok[fom_column(column)].astype(float)
    return ok


def mean_interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
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
) -> list[ScalingPoint]:
    """Speedup, efficiency and Karp–Flatt of every (series, workers, nodes) point against
    the series' baseline: its smallest worker count on the fewest nodes. Sorted by series,
    workers, nodes."""
    ok = ok_runs(runs, fom, workers, nodes)
    out: list[ScalingPoint] = []
    for series, group in ok.groupby("_series", sort=True):
        base_n = int(group["_workers"].min())
        base_rows = group[group["_workers"] == base_n]
        base_k = int(base_rows["_nodes"].min())
        base = base_rows[base_rows["_nodes"] == base_k]["_value"].to_numpy()
        for (n, k), rows in group.groupby(["_workers", "_nodes"], sort=True):
            values = rows["_value"].to_numpy()
            c = compare(base, values, direction, noise_threshold=noise_threshold,
                        confidence=confidence)
            p = int(n) / base_n
            lo, hi = mean_interval(values, confidence)
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
) -> list[LayoutGap]:
    """Every layout with more nodes against the one with the fewest, at equal workers.

    The gaps of a study are one family, judged together by Holm (:func:`holm_family`): at
    most ``1 - confidence`` of studies whose layouts all perform alike call any gap better
    or worse (each gap tested alone at 5 %, a study of five gaps did so in about a fifth),
    and each interval is at the level Holm held its p to (``adjusted``)."""
    ok = ok_runs(runs, fom, workers, nodes)
    pairs: list[tuple[str, int, int, int]] = []
    judged: list[Comparison] = []
    for (series, n), group in ok.groupby(["_series", "_workers"], sort=True):
        layouts = sorted(int(k) for k in group["_nodes"].unique())
        if len(layouts) < 2:
            continue
        ref = group[group["_nodes"] == layouts[0]]["_value"].to_numpy()
        for k in layouts[1:]:
            values = group[group["_nodes"] == k]["_value"].to_numpy()
            pairs.append((str(series), int(n), layouts[0], k))
            judged.append(compare(ref, values, direction, noise_threshold=noise_threshold,
                                  confidence=confidence))
    return [LayoutGap(series, n, ref_nodes, k, c.speedup, c.ci_low, c.ci_high, c.verdict,
                      c.n_a, c.n_b, adjusted=len(judged) > 1)
            for (series, n, ref_nodes, k), c in zip(pairs, holm_family(judged), strict=True)]


