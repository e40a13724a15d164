"""The machinery the run strategies share: a run budget, rounds of requests, and a race.

A :class:`RoundStrategy` hands out its requests one *round* at a time: a round holds at most
one run per point, in a seeded shuffled order, and the next round is planned only when every
run of the current one has been told — so runs stay interleaved round by round (slow drift
of the machine spreads over all points, and a paired analysis can block on rounds), and the
strategy decides on complete evidence.

A :class:`Race` is a set of candidates with a common rule: after each round, a candidate is
dropped when the one-sided interval of its advantage over the incumbent (the candidate with
the best mean) lies below ``indifference`` — it cannot be better than the incumbent by more
than that much. Only the candidates still in the race get more runs; the race is settled when
one is left or every one left has ``max_repeats`` runs.
"""

from __future__ import annotations

import math
import random
import time
from abc import abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tunelab.errors import StudyError
from tunelab.search._evidence import Evidence
from tunelab.search.base import RunRequest, RunStrategy
from tunelab.space import Point

__all__ = ["Budget", "Race", "RaceSettings", "RoundStrategy"]


@dataclass(frozen=True)
class RaceSettings:
    """How a race decides (see the module docstring).

    ``min_repeats`` runs every candidate gets before it can be dropped; ``max_repeats`` the
    most it ever gets; ``confidence`` of each one-sided elimination test; ``indifference``
    the relative change below which two points count as equal (the noise threshold).
    """

    min_repeats: int = 2
    max_repeats: int = 10
    confidence: float = 0.95
    indifference: float = 0.02

    def __post_init__(self) -> None:
        if not 1 <= self.min_repeats <= self.max_repeats:
            raise StudyError(f"search: need 1 <= min_repeats ({self.min_repeats}) <= "
                             f"max_repeats ({self.max_repeats})")
        if not 0.5 < self.confidence < 1:
            raise StudyError(f"search: confidence must lie in (0.5, 1), got {self.confidence}")
        if not 0 <= self.indifference < 1:
            raise StudyError(f"search: indifference must lie in [0, 1), got "
                             f"{self.indifference}")

    @property
    def margin(self) -> float:
        """``indifference`` on the log scale of the evidence."""
        return math.log1p(self.indifference)


class Budget:
    """Runs and wall-clock seconds a strategy may still spend (None: unlimited).

    The wall clock starts at the first request of this process (a resumed study gets its
    full ``max_wall`` again), or at ``started`` (a reading of ``clock``: a strategy made
    again within one process keeps the clock of the first); ``clock`` is injectable for
    simulations.
    """

    def __init__(self, max_runs: int | None = None, max_wall_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, *,
                 started: float | None = None) -> None:
        if max_runs is not None and max_runs < 1:
            raise StudyError(f"search: max_runs must be at least 1, got {max_runs}")
        if max_wall_s is not None and max_wall_s <= 0:
            raise StudyError(f"search: max_wall must be positive, got {max_wall_s}")
        self.max_runs = max_runs
        self.max_wall_s = max_wall_s
        self._clock = clock
        self._started = started
        self.used = 0

    def left(self) -> int | None:
        """Runs that may still be requested (None: no limit); 0 once the wall time is up."""
        if self._started is None:
            self._started = self._clock()
        if self.max_wall_s is not None and self._clock() - self._started >= self.max_wall_s:
            return 0
        return None if self.max_runs is None else max(self.max_runs - self.used, 0)

    def spend(self, runs: int) -> None:
        """Count ``runs`` requests as spent."""
        self.used += runs


class RoundStrategy(RunStrategy):
    """A run strategy that plans one round at a time (see the module docstring)."""

    def __init__(self, direction: str, seed: int, budget: Budget) -> None:
        self.evidence = Evidence(direction)
        self.budget = budget
        self._rng = random.Random(seed)
        self._queue: list[RunRequest] = []
        self._outstanding: set[RunRequest] = set()
        self._finished = False

    @abstractmethod
    def _next_round(self) -> list[RunRequest]:
        """The runs of the next round (unordered); empty when the strategy is finished."""

    def ask_runs(self, n: int) -> list[RunRequest]:
        if not self._queue and not self._outstanding and not self._finished:
            left = self.budget.left()
            planned = [] if left == 0 else self._next_round()
            if not planned:
                self._finished = True
            else:
                self._queue = self._order(planned, left)
        batch, self._queue = self._queue[:n], self._queue[n:]
        self._outstanding.update(batch)
        self.budget.spend(len(batch))
        return batch

    def _order(self, planned: list[RunRequest], left: int | None) -> list[RunRequest]:
        if left is not None and len(planned) > left:
            # Too few runs left for a whole round: the least-measured, then the best, first.
            ev = self.evidence
            planned = sorted(planned, key=lambda r: (ev.attempts(r.point),
                                                     ev.mean_loss(r.point), r.point.key))[:left]
        else:
            planned = sorted(planned, key=lambda r: (r.point.key, r.repeat))
        # The baseline is shuffled too: a study's first run is often slower (cold caches),
        # and a point always run first in its round would carry that cost into every
        # comparison with it.
        self._rng.shuffle(planned)
        return planned

    def tell_run(self, request: RunRequest, value: float | None) -> None:
        self._outstanding.discard(request)
        self.evidence.add(request.point, request.repeat, value)

    @property
    def done(self) -> bool:
        return self._finished and not self._queue and not self._outstanding


class Race:
    """Candidates racing on shared evidence (see the module docstring)."""

    def __init__(self, evidence: Evidence, settings: RaceSettings) -> None:
        self.evidence = evidence
        self.settings = settings
        self.alive: list[Point] = []
        self.dropped: dict[Point, str] = {}

    def enter(self, points: Iterable[Point]) -> None:
        """Add candidates (points already racing or dropped are ignored)."""
        for p in points:
            if p not in self.alive and p not in self.dropped:
                self.alive.append(p)

    def requests(self) -> list[RunRequest]:
        """One more run for every candidate below ``max_repeats``."""
        ev = self.evidence
        return [RunRequest(p, ev.attempts(p)) for p in self.alive
                if ev.attempts(p) < self.settings.max_repeats]

    def leader(self) -> Point | None:
        """The candidate with the best mean loss, preferring fully entered ones."""
        return self.evidence.best(self.alive, self.settings.min_repeats)

    def judge(self) -> None:
        """Drop the candidates that failed or cannot beat the leader by the indifference."""
        ev, s = self.evidence, self.settings
        for p in list(self.alive):
            if ev.attempts(p) >= s.min_repeats and ev.n(p) == 0:
                self.alive.remove(p)
                self.dropped[p] = "every run failed"
        leader = self.leader()
        if leader is None or ev.n(leader) < min(s.min_repeats, 2):
            return
        for p in list(self.alive):
            if p == leader or ev.attempts(p) < s.min_repeats:
                continue
            iv = ev.advantage(leader, p, s.confidence)
            if iv is not None and iv.high < s.margin:
                self.alive.remove(p)
                self.dropped[p] = f"not better than {leader.label()}"

    @property
    def settled(self) -> bool:
        """One candidate left, or none that may run again."""
        return len(self.alive) <= 1 or not self.requests()
