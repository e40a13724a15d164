"""The point most likely best given all runs, and that probability: one recommendation.

:func:`recommend` is what ``tunelab best`` crowns and what every search strategy returns as
its final choice (``RunStrategy.result``), so the two never differ. It works on each point's
successful values only — the same input from the runs table or from a strategy's memory:

* **Scale.** Losses on the log scale (``log v`` when minimising, ``-log v`` when maximising:
  timings vary multiplicatively), or the raw values (negated when maximising) when some
  value is not positive.
* **Noise.** One run-to-run standard deviation for every point: the pooled within-point
  standard deviation (``sum (n_i - 1)`` degrees of freedom), far better determined than a
  point's own from two or three runs. While it rests on few degrees of freedom, the
  probabilities average over its posterior (scaled inverse chi-square): a noise estimate
  from one pair of runs makes nobody sure.
* **Shrinkage.** The points' true losses are taken as drawn from one normal distribution
  whose mean and spread are estimated from the point means (empirical Bayes, method of
  moments). A point's posterior mean lies between its own mean and the common mean, the
  closer to its own the more runs it has: one lucky run is believed less than ten.
* **Most likely best.** ``P(i is best) = ∫ f_i(x) Π_{j≠i} S_j(x) dx`` over the normal
  posteriors (``f`` density, ``S`` survival function), by quadrature: deterministic, no
  sampling, independent of the order the points come in. The recommendation is the point
  with the largest probability among those with at least ``min_n`` successful runs (all
  points when none has that many), so a single lucky run cannot win against measured points.

With a single point measured once, or every value equal, there is no noise to speak of: the
recommendation is then the best mean and its probability is None. :meth:`Posterior.p_within`
gives, for the strategies' stopping rule, the probability that a point is within a margin
of the best.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from tunelab.stats.results import check_direction

__all__ = ["Posterior", "Recommendation", "posterior", "recommend"]

K = TypeVar("K", bound=Hashable)

GRID = 301
"""Nodes of the uniform quadrature grid over the range where a best can lie."""

LOCAL = 41
"""Further nodes around each point that can be the best (its own width)."""

NOISE_NODES = 6
"""Quantiles of the noise's posterior the probabilities average over."""

EXACT_DF = 60
"""Degrees of freedom from which the pooled noise counts as known."""

SPAN = 8.0
"""Posterior standard deviations the quadrature reaches beyond each point's mean."""


@dataclass(frozen=True)
class Recommendation(Generic[K]):
    """The point most likely best (``point``) and that probability (``p_best``: None when
    the noise is unknown or nil). ``ranking`` is every candidate (points
    with ``min_n`` runs, or all) most likely best first; ``p_best_of`` the probability of
    each point with a run."""

    point: K
    p_best: float | None
    ranking: tuple[K, ...]
    p_best_of: Mapping[K, float]


def _losses(samples: Mapping[K, Iterable[float]], direction: str
            ) -> dict[K, np.ndarray]:
    """Each point's finite values as sorted losses (lower is better); points without one
    are left out."""
    check_direction(direction)
    finite = {k: np.sort(np.asarray([v for v in vs if math.isfinite(v)], dtype=float))
              for k, vs in samples.items()}
    finite = {k: v for k, v in finite.items() if v.size}
    sign = 1.0 if direction == "minimize" else -1.0
    if all(bool((v > 0).all()) for v in finite.values()):
        return {k: sign * np.log(v) for k, v in finite.items()}
    return {k: sign * v for k, v in finite.items()}


