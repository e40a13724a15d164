"""Search strategies behind one ask/tell contract."""

from __future__ import annotations

from tunelab.errors import StudyError
from tunelab.search._static import GridSearch, RandomSearch
from tunelab.search.base import Strategy
from tunelab.space import Point, Space

__all__ = ["GridSearch", "RandomSearch", "Strategy", "make_strategy"]

STRATEGIES = ("grid", "random", "optuna")


def make_strategy(name: str, space: Space, *, seed: int = 0, samples: int | None = None,
                  direction: str = "minimize", first: Point | None = None) -> Strategy:
    """The strategy called ``name`` over ``space``.

    ``samples`` is the number of points for ``random`` and ``optuna``; ``direction`` and
    ``first`` (a point to try first, the baseline) matter to ``optuna`` only.
    """
    if name == "grid":
        return GridSearch(space)
    if name == "random":
        if samples is None:
            raise StudyError("search strategy 'random' needs 'samples: N'")
        return RandomSearch(space, samples, seed)
    if name == "optuna":
        if samples is None:
            raise StudyError("search strategy 'optuna' needs 'samples: N'")
        from tunelab.search._optuna import OptunaSearch

        return OptunaSearch(space, trials=samples, direction=direction, seed=seed, first=first)
    raise StudyError(f"unknown search strategy {name!r}; valid: {', '.join(STRATEGIES)}")
