"""How a run strategy spends what its budget has left: a contest and a joint search.

A :class:`Contest` decides which measured point is best, on the posterior of
:mod:`tunelab.stats.recommend` (the statistics ``tunelab best`` uses). Each contest round runs
the *leader* (the point most likely best, the recommendation) and its most likely rival once
more — the *top two*, as top-two Thompson sampling allocates in best-arm identification: the
choice is decided between those two, and a third or fourth contender's run spends a small
budget where it decides less (three rivals a round against one, side by side on 400 seeds of
``benchmarks/search_landscapes.py``'s ``small9``: 0.86 against 0.92; no landscape of the
benchmark worse with one). Points at ``max_repeats`` get no more runs. Rivals are ranked with
every point judged on its own runs
(:meth:`~tunelab.stats.recommend.Posterior.p_best_unpooled`): the crown is given cautiously
(one lucky run is shrunk towards the common mean), runs optimistically — a point whose one run
matches the leader's mean is a rival, not the common mean's neighbour — and so is certainty:
with only the top two measured further, the shrunk view called a leader 2.6 % behind the best
certain while the best had one run (6 points at CV 8 %: 13 of 20 seeds stopped early, 5
wrongly; judged on their own runs, 6 and 2; three rivals and the shrunk view, 5 and 1). The
leader runs again only while it is no better measured than its rivals: once it has more runs
than each of them, another run of it decides less than one of theirs. The winner is
*certain* when the leader has at least ``min_repeats`` runs (two at least) and its
probability of being within the indifference of the best reaches ``confidence``.

An :class:`Endgame` alternates exploring new points — proposals of a point strategy, each
run once: Optuna TPE over the joint space, or every point of a grid — with contest rounds.
It explores while the runs left exceed its *reserve* (a share of the runs it started with,
kept for the contest) or while the winner is certain, and runs contest rounds otherwise; it
ends when the budget is spent, or when nothing is left to explore and the winner is certain
or cannot be measured further. So it never stops with runs left while the winner is
uncertain and more runs could tell. An adaptive proposer is told each new point's first
value (the model learns from the points that ran; later runs of a point only sharpen the
contest).
"""

from __future__ import annotations

import math

from tunelab.search._evidence import Evidence
from tunelab.search._rounds import Budget, RaceSettings
from tunelab.search.base import RunRequest, Strategy
from tunelab.space import Point, Space

__all__ = ["CONTENDER", "RESERVE", "Contest", "Endgame", "joint_search"]

CONTENDER = 0.025
"""Probability of being the best from which a point gets contest runs."""

RIVALS = 1
"""Most contenders besides the leader in one contest round (the most likely ones)."""

RESERVE = 0.2
"""Share of the runs left that a model-based search keeps for the contest."""


class Contest:
    """Contest rounds among the measured points (see the module docstring)."""

    def __init__(self, evidence: Evidence, settings: RaceSettings) -> None:
        self.evidence = evidence
        self.settings = settings
        self.min_n = max(2, settings.min_repeats)

    def certain(self) -> bool:
        """Whether the leader is within the indifference of the best at ``confidence``,
        every point judged on its own runs (a rival with one run close to the leader keeps
        the contest open, where shrinkage would call it average)."""
        ev = self.evidence
        choice = ev.recommend()
        if choice is None or choice.p_best is None:
            return False
        if ev.n(ev.point(choice.point)) < self.min_n:
            return False
        within = ev.posterior().p_within_of(choice.point, self.settings.margin, shrink=False)
        return within >= self.settings.confidence

    def requests(self, limit: int | None = None) -> list[RunRequest]:
        """The contest's next round (at most ``limit`` runs, the runs a budget has left);
        none when none may run again. With a budget, rivals at ``max_repeats`` give way to
        the next most likely points, however unlikely: runs left are spent where they can
        still change the choice (a good point unlucky in its one run)."""
        ev, most = self.evidence, self.settings.max_repeats
        choice = ev.recommend()
        if choice is None:
            return []
        if choice.p_best is None:  # no noise to speak of yet: one more run of the leader
            order = list(choice.ranking)[:1]
        else:
            p = ev.posterior().p_best_unpooled()
            others = [k for k in sorted(p, key=lambda k: (-p[k], k)) if k != choice.point]
            open_ = [k for k in others if ev.attempts(ev.point(k)) < most]
            rivals = [k for k in open_ if p[k] >= CONTENDER][:RIVALS]
            if not rivals:  # the leader's closest rival; with a budget, the closest open one
                rivals = open_[:1] if limit is not None else others[:1]
            order = [choice.point, *rivals]
            runs = self._runs(rivals)
            if runs and ev.n(ev.point(choice.point)) > max(ev.n(r.point) for r in runs):
                order = rivals  # the leader is the best measured: its rivals' runs decide
        runs = self._runs(order)
        return runs if limit is None else runs[:limit]

    def _runs(self, keys: list[str]) -> list[RunRequest]:
        """The next run of each point of ``keys`` that may run again."""
        ev, most = self.evidence, self.settings.max_repeats
        return [RunRequest(q, ev.attempts(q)) for q in map(ev.point, keys)
                if ev.attempts(q) < most]


