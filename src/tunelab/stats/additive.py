"""A point against the baseline through the study's additive model, when its pairs are too few.

A round split across ``tunelab run`` sessions, or holding runs made again by
``--rerun-disturbed``, is several blocks (:mod:`tunelab.stats.blocks`), and two points pair
only within a block. A point whose runs were made again often (it was disturbed more than
the others) can keep fewer than :data:`~tunelab.stats.results.MIN_PAIRS` blocks in common
with the baseline. Welch's test on all its runs then compares runs made under different
conditions — its reruns, made after the machine drifted, against the baseline's runs made
before — and calls the drift a speedup.

The study's two-way model (:mod:`tunelab.stats.pooled`: ``y = mu_p + beta_b + e`` over
every point and block) links the two through the other points measured in the same blocks:
the least-squares estimate of ``mu_baseline - mu_point`` takes every block effect out,
whichever blocks each side ran in, and its variance is ``sigma^2 c' (X'X)^+ c`` for the
contrast ``c``, on the pooled degrees of freedom (:data:`TEST_POOLED_ADDITIVE`). It is
used only where the pairs are too few and both sides ran in enough blocks; where the
difference is not estimable (no chain of shared blocks joins the two) or either side's
runs vary more about the model than the other points' do (an F test at
:data:`~tunelab.stats.results.HETEROGENEITY_LEVEL`, as for the pooled paired test) the
caller keeps Welch's test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

from tunelab.stats.intervals import TestResult, t_p_value
from tunelab.stats.results import HETEROGENEITY_LEVEL, MIN_PAIRS, TEST_POOLED_ADDITIVE

__all__ = ["MAX_BLOCKS", "additive_tests"]

MAX_BLOCKS = 2000
"""Most blocks for which the model is fitted (a dense matrix of that side is inverted); a
study of more keeps Welch's test for these few comparisons."""


def additive_tests(logs: np.ndarray, base: int, rows: Sequence[int], sd_log: float,
                   df: int, direction: str) -> dict[int, TestResult]:
    """The additive-model test (module docstring) of each row index in ``rows`` against
    row ``base`` of ``logs`` (points × blocks of mean log values, NaN where a point has no
    value), on the study's pooled noise ``sd_log`` with ``df`` degrees of freedom. A row
    is left out of the answer where the test does not apply (the caller keeps Welch's)."""
    seen = np.isfinite(logs)
    own = seen.sum(axis=1)
    if own[base] < MIN_PAIRS or sd_log <= 0.0 or df <= 0 or logs.shape[1] > MAX_BLOCKS:
        return {}
    rows = [i for i in rows if own[i] >= MIN_PAIRS]
    fit = _Fit.of(logs)
    if not rows or fit is None or _noisier(logs, base):
        return {}
    joined = _components(seen)
    out = {}
    for i in rows:
        if joined[i] != joined[base] or _noisier(logs, i):
            continue
        estimate = float(fit.points[base] - fit.points[i])  # log A - log B: > 0: B takes less
        if direction == "maximize":
            estimate = -estimate
        se = math.sqrt(fit.variance(base, i)) * sd_log
        common = int(np.sum(seen[base] & seen[i]))
        out[i] = TestResult(TEST_POOLED_ADDITIVE, estimate, se, float(df),
                            t_p_value(estimate, se, df), sd_log, common,
                            int(min(own[base], own[i])))
    return out


