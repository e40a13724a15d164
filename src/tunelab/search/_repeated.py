"""A point strategy with a fixed number of repeats per point, as a run strategy.

For a strategy whose points are known up front (``grid``, ``random``) this is the classic
plan: round by round, every point once per round in a seeded shuffled order, the baseline
first. An adaptive strategy (``optuna``) gets its next point only after the previous point's
repeats are told: the repeats of one point form one round.
"""

from __future__ import annotations

import math

from tunelab.search._rounds import Budget, RoundStrategy
from tunelab.search.base import RunRequest, Strategy
from tunelab.space import Point

__all__ = ["Repeated"]


class Repeated(RoundStrategy):
    """``repeats`` runs of every point of ``proposer``."""

    def __init__(self, proposer: Strategy, repeats: int, *, direction: str, seed: int = 0,
                 baseline: Point | None = None, budget: Budget | None = None) -> None:
        super().__init__(direction, seed, budget or Budget())
        self.name = proposer.name
        self.adaptive = proposer.adaptive
        self.proposer = proposer
        self.repeats = repeats
        self._points: list[Point] = []
        self._round = 0
        self._current: Point | None = None
        if not proposer.adaptive:
            while not proposer.done and (batch := proposer.ask(1024)):
                self._points.extend(batch)
            if baseline is not None and baseline not in self._points:
                self._points.insert(0, baseline)

    def _next_round(self) -> list[RunRequest]:
        if not self.proposer.adaptive:
            if self._round >= self.repeats:
                return []
            self._round += 1
            return [RunRequest(p, self._round - 1) for p in self._points]
        if self._current is not None:
            value = self.evidence.geometric_mean(self._current)
            self.proposer.tell(self._current, None if math.isnan(value) else value)
            self._current = None
        batch = [] if self.proposer.done else self.proposer.ask(1)
        if not batch:
            return []
        self._current = batch[0]
        return [RunRequest(self._current, r) for r in range(self.repeats)]

    def result(self) -> Point | None:
        return self.evidence.recommended()
