"""The search-strategy contract: ask for points, tell results.

A strategy proposes points of a :class:`~tunelab.space.Space`. ``ask(n)`` returns up to ``n``
points not proposed before (fewer, or none, when it has nothing more to propose now);
``tell(point, value)`` reports the objective's mean value of a finished point (None when
every run of it failed); ``done`` is True when it will propose nothing more. Points are
immutable and canonical, so a strategy never proposes the same point twice.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from tunelab.space import Point

__all__ = ["Strategy"]


class Strategy(ABC):
    """Proposes points to run; learns from their results (or ignores them)."""

    name: str
    adaptive: bool = False
    """True when proposals depend on results: points are then run one at a time."""

    @abstractmethod
    def ask(self, n: int) -> list[Point]:
        """Up to ``n`` new points."""

    def tell(self, point: Point, value: float | None) -> None:  # noqa: B027 - optional hook
        """Report the objective value of a finished point (None if it failed)."""

    @property
    @abstractmethod
    def done(self) -> bool:
        """True when no further point will be proposed."""
