"""What ``one-at-a-time`` and ``hierarchical`` share: a hand-over to the joint space.

Both exploit structure — options that help alone and add up, parameters that can be tuned one
group at a time — and both fail when the structure is not there: two options that only help
together, a start in a local optimum, a budget too small for the method to finish. A
:class:`StructuredSearch` hands its runs to an :class:`~tunelab.search._endgame.Endgame`:

* **at the start**, when ``max_runs`` covers every valid point
  (:func:`~tunelab.search._auto.covers`: measuring them all assumes no structure, so it
  cannot miss a point that needs several changes at once) or is under :data:`NEEDS` times
  the runs its first phase needs at the least (:meth:`StructuredSearch._needs`): the whole
  budget goes to ``auto``'s plan for it (:func:`~tunelab.search._auto.plan`: every point and
  a contest, or TPE over the joint space and a contest);
* **when a check fails** (:attr:`fallback` says which): the rest of the budget goes there
  too, the model told every run so far (without ``max_runs``: as many new points as were
  measured, or ``samples``);
* **when the method ends** with its checks passed: with ``max_runs``, the rest goes to the
  same joint search (the method's winner may be a local optimum; runs left are better spent
  looking beyond it, with a fifth kept for the contest); without, to the contest alone,
  while the winner is uncertain.
"""

from __future__ import annotations

from abc import abstractmethod

from tunelab.search._auto import covers, plan
from tunelab.search._endgame import Endgame, joint_search
from tunelab.search._rounds import Budget, RaceSettings, RoundStrategy
from tunelab.search.base import RunRequest
from tunelab.space import Point, Space

__all__ = ["NEEDS", "StructuredSearch"]

NEEDS = 6
"""A budget under this many times the fewest runs of the first phase goes to ``auto``'s plan
from the start: the first phase takes two to five times its fewest when effects are near the
noise, what follows it (the combination and its neighbours, later stages) as much again, and
a failed check needs runs left for the joint search."""


class StructuredSearch(RoundStrategy):
    """A round strategy with a structured first part and an endgame (module docstring)."""

    def __init__(self, space: Space, *, direction: str, seed: int, budget: Budget | None,
                 settings: RaceSettings | None, env_sets: dict[str, dict[str, str]] | None,
                 samples: int | None, sampler: str, per_round: int) -> None:
        super().__init__(direction, seed, budget or Budget())
        self.space = space
        self.settings = settings or RaceSettings()
        self.env_sets = env_sets
        self.seed = seed
        self._joint = (samples, sampler, per_round)
        self.endgame: Endgame | None = None
        self.fallback: str | None = None
        """Why the runs went to a search over the joint space (None: they did not)."""

    @abstractmethod
    def _first(self) -> Point | None:
        """The point the endgame's plan measures first when it starts with nothing measured
        (the baseline, or the start point), or None."""

    @abstractmethod
    def _needs(self) -> int:
        """The fewest runs the method's first phase needs."""

    @abstractmethod
    def _structured_round(self) -> list[RunRequest]:
        """The method's own next round (handing over with :meth:`_end` when it is over)."""

    def _next_round(self) -> list[RunRequest]:
        if self.endgame is None and not self.evidence.points():
            runs = self.budget.max_runs
            if covers(self.space, self.budget):
                return self._end(f"a budget of {runs} runs covers every point", start=True)
            if runs is not None and runs < NEEDS * self._needs():
                return self._end(f"a budget of {runs} runs is under {NEEDS} times the "
                                 f"{self._needs()} its first phase needs", start=True)
        if self.endgame is not None:
            return self.endgame.next_round()
        return self._structured_round()

    def _end(self, fallback: str | None, start: bool = False) -> list[RunRequest]:
        """Hand the rest of the budget over (``fallback``: why the method failed)."""
        self.fallback = fallback
        if fallback is None and self.budget.max_runs is None:
            self.endgame = Endgame(self.evidence, self.settings, self.budget, None)
        else:
            samples, sampler, per_round = self._joint
            explore = None
            if self.budget.max_runs is None:
                explore = samples or max(len(self.evidence.points()), 10)
            if start:  # nothing measured yet: auto's plan for the budget
                _, self.endgame = plan(self.space, self.evidence, self.settings, self.budget,
                                       seed=self.seed, env_sets=self.env_sets,
                                       sampler=sampler, per_round=per_round,
                                       first=self._first())
            else:
                self.endgame = joint_search(self.space, self.evidence, self.settings,
                                            self.budget, seed=self.seed,
                                            env_sets=self.env_sets, sampler=sampler,
                                            per_round=per_round, explore=explore)
        return self.endgame.next_round()

    def result(self) -> Point | None:
        return self.evidence.recommended()
