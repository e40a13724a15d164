"""``hierarchical``: groups of parameters tuned in order, each group's best frozen.

The seed team tuned Leopard's batch size first, then the learning rate for it. Stage *i*
races (see :mod:`tunelab.search._racing`) every valid point that varies the parameters of
group *i* while every other parameter keeps its current value — the baseline's at first,
then each finished stage's winner. When a pass over all groups moved the winner, another pass
follows (points already measured keep their runs), until a pass changes nothing, ``passes``
passes were made, or the budget is spent. Groups default to one per parameter in study order
(the ``env`` axis last): coordinate descent with racing.

Interactions break coordinate descent, so it checks, after the first pass, that some stage
moved the winner (a change of one group helps), and at the end that the point most likely
best given every run is the final winner (combining the stages' winners works). When
either check fails, or the budget is too small for a first pass, the runs go to a
model-based search over the joint space with a contest of its best points; what is left
after the passes too (see :mod:`tunelab.search._structured`).
"""

from __future__ import annotations

import itertools

from tunelab.errors import StudyError
from tunelab.search._rounds import Budget, Race, RaceSettings
from tunelab.search._structured import StructuredSearch
from tunelab.search.base import RunRequest
from tunelab.space import Point, Space

__all__ = ["MAX_STAGE_POINTS", "Hierarchical"]

MAX_STAGE_POINTS = 10_000
"""Most combinations one group may have (a group is enumerated in full)."""


class Hierarchical(StructuredSearch):
    """Tunes ``groups`` of parameters one after the other."""

    name = "hierarchical"

    def __init__(self, space: Space, start: Point | None, *, direction: str,
                 groups: list[list[str]] | None = None, seed: int = 0,
                 settings: RaceSettings | None = None, budget: Budget | None = None,
                 passes: int = 3, env_sets: dict[str, dict[str, str]] | None = None,
                 samples: int | None = None, sampler: str = "tpe", per_round: int = 2
                 ) -> None:
        super().__init__(space, direction=direction, seed=seed, budget=budget,
                         settings=settings, env_sets=env_sets, samples=samples,
                         sampler=sampler, per_round=per_round)
        self.groups = groups or [[name] for name in space.names]
        known = set(space.names)
        for group in self.groups:
            unknown = [g for g in group if g not in known]
            if unknown or not group:
                raise StudyError(f"search groups: {unknown[0] if unknown else 'an empty group'}"
                                 f" is not a parameter; parameters: {', '.join(space.names)}")
            size = 1
            for axis in space.axes:
                if axis.name in group:
                    size *= len(axis.values)
            if size > MAX_STAGE_POINTS:
                raise StudyError(f"search groups: group {group} has {size} combinations, more "
                                 f"than {MAX_STAGE_POINTS}; split it")
        self.current = start if start is not None else space.points()[0]
        self.passes = passes
        self.stage = -1
        self.race: Race | None = None
        self.winners: list[Point] = []
        self._pass_start = self.current
        self._start = self.current

    def _first(self) -> Point | None:
        return self.current

    def _stage_points(self, group: list[str]) -> list[Point]:
        axes = [a for a in self.space.axes if a.name in group]
        points = [self.current]
        for values in itertools.product(*(a.values for a in axes)):
            p = Point({**self.current, **{a.name: v for a, v in zip(axes, values, strict=True)}})
            if p not in points and self.space.contains(p):
                points.append(p)
        return points

    def _needs(self) -> int:
        stages = sum(len(self._stage_points(group)) for group in self.groups)
        return (stages - len(self.groups) + 1) * self.settings.min_repeats

    def _structured_round(self) -> list[RunRequest]:
        while True:
            if self.race is not None:
                self.race.judge()
                if not self.race.settled:
                    return self.race.requests()
                leader = self.race.leader()
                if leader is not None:
                    self.current = leader
                self.winners.append(self.current)
            self.stage += 1
            if self.stage == len(self.groups) and self.current == self._start:
                return self._end("no group's change alone beats the start")
            if self.stage % len(self.groups) == 0 and self.stage > 0:
                finished = self.stage // len(self.groups)
                if self.current == self._pass_start or finished >= self.passes:
                    chosen = self.evidence.recommended()
                    return self._end(None if chosen in (None, self.current) else
                                     f"the stages' winners combined lose to {chosen.label()}")
                self._pass_start = self.current
            self.race = Race(self.evidence, self.settings)
            self.race.enter(self._stage_points(self.groups[self.stage % len(self.groups)]))
