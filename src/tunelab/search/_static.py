"""Strategies whose whole plan is known up front: grid and random sampling."""

from __future__ import annotations

from tunelab.search.base import Strategy
from tunelab.space import Point, Space

__all__ = ["GridSearch", "RandomSearch"]


class _PlannedSearch(Strategy):
    def __init__(self, points: list[Point]) -> None:
        self._points = points
        self._next = 0

    def ask(self, n: int) -> list[Point]:
        batch = self._points[self._next:self._next + n]
        self._next += len(batch)
        return batch

    @property
    def done(self) -> bool:
        return self._next >= len(self._points)


class GridSearch(_PlannedSearch):
    """Every valid point of the space, in enumeration order."""

    name = "grid"

    def __init__(self, space: Space) -> None:
        super().__init__(space.points())


class RandomSearch(_PlannedSearch):
    """``samples`` distinct valid points drawn with a seeded generator."""

    name = "random"

    def __init__(self, space: Space, samples: int, seed: int = 0) -> None:
        super().__init__(space.sample(samples, seed))
