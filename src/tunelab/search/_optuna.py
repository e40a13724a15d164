"""Model-based search with Optuna's TPE sampler, through ask-and-tell.

Every axis of the space becomes a categorical distribution over its values. A proposal that
violates a constraint is told to Optuna as failed and never run; a proposal of a point that
was already measured is answered from memory. With the same seed and the same results the
proposals repeat exactly, which is what lets an interrupted study resume.
"""

from __future__ import annotations

from typing import Any, Literal, cast

from tunelab.search.base import Strategy
from tunelab.space import Point, Space

__all__ = ["OptunaSearch"]

_MAX_FRUITLESS_ASKS = 2000


class OptunaSearch(Strategy):
    """Up to ``trials`` distinct valid points proposed by Optuna's TPE sampler."""

    name = "optuna"
    adaptive = True

    def __init__(self, space: Space, *, trials: int, direction: str, seed: int = 0,
                 first: Point | None = None) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self._space = space
        self._trials = trials
        self._study = optuna.create_study(
            direction=cast(Literal["minimize", "maximize"], direction),
            sampler=optuna.samplers.TPESampler(seed=seed),
        )
        if first is not None:
            self._study.enqueue_trial(dict(first))
        self._pending: dict[Point, Any] = {}
        self._seen: dict[Point, float | None] = {}
        self._exhausted = False

    def ask(self, n: int) -> list[Point]:
        fail = self._optuna.trial.TrialState.FAIL
        out: list[Point] = []
        fruitless = 0
        while len(out) < n and not self.done:
            trial = self._study.ask()
            values: dict[str, Any] = {
                a.name: trial.suggest_categorical(a.name, list(a.values))
                for a in self._space.axes
            }
            point = Point(values)
            if point in self._seen or point in self._pending or not self._space.contains(point):
                value = self._seen.get(point)
                if value is None:
                    self._study.tell(trial, state=fail)
                else:
                    self._study.tell(trial, value)
                fruitless += 1
                if fruitless >= _MAX_FRUITLESS_ASKS:  # the sampler only finds known points
                    self._exhausted = True
                continue
            self._pending[point] = trial
            out.append(point)
        return out

    def tell(self, point: Point, value: float | None) -> None:
        trial = self._pending.pop(point)
        if value is None:
            self._study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
        else:
            self._study.tell(trial, value)
        self._seen[point] = value

    @property
    def done(self) -> bool:
        return self._exhausted or len(self._seen) + len(self._pending) >= self._trials
