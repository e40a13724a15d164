"""``auto``: the search chosen from the space's size and the run budget.

* **The budget covers every point and a contest** (no ``max_runs``, ``max_runs`` at least
  :data:`GRID_BUDGET` runs per valid point, or one run per point of a space of at most
  :data:`SMALL_SPACE` points): every point runs once (grid, in a shuffled order), then the
  runs left go to a contest among the points likely to be the best
  (:class:`~tunelab.search._endgame.Contest`) until the winner is certain — grid with
  racing. No point is skipped, so a lone good configuration (a needle) cannot be missed.
* **A smaller budget**: Optuna TPE proposes new points over the joint space (``per_round``
  per round, each run once, the baseline in the first round), keeping a fifth of the runs
  (:data:`~tunelab.search._endgame.RESERVE`) for the contest — TPE with racing; a budget of
  fewer runs than the space has points keeps that fifth times its runs per point (a tenth at
  half a run per point): there, new points find the best more often than contest runs (on
  the interaction kind of ``benchmarks/search_efficiency.py``, 12 landscapes drawn apart, at
  half a run per point: 0.605 with a fifth kept, 0.646 with a tenth, plain TPE 0.662; the
  needle kind 0.448 and 0.472). When the
  winner is certain before the budget is spent, TPE proposes more. A budget of at most
  :data:`EXPLORE_ONLY` runs keeps nothing for the contest: TPE's first ten proposals are
  random, and with a run or two left after so few points, measuring one more point once
  finds the best more often than a second run of one already measured. Nor does such a
  budget spend a run on the study's baseline up front (:func:`baseline_first`): every point runs
  once, so no run-to-run noise is measured and no verdict against the baseline can come of
  it, while its run is one point fewer explored — from the worst or median point of a small
  space, the odds of ending within 5 % of the best fell below plain TPE's by up to 0.14.
  TPE may still draw it.

Either way the final choice is the point most likely best given all runs
(:mod:`tunelab.stats.recommend`), the one ``tunelab best`` crowns.
"""

from __future__ import annotations

from tunelab.errors import StudyError
from tunelab.search._endgame import RESERVE, Endgame, joint_search
from tunelab.search._evidence import Evidence
from tunelab.search._rounds import Budget, RaceSettings, RoundStrategy
from tunelab.search._static import GridSearch
from tunelab.search.base import RunRequest
from tunelab.space import Point, Space

__all__ = ["EXPLORE_ONLY", "GRID_BUDGET", "SMALL_SPACE", "Auto", "baseline_first", "covers",
           "plan"]

GRID_BUDGET = 1.5
"""Budget, in runs per valid point, from which ``auto`` measures every point."""

SMALL_SPACE = 20
"""Valid points up to which a budget of one run per point measures every point: TPE's first
ten proposals are random, so on a space this small the model would pick a random subset."""


EXPLORE_ONLY = 12
"""Budgets (``max_runs``) up to which the model-based plan spends every run on new points:
at most a fifth kept back would leave the exploration inside TPE's ten random first proposals
(Optuna's ``n_startup_trials``) for a contest of one or two runs."""


def covers(space: Space, budget: Budget) -> bool:
    """Whether ``budget`` (a ``max_runs``) covers measuring every valid point of ``space``:
    :data:`GRID_BUDGET` runs per point, or one per point of a space of at most
    :data:`SMALL_SPACE` points."""
    runs = budget.max_runs
    if runs is None or not space.enumerable:
        return False
    valid = len(space.points())
    return runs >= GRID_BUDGET * valid or (valid <= SMALL_SPACE and runs >= valid)


def baseline_first(space: Space, budget: Budget) -> bool:
    """Whether ``auto`` measures the study's baseline in its first round: unless the budget
    is at most :data:`EXPLORE_ONLY` runs and does not cover every point (see the module
    docstring)."""
    runs = budget.max_runs
    return runs is None or runs > EXPLORE_ONLY or covers(space, budget)


def plan(space: Space, evidence: Evidence, settings: RaceSettings, budget: Budget, *,
         seed: int, env_sets: dict[str, dict[str, str]] | None, sampler: str,
         per_round: int, first: Point | None) -> tuple[str, Endgame]:
    """``auto``'s plan for ``budget`` over ``space`` (see the module docstring): its mode
    (``grid`` or ``model``) and the endgame that carries it out."""
    if not space.enumerable and budget.max_runs is None:
        raise StudyError(f"search strategy 'auto' over a space too large to enumerate "
                         f"({space.size:,} combinations) needs 'max_runs: N'")
    if budget.max_runs is None or covers(space, budget):
        return "grid", Endgame(evidence, settings, budget, GridSearch(space))
    reserve = 0.0 if budget.max_runs <= EXPLORE_ONLY else RESERVE
    if space.enumerable:  # under a run per point, new points find more than the contest
        reserve *= min(1.0, budget.max_runs / len(space.points()))
    return "model", joint_search(space, evidence, settings, budget, seed=seed,
                                 env_sets=env_sets, sampler=sampler, per_round=per_round,
                                 first=first if baseline_first(space, budget) else None,
                                 reserve=reserve)


class Auto(RoundStrategy):
    """Grid with a contest when the budget covers the space, else TPE with a contest."""

    name = "auto"

    def __init__(self, space: Space, *, direction: str, seed: int = 0,
                 settings: RaceSettings | None = None, budget: Budget | None = None,
                 baseline: Point | None = None, env_sets: dict[str, dict[str, str]] | None = None,
                 per_round: int = 2, sampler: str = "tpe") -> None:
        super().__init__(direction, seed, budget or Budget())
        self.settings = settings or RaceSettings()
        self.mode, self.endgame = plan(space, self.evidence, self.settings, self.budget,
                                       seed=seed, env_sets=env_sets, sampler=sampler,
                                       per_round=per_round, first=baseline)

    def _next_round(self) -> list[RunRequest]:
        return self.endgame.next_round()

    def result(self) -> Point | None:
        return self.evidence.recommended()