@dataclass(frozen=True)
class _Fit:
    """The additive model fitted by least squares to the finite cells of a points × blocks
    table, the points' effects eliminated so that only a blocks × blocks matrix is inverted
    (the Schur complement ``S = D_b - N' D_p^-1 N`` of the normal equations, ``N`` the
    table's 0/1 incidence): ``points`` and ``blocks`` the effects, ``sd`` the residual sd on
    ``df`` degrees of freedom (cells − rank)."""

    points: np.ndarray
    blocks: np.ndarray
    incidence: np.ndarray
    counts: np.ndarray
    schur_inverse: np.ndarray
    sd: float
    df: int

    @classmethod
    def of(cls, logs: np.ndarray) -> _Fit | None:
        """The fit; None without a residual degree of freedom."""
        seen = np.isfinite(logs)
        w = seen.astype(float)
        y = np.where(seen, logs, 0.0)
        counts = w.sum(axis=1)
        per_point = np.divide(1.0, counts, out=np.zeros_like(counts), where=counts > 0)
        schur = np.diag(w.sum(axis=0)) - w.T @ (w * per_point[:, None])
        inverse = np.linalg.pinv(schur, hermitian=True)
        blocks = inverse @ (y.sum(axis=0) - w.T @ (y.sum(axis=1) * per_point))
        points = (y.sum(axis=1) - w @ blocks) * per_point
        resid = w * (y - points[:, None] - blocks[None, :])
        used_points, used_blocks = int(np.sum(counts > 0)), int(np.sum(seen.any(axis=0)))
        df = int(seen.sum()) - (used_points + used_blocks - _count_components(seen))
        if df <= 0:
            return None
        sd = math.sqrt(float(np.sum(resid * resid)) / df)
        return cls(points, blocks, w, counts, inverse, sd, df)

    def variance(self, a: int, b: int) -> float:
        """Variance of the estimate of point ``a``'s effect less point ``b``'s, in units
        of the noise variance (``1/n_a + 1/n_b + g' S^+ g``, ``g`` the difference of their
        incidence rows each over its count; valid where the two are joined)."""
        g = self.incidence[a] / self.counts[a] - self.incidence[b] / self.counts[b]
        return float(1.0 / self.counts[a] + 1.0 / self.counts[b] + g @ self.schur_inverse @ g)


def _noisier(logs: np.ndarray, row: int) -> bool:
    """Whether point ``row``'s values vary about the other points' block effects more than
    those points' own runs vary about the model (an F test at
    :data:`~tunelab.stats.results.HETEROGENEITY_LEVEL`). The model fitted without it gives
    the blocks' effects and the noise it is judged against; its values less those effects,
    in the blocks the others ran, vary by the noise and by the effects' own error, whose
    covariance the fit knows: the spread about their mean, weighed by the inverse of that
    covariance, is a chi-square of ``k - 1`` degrees of freedom times the noise variance.
    Blocks the others do not join into one component cannot judge it: True (not trusted)."""
    rest = logs.copy()
    rest[row] = np.nan
    fit = _Fit.of(rest)
    if fit is None:
        return False
    others = np.isfinite(rest).any(axis=0)
    mine = np.isfinite(logs[row]) & others
    k = int(mine.sum())
    if k < 2:
        return False  # nothing of its own to judge
    labels = _graph(np.isfinite(rest))[2][logs.shape[0]:][mine]
    if np.unique(labels).size > 1:
        return True
    shifted = logs[row, mine] - fit.blocks[mine]
    centre = np.eye(k) - 1.0 / k
    spread = centre @ (np.eye(k) + fit.schur_inverse[np.ix_(mine, mine)]) @ centre
    deviation = centre @ shifted
    chi2 = float(deviation @ np.linalg.pinv(spread, hermitian=True) @ deviation)
    if fit.sd == 0.0:
        return chi2 > 0.0
    limit = float(special.fdtri(k - 1, fit.df, 1 - HETEROGENEITY_LEVEL))
    return chi2 / (k - 1) / (fit.sd * fit.sd) > limit


def _graph(seen: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """Connected components of the bipartite point–block graph of the seen cells: their
    count (of points and blocks with a cell), each point's label, and every node's (the
    points, then the blocks)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n_points = seen.shape[0]
    r, c = np.nonzero(seen)
    size = n_points + seen.shape[1]
    graph = coo_matrix((np.ones(r.size), (r, n_points + c)), shape=(size, size))
    count, labels = connected_components(graph, directed=False)
    isolated = int(np.sum(~seen.any(axis=1))) + int(np.sum(~seen.any(axis=0)))
    return int(count) - isolated, labels[:n_points], labels


def _count_components(seen: np.ndarray) -> int:
    """How many connected components the seen cells form (the model's rank is points +
    blocks − components)."""
    return _graph(seen)[0]


def _components(seen: np.ndarray) -> np.ndarray:
    """Each point's component: two points' difference is estimable exactly when they
    share one."""
    return _graph(seen)[1]
