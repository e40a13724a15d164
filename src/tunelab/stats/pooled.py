"""The study's noise pooled over all its points, and each comparison's test built on it.

A study runs every point once per round; the log figure of merit of point p in round r is
modelled as ``y = mu_p + rho_r + e`` (a two-way additive model: the round effect ``rho_r``
takes up the machine's drift; ``e`` is the run-to-run noise, sd sigma). Fitting it to every
(point, round) of the study (:func:`pooled_noise`; alternating means to convergence, values
sharing a round averaged on the log scale first) leaves residuals with ``cells − rank``
degrees of freedom — 80 for 21 points × 5 rounds, against 4 for one comparison's own
paired t — so sigma is known far better than any one pair can tell it.

Each point is compared with the baseline by the mean of its per-round log ratios over the
rounds both ran (the paired estimate; a round split across ``tunelab run`` sessions, or
holding runs made again by ``--rerun-disturbed``, pairs only within each of its blocks —
the runs made under one set of conditions, :mod:`tunelab.stats.blocks` — and the model
takes each block as a column of its own); with the pooled noise its standard error is
``sigma * sqrt(2 / c)`` on the pooled degrees of freedom (:data:`TEST_POOLED_PAIRED`). The
model assumes one noise level for all points; where a comparison's own per-round ratios
vary more than that (F test against ``2 sigma^2`` at :data:`HETEROGENEITY_LEVEL`) it is
judged on its own noise instead (:data:`TEST_PAIRED`), so one noisy point cannot borrow the
others' quiet. Fewer than :data:`MIN_PAIRS` common rounds: Welch's test on its own runs —
except where a round was broken into blocks and both sides ran in enough of them: then the
additive model's estimate of the two points' difference, which the other points' runs in
the same blocks link (:mod:`tunelab.stats.additive`).
Runs without rounds: the within-point noise (one-way), and Welch's test for every pair.
A point with a value <= 0 is left out of the log table: Welch's test on the difference of
its mean and the baseline's (no ratio exists; so too for a baseline with such a value).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy import special

from tunelab.stats.additive import additive_tests
from tunelab.stats.intervals import TestResult, t_p_value, unpaired_test
from tunelab.stats.power import repeats_needed
from tunelab.stats.results import (
    HETEROGENEITY_LEVEL,
    MIN_PAIRS,
    TEST_PAIRED,
    TEST_POOLED_PAIRED,
    NoiseLevel,
)
from tunelab.stats.summaries import Group, check_runs, point_groups

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["PooledNoise", "RoundTable", "noise_level", "pooled_noise", "study_tests"]

_MAX_SWEEPS = 500


@dataclass(frozen=True)
class PooledNoise:
    """The study's run-to-run noise: ``sd_log`` (sd of one run's log figure of merit),
    its degrees of freedom, and whether round effects were removed (``paired``)."""

    sd_log: float
    df: int
    paired: bool


@dataclass(frozen=True)
class RoundTable:
    """The study by point and block: ``logs[i, j]`` is the mean log value of point
    ``keys[i]`` in block ``j`` (a round made under one set of conditions,
    :mod:`tunelab.stats.blocks`: one column per round unless a round was split across
    sessions or has runs made again), which belongs to round ``rounds[j]`` (NaN: no value
    there). A point with any value <= 0 has no logs at all: dropping its non-positive runs
    would judge it on the rest (a point whose runs were 1.3, -0.5, 1.3 would pair as 1.3),
    so its comparison falls back to Welch's test on the difference of the means of all its
    values, as :func:`~tunelab.stats.intervals.compare` does."""

    keys: tuple[str, ...]
    rounds: np.ndarray
    logs: np.ndarray

    @classmethod
    def of(cls, groups: Mapping[str, Group]) -> RoundTable | None:
        """The table of ``groups``; None when some group carries no rounds."""
        if any(g.rounds is None or g.pairs_by is None for g in groups.values()):
            return None
        all_blocks = [g.pairs_by for g in groups.values() if g.pairs_by is not None]
        blocks = np.unique(np.concatenate(all_blocks)) if all_blocks else np.zeros(0, int)
        rounds = blocks.copy()
        logs = np.full((len(groups), blocks.size), np.nan)
        for i, g in enumerate(groups.values()):
            assert g.rounds is not None and g.pairs_by is not None
            col = np.searchsorted(blocks, g.pairs_by)
            rounds[col] = g.rounds
            if g.values.size == 0 or np.any(g.values <= 0):
                continue
            total = np.bincount(col, np.log(g.values), blocks.size)
            count = np.bincount(col, minlength=blocks.size)
            logs[i] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        return cls(tuple(groups), rounds, logs)

    @property
    def broken(self) -> bool:
        """Whether some round is more than one block (split across sessions, or holding
        runs made again)."""
        return bool(np.unique(self.rounds).size < self.rounds.size)

    def upto(self, upto: int | None) -> np.ndarray:
        """The table's columns of rounds before ``upto`` (all: None)."""
        return self.logs if upto is None else self.logs[:, self.rounds < upto]


