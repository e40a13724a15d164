"""``auto``: the search chosen from the space's size and the run budget.

* **Every point fits the budget** (no ``max_runs``, or ``max_runs`` at least the number of
  valid points): every point runs once (grid, the baseline first), then the runs left go to
  a contest among the points likely to be the best (:class:`~tunelab.search._endgame.
  Contest`) until the winner is certain — grid with racing. No point is skipped, so a lone
  good configuration (a needle) cannot be missed.
* **A larger space than the budget**: Optuna TPE proposes new points over the joint space
  (``per_round`` per round, each run once, the baseline first), keeping a quarter of the
  budget (:data:`RESERVE`) for the contest — TPE with racing. When the winner is certain
  before the budget is spent, TPE proposes more.

Either way the final choice is the point most likely best given all runs
(:mod:`tunelab.stats.recommend`), the one ``tunelab best`` crowns.
"""

from __future__ import annotations

from tunelab.search._endgame import Endgame
from tunelab.search._rounds import Budget, RaceSettings, RoundStrategy
from tunelab.search._static import GridSearch
from tunelab.search.base import RunRequest, Strategy
from tunelab.space import Point, Space

__all__ = ["RESERVE", "Auto"]

RESERVE = 0.25
"""Share of the budget a model-based search keeps for the contest of its best points."""

GRID_BUDGET = 1.5
"""Share of the budget a model-based search keeps for the contest of its best points."""


class Auto(RoundStrategy):
    """Grid with a contest when the budget covers the space, else TPE with a contest."""

    name = "auto"

    def __init__(self, space: Space, *, direction: str, seed: int = 0,
                 settings: RaceSettings | None = None, budget: Budget | None = None,
                 baseline: Point | None = None, env_sets: dict[str, dict[str, str]] | None = None,
                 per_round: int = 2, sampler: str = "tpe") -> None:
        super().__init__(direction, seed, budget or Budget())
        self.baseline = baseline
        self.settings = settings or RaceSettings()
        size = space.size
        runs = self.budget.max_runs
        proposer: Strategy
        if runs is None or runs >= GRID_BUDGET * size:
            self.mode = "grid"
            proposer = GridSearch(space)
            reserve = 0.0
        else:
            from tunelab.search._optuna import OptunaSearch

            self.mode = "model"
            proposer = OptunaSearch(space, trials=size, direction=direction, seed=seed,
                                    first=baseline, sampler=sampler, env_sets=env_sets)
            reserve = RESERVE
        self.endgame = Endgame(self.evidence, self.settings, self.budget, proposer,
                               reserve=reserve, per_round=per_round)

    def _first(self) -> Point | None:
        return self.baseline

    def _next_round(self) -> list[RunRequest]:
        return self.endgame.next_round()

    def result(self) -> Point | None:
        return self.evidence.recommended()
