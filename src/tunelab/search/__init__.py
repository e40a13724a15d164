"""Search strategies behind one ask/tell contract (see :mod:`tunelab.search.base`).

Point strategies (every point gets the study's ``repeats``): ``grid``, ``random``, ``optuna``
(TPE, GP or CMA-ES, proposing valid points only). Run strategies (they decide the repeats
too): ``auto`` (grid with a contest when the budget covers the space, else TPE with a
contest), ``racing`` (races the proposals of grid, random or optuna), ``one-at-a-time``
(options alone against the baseline, their combination, a local check), ``hierarchical``
(groups of parameters tuned in order); the last two search the joint space when options
interact. Every run strategy's final choice is the point ``tunelab best`` crowns
(:mod:`tunelab.stats.recommend`). :func:`make_run_strategy` gives every strategy as a run
strategy.
:class:`RunPruner` stops training runs whose intermediate figures fall behind (``prune: true``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tunelab.errors import StudyError
from tunelab.search._pruning import IntermediateTail, PruneTrial, RunPruner
from tunelab.search._rounds import Budget, RaceSettings
from tunelab.search._static import GridSearch, RandomSearch
from tunelab.search.base import RunRequest, RunStrategy, Strategy
from tunelab.space import Point, Space

__all__ = [
    "POINT_STRATEGIES",
    "RUN_STRATEGIES",
    "STRATEGIES",
    "Budget",
    "GridSearch",
    "IntermediateTail",
    "PruneTrial",
    "RaceSettings",
    "RandomSearch",
    "RunPruner",
    "RunRequest",
    "RunStrategy",
    "SearchSettings",
    "Strategy",
    "make_run_strategy",
    "make_strategy",
]

POINT_STRATEGIES = ("grid", "random", "optuna")
RUN_STRATEGIES = ("auto", "racing", "one-at-a-time", "hierarchical")
STRATEGIES = POINT_STRATEGIES + RUN_STRATEGIES


@dataclass(frozen=True)
class SearchSettings:
    """A study's ``search:`` section (see docs/search.md for each field)."""

    strategy: str = "grid"
    seed: int = 0
    samples: int | None = None
    sampler: str = "tpe"
    propose: str = "grid"
    min_repeats: int = 2
    max_repeats: int = 10
    confidence: float = 0.95
    indifference: float | None = None
    max_runs: int | None = None
    max_wall_s: float | None = None
    per_round: int = 2
    groups: list[list[str]] | None = field(default=None)
    prune: bool = False

    def race(self, noise_threshold: float) -> RaceSettings:
        """The race settings (indifference defaults to the study's noise threshold)."""
        indifference = self.indifference if self.indifference is not None else noise_threshold
        return RaceSettings(self.min_repeats, self.max_repeats, self.confidence, indifference)


def make_strategy(name: str, space: Space, *, seed: int = 0, samples: int | None = None,
                  direction: str = "minimize", first: Point | None = None,
                  sampler: str = "tpe", env_sets: dict[str, dict[str, str]] | None = None
                  ) -> Strategy:
    """The point strategy called ``name`` over ``space``.

    ``samples`` is the number of points for ``random`` and ``optuna``; ``direction``,
    ``first`` (a point to try first, the baseline), ``sampler`` (tpe, gp, cmaes) and
    ``env_sets`` (the study's environment sets, so a sampler sees their variables) matter to
    ``optuna`` only.
    """
    if name == "grid":
        return GridSearch(space)
    if name == "random":
        if samples is None:
            raise StudyError("search strategy 'random' needs 'samples: N'")
        return RandomSearch(space, samples, seed)
    if name == "optuna":
        from tunelab.search._optuna import OptunaSearch

        return OptunaSearch(space, trials=samples or len(space.points()), direction=direction,
                            seed=seed, first=first, sampler=sampler, env_sets=env_sets)
    raise StudyError(f"unknown search strategy {name!r}; valid: {', '.join(STRATEGIES)}")


def make_run_strategy(settings: SearchSettings, space: Space, *, direction: str,
                      repeats: int, baseline: Point | None = None,
                      env_sets: dict[str, dict[str, str]] | None = None,
                      noise_threshold: float = 0.02, budget: Budget | None = None
                      ) -> RunStrategy:
    """Any strategy as a run strategy: a point strategy gets ``repeats`` runs per point."""
    budget = budget or Budget(settings.max_runs, settings.max_wall_s)
    s = settings
    if s.strategy in POINT_STRATEGIES:
        from tunelab.search._repeated import Repeated

        proposer = make_strategy(s.strategy, space, seed=s.seed, samples=s.samples,
                                 direction=direction, first=baseline, sampler=s.sampler,
                                 env_sets=env_sets)
        return Repeated(proposer, repeats, direction=direction, seed=s.seed,
                        baseline=baseline, budget=budget)
    race = s.race(noise_threshold)
    if s.strategy == "auto":
        from tunelab.search._auto import Auto

        return Auto(space, direction=direction, seed=s.seed, settings=race, budget=budget,
                    baseline=baseline, env_sets=env_sets, per_round=s.per_round,
                    sampler=s.sampler)
    if s.strategy == "racing":
        from tunelab.search._racing import Racing

        if s.propose not in POINT_STRATEGIES:
            raise StudyError(f"search 'propose' must be one of {', '.join(POINT_STRATEGIES)}, "
                             f"got {s.propose!r}")
        proposer = make_strategy(s.propose, space, seed=s.seed, samples=s.samples,
                                 direction=direction, sampler=s.sampler, env_sets=env_sets)
        return Racing(proposer, direction=direction, seed=s.seed, settings=race,
                      budget=budget, baseline=baseline, per_round=s.per_round)
    if s.strategy == "one-at-a-time":
        from tunelab.search._one_at_a_time import OneAtATime

        return OneAtATime(space, baseline, direction=direction, env_sets=env_sets,
                          seed=s.seed, settings=race, budget=budget, samples=s.samples,
                          sampler=s.sampler, per_round=s.per_round)
    if s.strategy == "hierarchical":
        from tunelab.search._hierarchical import Hierarchical

        return Hierarchical(space, baseline, direction=direction, groups=s.groups,
                            seed=s.seed, settings=race, budget=budget, env_sets=env_sets,
                            samples=s.samples, sampler=s.sampler, per_round=s.per_round)
    raise StudyError(f"unknown search strategy {s.strategy!r}; valid: {', '.join(STRATEGIES)}")