def _two_way(logs: np.ndarray) -> PooledNoise | None:
    """Residual sd of the additive point + round model over the finite cells."""
    seen = np.isfinite(logs)
    rows, cols = seen.any(axis=1), seen.any(axis=0)
    logs, seen = logs[rows][:, cols], seen[rows][:, cols]
    if not seen.any():
        return None
    y = np.where(seen, logs, 0.0)
    w = seen.astype(float)
    n_row, n_col = w.sum(axis=1), w.sum(axis=0)
    mu, rho = np.zeros(y.shape[0]), np.zeros(y.shape[1])
    for _ in range(_MAX_SWEEPS):
        mu_new = (w * (y - rho)).sum(axis=1) / n_row
        rho_new = (w * (y - mu_new[:, None])).sum(axis=0) / n_col
        moved = max(float(np.max(np.abs(mu_new - mu))), float(np.max(np.abs(rho_new - rho))))
        mu, rho = mu_new, rho_new
        if moved < 1e-13:
            break
    resid = w * (y - mu[:, None] - rho[None, :])
    rank = y.shape[0] + y.shape[1] - _components(seen)
    df = int(seen.sum()) - rank
    if df <= 0:
        return None
    return PooledNoise(math.sqrt(float((resid * resid).sum()) / df), df, y.shape[1] > 1)


def _components(seen: np.ndarray) -> int:
    """Connected components of the bipartite point–round graph of the seen cells (the
    additive model's rank is points + rounds − components)."""
    if seen.all():
        return 1
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    r, c = np.nonzero(seen)
    n_r, n_c = seen.shape
    graph = coo_matrix((np.ones(r.size), (r, n_r + c)), shape=(n_r + n_c, n_r + n_c))
    return int(connected_components(graph, directed=False)[0])


def _one_way(groups: Mapping[str, Group]) -> PooledNoise | None:
    """Pooled within-point sd of the log values (runs without rounds)."""
    ss, df = 0.0, 0
    for g in groups.values():
        v = g.values[g.values > 0]
        if v.size >= 2:
            logs = np.log(v)
            ss += float(((logs - logs.mean()) ** 2).sum())
            df += v.size - 1
    return PooledNoise(math.sqrt(ss / df), df, False) if df else None


def pooled_noise(groups: Mapping[str, Group], upto: int | None = None, *,
                 table: RoundTable | None = None) -> PooledNoise | None:
    """The study's noise (module docstring) over the rounds before ``upto``: the two-way
    model where the runs carry rounds, else the within-point noise. None without a degree
    of freedom. ``table`` saves building the :class:`RoundTable` again."""
    table = table or RoundTable.of(groups)
    if table is None:
        return _one_way(groups)
    return _two_way(table.upto(upto))


