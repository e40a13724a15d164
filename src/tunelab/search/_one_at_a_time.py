"""``one-at-a-time``: the seed team's method in one study, with statistics.

1. **Alone**: the baseline, and each *option* alone against it — every other value of one
   parameter with the rest at the baseline, and every environment set that adds one option
   to the baseline's (an env set is an option when no other set's variables are a strict
   part of its own). Repeats go where the verdict is open: each round, the baseline and every
   undecided option run once more; an option is decided *better* when its one-sided interval
   against the baseline lies above the noise threshold, *not better* when it lies below it,
   or undecided at ``max_repeats``. An option is looked at after every round, so each look
   uses the confidence divided among the looks it may get (Bonferroni): an option without
   effect is called better in at most ``1 - confidence`` of studies.
2. **Combine**: the options judged better, together — per parameter the value with the best
   mean, and the env set whose variables are the union of the better sets' (when the study
   has it). If the combination is not a valid point, the weakest option is left out until it
   is.
3. **Local check**: a race (see :mod:`tunelab.search._racing`) among the combination, the
   best point so far and the combination's neighbours (one parameter changed, or one env
   option added or removed); when a neighbour wins, its own neighbours are checked next, for
   as long as the budget lasts.
4. **Interactions**: options that only help together, or hurt together, break the method.
   So it checks that some option helps alone (after step 1) and that combining works — the
   point most likely best after step 3 is not the baseline or one option alone while two or
   more options were combined. When either check fails, or the budget is too small for
   step 1, the runs go to a model-based search over the joint space with a contest of its
   best points; what is left after step 3 too (see :mod:`tunelab.search._structured`).
"""

from __future__ import annotations

from collections.abc import Iterable

from tunelab.errors import StudyError
from tunelab.search._rounds import Budget, Race, RaceSettings
from tunelab.search._structured import StructuredSearch
from tunelab.search.base import RunRequest
from tunelab.space import Point, Space
from tunelab.spec import ENV_AXIS

__all__ = ["OneAtATime", "env_options", "neighbours"]


def env_options(env_sets: dict[str, dict[str, str]], base: str) -> dict[str, frozenset[str]]:
    """The env sets that are one option: name -> the variable settings it adds to ``base``'s."""
    base_items = set(env_sets.get(base, {}).items())
    added = {name: frozenset(f"{k}={v}" for k, v in s.items() if (k, v) not in base_items)
             for name, s in env_sets.items() if name != base}
    added = {n: a for n, a in added.items() if a}
    return {n: a for n, a in added.items()
            if not any(o < a for m, o in added.items() if m != n)}


def _env_items(env_sets: dict[str, dict[str, str]], name: str) -> frozenset[str]:
    return frozenset(f"{k}={v}" for k, v in env_sets[name].items())


def neighbours(point: Point, space: Space, env_sets: dict[str, dict[str, str]] | None
               ) -> list[Point]:
    """Valid points one step from ``point``: one parameter changed to another of its
    values, or (for the env axis) one option added to or removed from its set."""
    out: list[Point] = []
    for axis in space.axes:
        if axis.name == ENV_AXIS and env_sets:
            here = _env_items(env_sets, str(point[ENV_AXIS]))
            for name in env_sets:
                other = _env_items(env_sets, name)
                if name != point[ENV_AXIS] and _one_option_apart(here, other, env_sets):
                    out.append(Point({**point, ENV_AXIS: name}))
            continue
        for value in axis.values:
            if value != point[axis.name] or type(value) is not type(point[axis.name]):
                out.append(Point({**point, axis.name: value}))
    return [p for p in out if space.contains(p)]


def _atoms(env_sets: dict[str, dict[str, str]]) -> set[frozenset[str]]:
    """The options among the env sets: non-empty sets no other non-empty set is part of."""
    items = {_env_items(env_sets, n) for n in env_sets} - {frozenset()}
    return {a for a in items if not any(o < a for o in items)}


def _one_option_apart(a: frozenset[str], b: frozenset[str],
                      env_sets: dict[str, dict[str, str]]) -> bool:
    small, large = (a, b) if len(a) < len(b) else (b, a)
    return small < large and (large - small) in _atoms(env_sets)