def _normal_posterior(means: np.ndarray, n: np.ndarray, sigma: float
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Posterior means and standard deviations of the true losses at noise ``sigma``, under
    the empirical-Bayes normal prior (none with fewer than three points)."""
    within = sigma ** 2 / n
    if means.size < 3:
        return means, np.sqrt(within)
    spread = max(float(np.var(means, ddof=1) - within.mean()), sigma ** 2 / float(n.sum()))
    precision = 1.0 / within + 1.0 / spread
    return (means / within + float(means.mean()) / spread) / precision, np.sqrt(1 / precision)


def _probabilities(m: np.ndarray, s: np.ndarray, margin: float, only: int | None = None
                   ) -> np.ndarray:
    """``P(loss_i <= loss_j + margin for every j != i)`` per point (or for point ``only``,
    the others left 0), for independent normal losses (means ``m``, deviations ``s``)."""
    from scipy.special import log_ndtr

    k = m.size
    if k == 1:
        return np.ones(1)
    if not np.all(s > 0):  # no noise: the best mean wins (ties share)
        best = m <= m.min() + margin + 1e-15
        return best / best.sum() if margin == 0 else best.astype(float)
    hi = float((m + SPAN * s).min()) + margin
    # only points whose lower tail reaches below hi can win or matter: for the others the
    # survival at every node is 1 (their log is 0) and the probability 0
    alive = np.flatnonzero(m - SPAN * s < hi)
    ma, sa = m[alive], s[alive]
    lo = float((ma - SPAN * sa).min())
    x = np.linspace(lo, hi, GRID)
    # a point much narrower than the grid's step gets nodes of its own
    narrow = sa < 10 * (hi - lo) / GRID
    if narrow.any():
        local = (ma[narrow, None] + sa[narrow, None] * np.linspace(-SPAN, SPAN, LOCAL))
        x = np.unique(np.concatenate([x, local[local <= hi]]))
    # every point's survival at x - margin, on the log scale (robust far in the tails)
    log_sf = log_ndtr((ma[:, None] + margin - x[None, :]) / sa[:, None])
    total = log_sf.sum(axis=0)
    rows = np.arange(alive.size) if only is None else np.flatnonzero(alive == only)
    z = (x[None, :] - ma[rows, None]) / sa[rows, None]
    density = np.exp(-0.5 * z * z + total[None, :] - log_sf[rows]) / (
        sa[rows, None] * math.sqrt(2 * math.pi))
    out = np.zeros(k)
    out[alive[rows]] = np.trapezoid(density, x, axis=1)
    if margin == 0 and only is None:
        out /= out.sum()
    return np.clip(out, 0.0, 1.0)


class Posterior(Generic[K]):
    """Posteriors of every measured point's true loss (see the module docstring).

    ``sigma`` is the noise estimate on ``df`` degrees of freedom: the pooled within-point
    sum of squares plus one degree of freedom of prior at the variance of the point means
    (the noise is taken to be at most about as large as the differences between points,
    until repeats say better — so equal values drawn twice do not make anyone sure).
    ``mean``/``sd`` are the normal posteriors at ``sigma``; the probabilities average over
    the noise's own posterior (:data:`NOISE_NODES` quantiles of the scaled inverse
    chi-square) while ``df`` is under :data:`EXACT_DF`.
    """

    def __init__(self, samples: Mapping[K, Iterable[float]], direction: str) -> None:
        losses = _losses(samples, direction)
        self.keys: list[K] = sorted(losses, key=str)
        n = np.array([losses[k].size for k in self.keys], dtype=float)
        means = np.array([losses[k].mean() for k in self.keys])
        ss = math.fsum(float(((v - v.mean()) ** 2).sum()) for v in losses.values())
        self.df = int((n - 1).sum())
        if means.size >= 2:  # the prior's degree of freedom
            ss += float(np.var(means, ddof=1))
            self.df += 1
        self.n = n
        self.sample_means = means
        self.sigma = math.sqrt(ss / self.df) if self.df else math.nan
        self._p_best: dict[K, float] | None = None
        self._means = means
        if self.df == 0 or self.sigma == 0.0:  # unknown or zero noise: the means as they are
            self.mean, self.sd = means, np.zeros_like(means)
            self._noises = [0.0]
            return
        self.mean, self.sd = _normal_posterior(means, n, self.sigma)
        if self.df >= EXACT_DF:
            self._noises = [self.sigma]
        else:
            from scipy.special import chdtri

            q = chdtri(self.df, 1 - (np.arange(NOISE_NODES) + 0.5) / NOISE_NODES)
            self._noises = [float(v) for v in self.sigma * np.sqrt(self.df / q)]

    def _probabilities(self, margin: float, only: int | None = None, *,
                       shrink: bool = True) -> np.ndarray:
        if self._noises == [0.0]:
            return _probabilities(self.mean, self.sd, margin, only)
        out = np.zeros(len(self.keys))
        for noise in self._noises:
            m, s = (_normal_posterior(self._means, self.n, noise) if shrink
                    else (self._means, noise / np.sqrt(self.n)))
            out += _probabilities(m, s, margin, only)
        return out / len(self._noises)

    def p_best(self) -> dict[K, float]:
        """Probability of each point being the best (they sum to 1)."""
        if self._p_best is None:
            self._p_best = dict(zip(self.keys, self._probabilities(0.0).tolist(), strict=True))
        return self._p_best

    def p_best_unpooled(self) -> dict[K, float]:
        """Probability of each point being the best, every point judged by its own runs
        alone (no shrinkage towards the common mean): the optimistic view that decides
        which points deserve another run, where :meth:`p_best` decides which one to crown."""
        probabilities = self._probabilities(0.0, shrink=False)
        return dict(zip(self.keys, probabilities.tolist(), strict=True))

    def p_within(self, margin: float) -> dict[K, float]:
        """Probability of each point's true loss being within ``margin`` (on the loss
        scale: ``log1p(0.02)`` for 2 %) of every other point's."""
        return dict(zip(self.keys, self._probabilities(margin).tolist(), strict=True))

    def p_within_of(self, key: K, margin: float, *, shrink: bool = True) -> float:
        """:meth:`p_within` of one point (cheaper); ``shrink=False``: every point judged by
        its own runs alone, as :meth:`p_best_unpooled` judges them."""
        i = self.keys.index(key)
        return float(self._probabilities(margin, i, shrink=shrink)[i])

    def recommend(self, min_n: int = 2) -> Recommendation[K] | None:
        """The point most likely best among the points with at least ``min_n`` values (all
        points when none has that many); None without a measured point."""
        if not self.keys:
            return None
        if self._noises == [0.0]:
            order = np.lexsort((np.arange(len(self.keys)), self.sample_means))
            ranking = tuple(self.keys[i] for i in order)
            return Recommendation(ranking[0], None, ranking, {})
        probabilities = self.p_best()
        measured = [k for k, n in zip(self.keys, self.n, strict=True) if n >= min_n]
        index = {k: i for i, k in enumerate(self.keys)}
        ranking = tuple(sorted(measured or self.keys, key=lambda k: (
            -probabilities[k], self.mean[index[k]], index[k])))
        return Recommendation(ranking[0], probabilities[ranking[0]], ranking, probabilities)


def posterior(samples: Mapping[K, Iterable[float]], direction: str) -> Posterior[K]:
    """The :class:`Posterior` of ``samples`` (point -> its successful values)."""
    return Posterior(samples, direction)


def recommend(samples: Mapping[K, Iterable[float]], direction: str, *, min_n: int = 2
              ) -> Recommendation[K] | None:
    """The point most likely best given ``samples`` (point -> its successful values), among
    the points with at least ``min_n`` values (all points when none has that many); None
    when no point has a finite value."""
    return Posterior(samples, direction).recommend(min_n)
