"""What the run strategies know: every run's value, per point, and quick intervals from it.

Decisions are taken on the *loss*: ``log(value)`` for a minimised figure of merit, ``-log``
for a maximised one, so lower is better and a difference of losses is the log of a ratio
(timings are noisy multiplicatively). The noise is estimated once for all points: the pooled
within-point variance of the losses (every point with two or more successful runs adds
``n - 1`` degrees of freedom), which is far better determined than a per-point variance from
two or three runs. An interval of the difference of two points' mean losses is a Student t
interval with that pooled variance. These are the strategies' quick working figures, not the
report's: what a study finally reports comes from :mod:`tunelab.stats` — and so does a
strategy's final choice, :meth:`Evidence.recommend`, the point ``tunelab best`` crowns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from tunelab.space import Point
from tunelab.stats.recommend import Posterior, Recommendation, posterior

__all__ = ["Evidence", "Interval"]


@lru_cache(maxsize=4096)
def t_quantile(q: float, df: int) -> float:
    """Student t quantile (cached: the same few (q, df) pairs come back every round)."""
    from scipy import stats

    return float(stats.t.ppf(q, df))


@dataclass(frozen=True)
class Interval:
    """``estimate`` with a one-sided ``low``/``high`` pair at the asked confidence."""

    estimate: float
    low: float
    high: float


@dataclass
class _PointRuns:
    values: dict[int, float | None]
    n: int = 0
    total: float = 0.0
    total_sq: float = 0.0

    def mean(self) -> float:
        return self.total / self.n if self.n else math.inf


class Evidence:
    """Run values per point and the pooled noise of their losses."""

    def __init__(self, direction: str) -> None:
        if direction not in ("minimize", "maximize"):
            raise ValueError(f"direction must be minimize or maximize, got {direction!r}")
        self.direction = direction
        self._sign = 1.0 if direction == "minimize" else -1.0
        self._points: dict[Point, _PointRuns] = {}
        self._keys: dict[str, Point] = {}
        self._posterior: Posterior[str] | None = None
        self._ss = 0.0
        self._df = 0

    def add(self, point: Point, repeat: int, value: float | None) -> None:
        """Record run ``repeat`` of ``point``; None, non-finite or non-positive is a failure."""
        runs = self._points.setdefault(point, _PointRuns({}))
        self._keys.setdefault(point.key, point)
        self._posterior = None
        if repeat in runs.values:
            raise ValueError(f"run {repeat} of {point.label()} was already recorded")
        ok = value is not None and math.isfinite(value) and value > 0
        runs.values[repeat] = value if ok else None
        if not ok:
            return
        assert value is not None
        loss = self._sign * math.log(value)
        if runs.n:  # replace the point's share of the pooled sum of squares
            self._ss -= runs.total_sq - runs.total * runs.total / runs.n
        runs.n += 1
        runs.total += loss
        runs.total_sq += loss * loss
        self._ss += runs.total_sq - runs.total * runs.total / runs.n
        self._df += 1 if runs.n >= 2 else 0

    def points(self) -> list[Point]:
        """Every point with at least one recorded run, in order of first run."""
        return list(self._points)

    def runs(self, point: Point) -> dict[int, float | None]:
        """Recorded runs of ``point``: repeat -> value (None for a failed run)."""
        runs = self._points.get(point)
        return dict(runs.values) if runs else {}

    def attempts(self, point: Point) -> int:
        """Runs of ``point`` recorded, failed ones included."""
        runs = self._points.get(point)
        return len(runs.values) if runs else 0

    def n(self, point: Point) -> int:
        """Successful runs of ``point``."""
        runs = self._points.get(point)
        return runs.n if runs else 0

    def mean_loss(self, point: Point) -> float:
        """Mean loss of ``point`` (inf without a successful run)."""
        runs = self._points.get(point)
        return runs.mean() if runs else math.inf

    def geometric_mean(self, point: Point) -> float:
        """Geometric mean of the successful values (NaN without one)."""
        loss = self.mean_loss(point)
        return math.exp(self._sign * loss) if math.isfinite(loss) else math.nan

    @property
    def noise(self) -> tuple[float, int]:
        """Pooled standard deviation of the losses and its degrees of freedom."""
        if self._df == 0:
            return math.nan, 0
        return math.sqrt(max(self._ss, 0.0) / self._df), self._df

    def samples(self) -> dict[str, list[float]]:
        """Every point's successful values, by point key (as the runs table has them)."""
        return {p.key: [v for v in runs.values.values() if v is not None]
                for p, runs in self._points.items()}

    def point(self, key: str) -> Point:
        """The measured point whose key is ``key``."""
        return self._keys[key]

    def posterior(self) -> Posterior[str]:
        """The posterior of every measured point's loss, by point key
        (:mod:`tunelab.stats.recommend`; kept until the next run is recorded)."""
        if self._posterior is None:
            self._posterior = posterior(self.samples(), self.direction)
        return self._posterior

    def recommend(self, min_n: int = 2) -> Recommendation[str] | None:
        """The point (key) most likely best given every run — what ``tunelab best`` crowns
        from the same runs — or None before a successful run."""
        return self.posterior().recommend(min_n)

    def recommended(self, min_n: int = 2) -> Point | None:
        """The point of :meth:`recommend`."""
        choice = self.recommend(min_n)
        return self._keys[choice.point] if choice is not None else None

    def best(self, candidates: list[Point] | None = None, min_n: int = 1) -> Point | None:
        """The candidate with the lowest mean loss among those with ``min_n`` successes
        (fewer when none has that many); ties go to the earlier point."""
        pool = candidates if candidates is not None else self.points()
        for need in (min_n, 1):
            scored = [(self.mean_loss(p), i, p) for i, p in enumerate(pool) if self.n(p) >= need]
            if scored:
                return min(scored, key=lambda t: (t[0], t[1]))[2]
        return None

    def advantage(self, a: Point, b: Point, confidence: float) -> Interval | None:
        """How much better ``b`` is than ``a``: ``mean loss(a) - mean loss(b)`` (> 0: b
        better, the log of the ratio), with the one-sided ``confidence`` bounds; None until
        both have a successful run and the noise has a degree of freedom."""
        na, nb = self.n(a), self.n(b)
        sd, df = self.noise
        if na == 0 or nb == 0 or df == 0:
            return None
        estimate = self.mean_loss(a) - self.mean_loss(b)
        half = t_quantile(confidence, df) * sd * math.sqrt(1.0 / na + 1.0 / nb)
        return Interval(estimate, estimate - half, estimate + half)
