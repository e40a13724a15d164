"""``racing``: repeats go to the candidates that can still win.

Candidates come from a point strategy — every point of ``grid`` or ``random`` at once, or
``per_round`` new proposals of ``optuna`` each round — and enter a :class:`Race`: each round,
every candidate still in the race gets one more run; after the round, the ones that cannot
beat the incumbent by more than the indifference (one-sided interval on the pooled noise) are
dropped. It stops when the race is settled and the proposer has nothing more, or the budget
(``max_runs``, ``max_wall``) is spent. An adaptive proposer is told a candidate's mean once it
has its first ``min_repeats`` runs.
"""

from __future__ import annotations

import math

from tunelab.search._rounds import Budget, Race, RaceSettings, RoundStrategy
from tunelab.search.base import RunRequest, Strategy
from tunelab.space import Point

__all__ = ["Racing"]


class Racing(RoundStrategy):
    """Races the proposals of ``proposer`` (see the module docstring)."""

    name = "racing"

    def __init__(self, proposer: Strategy, *, direction: str, seed: int = 0,
                 settings: RaceSettings | None = None, budget: Budget | None = None,
                 baseline: Point | None = None, per_round: int = 2) -> None:
        super().__init__(direction, seed, budget or Budget())
        self.proposer = proposer
        self.settings = settings or RaceSettings()
        self.race = Race(self.evidence, self.settings)
        self.per_round = max(1, per_round)
        self._untold: list[Point] = []
        if baseline is not None:
            self._enter([baseline])
        if not proposer.adaptive:
            while not proposer.done and (batch := proposer.ask(1024)):
                self._enter(batch)

    def _enter(self, points: list[Point]) -> None:
        self.race.enter(points)
        if self.proposer.adaptive:
            self._untold.extend(p for p in points if p not in self._untold)

    def _tell_proposer(self) -> None:
        ev, need = self.evidence, self.settings.min_repeats
        for p in list(self._untold):
            if ev.attempts(p) >= need or p in self.race.dropped:
                value = ev.geometric_mean(p)
                self.proposer.tell(p, None if math.isnan(value) else value)
                self._untold.remove(p)

    def _next_round(self) -> list[RunRequest]:
        self.race.judge()
        if self.proposer.adaptive:
            self._tell_proposer()
            if not self.proposer.done:
                self._enter(self.proposer.ask(self.per_round))
        if len(self.race.alive) <= 1:
            return []
        return self.race.requests()

    def result(self) -> Point | None:
        return self.evidence.recommended()