def study_tests(groups: Mapping[str, Group], baseline: str, direction: str,
                upto: int | None = None, *, table: RoundTable | None = None
                ) -> dict[str, TestResult | None]:
    """Every point but ``baseline`` against it on the study's pooled noise (module
    docstring), using the rounds before ``upto``; None for a point (or a baseline) with
    fewer than two values."""
    table = table or RoundTable.of(groups)
    keys = [k for k in groups if k != baseline]
    if table is None:
        return {k: _welch(groups[baseline], groups[k], direction, None) for k in keys}
    logs = table.upto(upto)
    noise = _two_way(logs)
    index = {k: i for i, k in enumerate(table.keys)}
    d = logs[index[baseline]][None, :] - logs  # log A − log B: > 0 when B takes less
    if direction == "maximize":
        d = -d
    finite = np.isfinite(d)
    pairs = finite.sum(axis=1)
    mean = np.where(finite, d, 0.0).sum(axis=1) / np.maximum(pairs, 1)
    spread = np.where(finite, d - mean[:, None], 0.0)
    sd = np.sqrt((spread * spread).sum(axis=1) / np.maximum(pairs - 1, 1))
    few = [index[k] for k in keys if pairs[index[k]] < MIN_PAIRS]
    linked = (additive_tests(logs, index[baseline], few, noise.sd_log, noise.df, direction)
              if few and noise is not None and noise.paired and table.broken else {})
    out: dict[str, TestResult | None] = {}
    for k in keys:
        i = index[k]
        c = int(pairs[i])
        if c < MIN_PAIRS:
            out[k] = linked.get(i) or _welch(groups[baseline], groups[k], direction, upto)
            continue
        out[k] = _paired(float(mean[i]), float(sd[i]), c, noise)
    return out


def _paired(mean: float, sd: float, pairs: int, noise: PooledNoise | None) -> TestResult:
    """The paired test of per-round log ratios (mean, sd over ``pairs`` rounds): on the
    pooled ``noise`` unless the pair is noisier than the study (module docstring)."""
    own_se = sd / math.sqrt(pairs)
    own = TestResult(TEST_PAIRED, mean, own_se, float(pairs - 1),
                     t_p_value(mean, own_se, pairs - 1), sd, pairs, pairs)
    if noise is None or not noise.paired or noise.sd_log == 0.0:
        return own
    pooled_var = 2.0 * noise.sd_log**2
    if sd * sd / pooled_var > float(special.fdtri(pairs - 1, noise.df, 1 - HETEROGENEITY_LEVEL)):
        return own  # this comparison is noisier than the study: its own noise judges it
    se = math.sqrt(pooled_var / pairs)
    return TestResult(TEST_POOLED_PAIRED, mean, se, float(noise.df),
                      t_p_value(mean, se, noise.df), noise.sd_log, pairs, pairs)


def _welch(a: Group, b: Group, direction: str, upto: int | None) -> TestResult | None:
    """Welch's test on the two groups' values in rounds before ``upto``: of the log ratio
    of means, or of the difference of means where a value is <= 0."""
    def values(g: Group) -> np.ndarray:
        if upto is None or g.rounds is None:
            return g.values
        return g.values[g.rounds < upto]

    va, vb = values(a), values(b)
    if va.size < 2 or vb.size < 2:
        return None
    return unpaired_test(va, vb, direction)


def noise_level(runs: pd.DataFrame, fom: str, change: float = 0.05,
                confidence: float = 0.95, *, comparisons: int = 1,
                detectable: float = math.nan, exclude_disturbed: bool = False
                ) -> NoiseLevel | None:
    """The study's run-to-run noise (:func:`pooled_noise`) and its power hint (see
    :class:`~tunelab.stats.results.NoiseLevel`) for ``comparisons`` comparisons with the
    baseline. None when no point has two successful positive values."""
    column = check_runs(runs, fom)
    groups = point_groups(runs, column, exclude_disturbed=exclude_disturbed)
    noise = pooled_noise(groups)
    if noise is None:
        return None
    needed = repeats_needed(noise.sd_log, change, confidence=confidence,
                            comparisons=comparisons,
                            points=len(groups) if noise.paired else 2)
    return NoiseLevel(noise.sd_log, noise.df, change, needed, detectable)
