"""The search-strategy contracts: points to run, or runs to make.

Two levels, both seeded and deterministic, so that a study resumes by replaying its history:

* :class:`Strategy` proposes *points* of a :class:`~tunelab.space.Space`. ``ask(n)`` returns up
  to ``n`` points not proposed before (fewer, or none, when it has nothing more to propose
  now); ``tell(point, value)`` reports the objective's mean value of a finished point (None
  when every run of it failed); ``done`` is True when it will propose nothing more. Points are
  immutable and canonical, so a strategy never proposes the same point twice. Every point gets
  the study's fixed number of repeats.
* :class:`RunStrategy` decides *runs*: ``ask_runs(n)`` returns up to ``n`` :class:`RunRequest`
  (point, repeat) that may run now in any order or at the same time (their results do not
  influence each other's choice); ``tell_run(request, value)`` reports one finished run's
  objective value (None for a failed run); ``done`` is True when no run will be requested any
  more. A run strategy spends repeats where they decide something (racing), or judges points
  by their runs rather than by a mean (one-at-a-time, hierarchical). ``result()`` names the
  point it would choose now. The runner only executes requests: it answers a request already
  in the store from the store, so asking again after a restart replays the same history.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from tunelab.space import Point

__all__ = ["RunRequest", "RunStrategy", "Strategy"]


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


@dataclass(frozen=True)
class RunRequest:
    """One run to make: repeat ``repeat`` (0-based) of ``point``."""

    point: Point
    repeat: int


class RunStrategy(ABC):
    """Decides which (point, repeat) runs to make next, from the runs' own values."""

    name: str
    adaptive: bool = True

    @abstractmethod
    def ask_runs(self, n: int) -> list[RunRequest]:
        """Up to ``n`` runs that may be made now, in this order (none: wait for results)."""

    @abstractmethod
    def tell_run(self, request: RunRequest, value: float | None) -> None:
        """Report a finished run's objective value (None if the run failed)."""

    @property
    @abstractmethod
    def done(self) -> bool:
        """True when no further run will be requested."""

    @abstractmethod
    def result(self) -> Point | None:
        """The point this strategy would choose now (None before any successful run)."""