class Endgame:
    """Explore with ``proposer`` and contest the winner (see the module docstring).

    ``reserve`` is the share of the runs left at the start kept for the contest;
    ``explore`` bounds the new points proposed (None: every point the proposer has); with
    no proposer there is only the contest.
    """

    def __init__(self, evidence: Evidence, settings: RaceSettings, budget: Budget,
                 proposer: Strategy | None, *, reserve: float = 0.0, per_round: int = 2,
                 explore: int | None = None) -> None:
        self.evidence = evidence
        self.contest = Contest(evidence, settings)
        self.budget = budget
        self.proposer = proposer
        self.per_round = max(1, per_round)
        left = budget.left()
        self.reserve = 0 if left is None else math.ceil(reserve * left)
        self.explore_left = explore
        self._untold: list[Point] = []
        if proposer is not None and proposer.adaptive:  # it learns from the points measured
            for p in evidence.points():
                value = evidence.geometric_mean(p)
                proposer.tell(p, None if math.isnan(value) else value)

    def _tell(self) -> None:
        if self.proposer is not None:
            for p in self._untold:
                value = self.evidence.geometric_mean(p)
                self.proposer.tell(p, None if math.isnan(value) else value)
        self._untold = []

    def _explore(self, left: int | None) -> list[RunRequest]:
        ev = self.evidence
        assert self.proposer is not None
        n = self.per_round if self.proposer.adaptive else 1 << 30
        if left is not None:
            n = min(n, left)
        if self.explore_left is not None:
            n = min(n, self.explore_left)
        out: list[RunRequest] = []
        while len(out) < n and not self.proposer.done:
            batch = self.proposer.ask(n - len(out))
            if not batch:
                break
            for p in batch:
                if ev.attempts(p) == 0:
                    out.append(RunRequest(p, 0))
                elif self.proposer.adaptive:  # measured already: the model learns it now
                    value = ev.geometric_mean(p)
                    self.proposer.tell(p, None if math.isnan(value) else value)
        if self.explore_left is not None:
            self.explore_left -= len(out)
        if self.proposer.adaptive:
            self._untold = [r.point for r in out]
        return out

    def _can_explore(self) -> bool:
        return self.proposer is not None and not self.proposer.done and (
            self.explore_left is None or self.explore_left > 0)

    def next_round(self) -> list[RunRequest]:
        """The next round's runs (none: the endgame is over)."""
        self._tell()
        left = self.budget.left()
        if left == 0:
            return []
        explore = self._can_explore()
        if explore and (left is None or left > self.reserve):
            runs = self._explore(left)
            if runs:
                return runs
        if not self.contest.certain():
            runs = self.contest.requests(left)
            if runs:
                return runs
        if self._can_explore():
            return self._explore(left)
        return []


def joint_search(space: Space, evidence: Evidence, settings: RaceSettings, budget: Budget, *,
                 seed: int, env_sets: dict[str, dict[str, str]] | None = None,
                 sampler: str = "tpe", per_round: int = 2, first: Point | None = None,
                 explore: int | None = None, reserve: float = RESERVE) -> Endgame:
    """An :class:`Endgame` exploring the joint space with Optuna (TPE by default), told
    every point measured so far, keeping ``reserve`` of the runs left for the contest."""
    from tunelab.search._optuna import OptunaSearch

    proposer = OptunaSearch(space, trials=space.size, direction=evidence.direction, seed=seed,
                            first=first, sampler=sampler, env_sets=env_sets)
    return Endgame(evidence, settings, budget, proposer, reserve=reserve, per_round=per_round,
                   explore=explore)
