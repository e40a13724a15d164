"""``auto``: the search chosen from the space's size and the run budget.

* **The budget covers every point and a contest** (no ``max_runs``, or ``max_runs`` at least
  :data:`GRID_BUDGET` runs per valid point): every point runs once (grid, the baseline
  first), then the runs left go to a contest among the points likely to be the best
  (:class:`~tunelab.search._endgame.Contest`) until the winner is certain — grid with
  racing. No point is skipped, so a lone good configuration (a needle) cannot be missed.
* **A smaller budget**: Optuna TPE proposes new points over the joint space (``per_round``
  per round, each run once, the baseline first), keeping a quarter of the runs
  (:data:`~tunelab.search._endgame.RESERVE`) for the contest — TPE with racing. When the
  winner is certain before the budget is spent, TPE proposes more.

Either way the final choice is the point most likely best given all runs
(:mod:`tunelab.stats.recommend`), the one ``tunelab best`` crowns.
"""

from __future__ import annotations

from tunelab.errors import StudyError
from tunelab.search._endgame import Endgame, joint_search
from tunelab.search._rounds import Budget, RaceSettings, RoundStrategy
from tunelab.search._static import GridSearch
from tunelab.search.base import RunRequest
from tunelab.space import Point, Space

__all__ = ["GRID_BUDGET", "Auto"]

GRID_BUDGET = 1.5
"""Budget, in runs per valid point, from which ``auto`` measures every point."""


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
        runs = self.budget.max_runs
        valid = len(space.points()) if space.enumerable else None
        if valid is None and runs is None:
            raise StudyError(f"search strategy 'auto' over a space too large to enumerate "
                             f"({space.size:,} combinations) needs 'max_runs: N'")
        if runs is None or (valid is not None and runs >= GRID_BUDGET * valid):
            self.mode = "grid"
            self.endgame = Endgame(self.evidence, self.settings, self.budget, GridSearch(space))
        else:
            self.mode = "model"
            self.endgame = joint_search(space, self.evidence, self.settings, self.budget,
                                        seed=seed, env_sets=env_sets, sampler=sampler,
                                        per_round=per_round, first=baseline)

    def _first(self) -> Point | None:
        return self.baseline

    def _next_round(self) -> list[RunRequest]:
        return self.endgame.next_round()

    def result(self) -> Point | None:
        return self.evidence.recommended()
