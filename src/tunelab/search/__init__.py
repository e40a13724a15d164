"""Search strategies behind one ask/tell contract."""

from __future__ import annotations

from tunelab.errors import StudyError
from tunelab.search._static import GridSearch, RandomSearch
from tunelab.search.base import Strategy
from tunelab.space import Space

__all__ = ["GridSearch", "RandomSearch", "Strategy", "make_strategy"]

STRATEGIES = ("grid", "random")


def make_strategy(name: str, space: Space, *, seed: int = 0,
                  samples: int | None = None) -> Strategy:
    """The strategy called ``name`` over ``space``."""
    if name == "grid":
        return GridSearch(space)
    if name == "random":
        if samples is None:
            raise StudyError("search strategy 'random' needs 'samples: N'")
        return RandomSearch(space, samples, seed)
    raise StudyError(f"unknown search strategy {name!r}; valid: {', '.join(STRATEGIES)}")