class OneAtATime(StructuredSearch):
    """Options alone against the baseline, their combination, then a local check."""

    name = "one-at-a-time"

    def __init__(self, space: Space, baseline: Point | None, *, direction: str,
                 env_sets: dict[str, dict[str, str]] | None = None, seed: int = 0,
                 settings: RaceSettings | None = None, budget: Budget | None = None,
                 samples: int | None = None, sampler: str = "tpe", per_round: int = 2) -> None:
        super().__init__(space, direction=direction, seed=seed, budget=budget,
                         settings=settings, env_sets=env_sets, samples=samples,
                         sampler=sampler, per_round=per_round)
        if baseline is None:
            raise StudyError("search strategy 'one-at-a-time' needs a baseline point")
        self.baseline = baseline
        self.options = self._options()
        self.verdicts: dict[Point, str] = {}
        self.combination: Point | None = None
        self.merged: list[Point] = []
        """The better options the combination joins."""
        self.race: Race | None = None
        self._checked: set[Point] = set()

    def _options(self) -> list[Point]:
        out: list[Point] = []
        base = self.baseline
        for axis in self.space.axes:
            if axis.name == ENV_AXIS and self.env_sets:
                for name in env_options(self.env_sets, str(base[ENV_AXIS])):
                    out.append(Point({**base, ENV_AXIS: name}))
                continue
            for value in axis.values:
                if value != base[axis.name] or type(value) is not type(base[axis.name]):
                    out.append(Point({**base, axis.name: value}))
        return [p for p in out if self.space.contains(p)]

    def _first(self) -> Point | None:
        return self.baseline

    # -- phase 1 -------------------------------------------------------------------------

    def _judge_options(self) -> list[Point]:
        """Decide what can be decided; the options still open."""
        ev, s = self.evidence, self.settings
        looks = s.max_repeats - s.min_repeats + 1
        confidence = 1 - (1 - s.confidence) / looks
        open_: list[Point] = []
        for option in self.options:
            if option in self.verdicts:
                continue
            if ev.attempts(option) >= s.min_repeats and ev.n(option) == 0:
                self.verdicts[option] = "failed"
                continue
            iv = None
            if ev.attempts(option) >= s.min_repeats and ev.n(self.baseline) >= 2:
                iv = ev.advantage(self.baseline, option, confidence)
            if iv is not None and iv.low > s.margin:
                self.verdicts[option] = "better"
            elif iv is not None and iv.high < s.margin:
                self.verdicts[option] = "not better"
            elif ev.attempts(option) >= s.max_repeats:
                self.verdicts[option] = "undecided"
            else:
                open_.append(option)
        return open_

    # -- phase 2 -------------------------------------------------------------------------

    def _combine(self, winners: list[Point]) -> Point:
        ev = self.evidence
        winners = sorted(winners, key=lambda p: (ev.mean_loss(p), p.key))
        while winners:
            candidate = self._merge(winners)
            if candidate is not None and self.space.contains(candidate):
                self.merged = winners
                return candidate
            winners = winners[:-1]  # leave out the weakest option
        return self.baseline

    def _merge(self, winners: list[Point]) -> Point | None:
        values = dict(self.baseline)
        env_items: set[str] = set()
        base_env = None
        for option in winners:  # best first: the first winner of an axis sets its value
            for name, value in option.items():
                if value == self.baseline[name] and type(value) is type(self.baseline[name]):
                    continue
                if name == ENV_AXIS and self.env_sets:
                    base_env = self.env_sets[str(self.baseline[ENV_AXIS])]
                    env_items |= _env_items(self.env_sets, str(value))
                elif values[name] == self.baseline[name]:
                    values[name] = value
        if env_items and self.env_sets is not None and base_env is not None:
            wanted = env_items | frozenset(f"{k}={v}" for k, v in base_env.items())
            names = [n for n in self.env_sets if _env_items(self.env_sets, n) == wanted]
            if not names:
                return None
            values[ENV_AXIS] = names[0]
        return Point(values)

    # -- phase 3 -------------------------------------------------------------------------

    def _local(self, around: Point) -> list[Point]:
        fresh = [p for p in [around, *neighbours(around, self.space, self.env_sets)]
                 if p not in self._checked]
        self._checked.update(fresh)
        return fresh

    def _needs(self) -> int:
        return (1 + len(self.options)) * self.settings.min_repeats

    def _structured_round(self) -> list[RunRequest]:
        ev = self.evidence
        if self.combination is None:
            open_ = self._judge_options()
            if open_:
                runs = [RunRequest(p, ev.attempts(p)) for p in [self.baseline, *open_]]
                return runs if ev.attempts(self.baseline) < self.settings.max_repeats \
                    else runs[1:]
            winners = [p for p, v in self.verdicts.items() if v == "better"]
            if not winners:
                return self._end("no option alone is better than the baseline")
            self.combination = self._combine(winners)
            self.race = Race(ev, self.settings)
            best_alone = ev.best([self.baseline, *self.options], self.settings.min_repeats)
            self._checked.update([self.baseline, *self.options])
            self.race.enter(_dedupe([self.combination, *(p for p in [best_alone] if p)]))
            self.race.enter(self._local(self.combination))
        assert self.race is not None
        self.race.judge()
        leader = self.race.leader()
        if leader is not None and ev.n(leader) >= self.settings.min_repeats:
            self.race.enter(self._local(leader))
        if self.race.settled:
            return self._end(self._combining_failed())
        return self.race.requests()

    def _combining_failed(self) -> str | None:
        """Why combining the better options did not work (None: it did)."""
        chosen = self.evidence.recommended()
        if len(self.merged) >= 2 and chosen in (self.baseline, *self.options):
            return (f"the better options combined lose to {chosen.label()}"
                    if chosen is not None else "the better options combined lose")
        return None

    @property
    def better_options(self) -> list[Point]:
        """The options judged better than the baseline alone (phase 1)."""
        return [p for p, v in self.verdicts.items() if v == "better"]


def _dedupe(points: Iterable[Point]) -> list[Point]:
    out: list[Point] = []
    for p in points:
        if p not in out:
            out.append(p)
    return out

