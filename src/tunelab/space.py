"""Parameter spaces: points, derived values, constraints; enumerate, count, sample, contains.

Enumeration binds parameters one at a time (in study-file order, the ``env`` axis last) and
checks every constraint as soon as all the names it reads are bound, so a whole sub-tree of
invalid points is pruned at once and never materialised. The size of each pruned sub-tree is
credited to the constraint that pruned it, which is how ``tunelab space`` can say how many
points each constraint excluded without visiting them. A derived value is computed, and checked
against what the program takes (``refuses``: the workload's
:meth:`~tunelab.workload.Workload.check_parameter`), at the depth where its names are bound: a
combination whose value the program never takes is no point of the space, left out like one a
rule that cannot be evaluated leaves out (:attr:`Space.broken`).

The size of the full product is known without enumerating it (:attr:`Space.size`).
Enumeration takes at most ``LIMITS.enumeration_steps`` steps (one per value bound at any
depth), so a product larger than that enumerates only when its constraints prune early;
otherwise it is refused with its size and the advice to sample — at once when a lower bound
of the steps left (nothing can be pruned between two depths that check no rule) already
exceeds the budget. Sampling a space larger than
the limit spends a bounded number of random draws; what such a space leaves out is estimated
from :data:`ESTIMATE_DRAWS` combinations drawn at random (:meth:`Space.estimate`).
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tunelab.errors import SpaceError
from tunelab.expr import Expression, ExpressionError
from tunelab.limits import LIMITS
from tunelab.spec import ENV_AXIS, ConstraintSpec, Scalar, StudySpec, value_text

__all__ = ["Point", "Space", "SpaceSummary"]


class Point(Mapping[str, Scalar]):
    """An immutable, canonical, hashable assignment of values to parameters."""

    __slots__ = ("_items", "_key")

    def __init__(self, values: Mapping[str, Scalar]) -> None:
        self._items: tuple[tuple[str, Scalar], ...] = tuple(sorted(values.items()))
        self._key = json.dumps(dict(self._items), sort_keys=True)

    @classmethod
    def from_key(cls, key: str) -> Point:
        """The point whose canonical key (:attr:`key`) is ``key``."""
        return cls(json.loads(key))

    @property
    def key(self) -> str:
        """Canonical JSON text: equal points have equal keys."""
        return self._key

    def __getitem__(self, name: str) -> Scalar:
        for k, v in self._items:
            if k == name:
                return v
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Point):
            return self._key == other._key
        return NotImplemented

    def __repr__(self) -> str:
        return f"Point({', '.join(f'{k}={v!r}' for k, v in self._items)})"

    @staticmethod
    def label_of(params: Mapping[str, Any]) -> str:
        """Short human form of ``params``, in their own order: ``np=2 npool=1 env=am`` (a
        string that reads as a number is quoted: ``x='0'``, see
        :func:`~tunelab.spec.value_text`); ``(default)`` for none, a point that runs the
        workload's defaults. The one rule every label of a point follows (progress lines,
        notes, reports, plots)."""
        return " ".join(f"{k}={value_text(v)}" for k, v in params.items()) or "(default)"

    def label(self) -> str:
        """:meth:`label_of` this point (its names sorted)."""
        return self.label_of(self)


ESTIMATE_DRAWS = 1_000
"""Combinations drawn at random to estimate what a space too large to enumerate leaves out."""


@dataclass
class SpaceSummary:
    """What enumeration found: valid points and what each constraint excluded; or, with
    ``drawn``, the same counted among ``drawn`` combinations drawn at random (an estimate)."""

    total: int
    valid: int
    excluded: dict[str, int] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)
    """Per rule that could not be evaluated for some combinations: why (:attr:`Space.broken`)."""
    drawn: int = 0
    """0: the counts are of the whole space; else of this many random draws from it."""

    def share(self, count: int) -> float:
        """``count`` (:attr:`valid` or one of :attr:`excluded`) as a fraction of the space:
        exact when enumerated, estimated from the draws else."""
        return count / (self.drawn or self.total or 1)

    def about(self, count: int) -> str:
        """``count`` of the draws as the share of the space it estimates: ``about 42%``;
        ``under 0.3%`` for none of 1,000 (the rule of three: the share a 95% bound allows)."""
        if count:
            return f"about {_percent(self.share(count))}"
        return f"under {_percent(3 / max(self.drawn, 3))}"

    def estimated(self, count: int) -> str:
        """:meth:`about`, said as an estimate: ``about 42% (an estimate: 421 of 1,000 drawn
        at random)``."""
        return (f"{self.about(count)} (an estimate: {f'{count:,}' if count else 'none'} of "
                f"{self.drawn:,} drawn at random)")


def _percent(fraction: float) -> str:
    """``42%``, ``0.3%``: two significant digits at most, none after the point from 10%."""
    pct = 100 * fraction
    return f"{pct:.0f}%" if pct >= 10 else f"{pct:.1g}%"


@dataclass(frozen=True)
class _Axis:
    name: str
    values: tuple[Scalar, ...]


class Space:
    """The valid points of a study: parameters x env sets, filtered by constraints.

    ``constants`` are extra read-only names for expressions (``cores`` is always there).
    ``refuses(name, value)`` says why the program never takes ``value`` as the derived value
    ``name`` — a clause such as ``a value workload 'merge' never takes: Input should be
    greater than 0`` — or None: a combination where it says why is left out.
    """

    def __init__(
        self,
        axes: list[tuple[str, tuple[Scalar, ...]]],
        derived: Mapping[str, Expression] | None = None,
        constraints: list[ConstraintSpec] | None = None,
        constants: Mapping[str, Any] | None = None,
        refuses: Callable[[str, Any], str | None] | None = None,
    ) -> None:
        self.axes = [_Axis(n, v) for n, v in axes]
        self._members = [{(type(v), v) for v in a.values} for a in self.axes]
        self.derived = dict(derived or {})
        self.constraints = list(constraints or [])
        self.constants = {"cores": _local_cores(), **(constants or {})}
        self.refuses = refuses
        self.broken: dict[str, str] = {}
        """Per rule that could not be evaluated for some combination met while enumerating
        or sampling (a derived value that gives ``None`` or one the program never takes, a
        constraint that divides by zero): why, at the first such combination. Those
        combinations are left out, as a failed rule's."""
        self._summary: tuple[SpaceSummary, list[Point]] | None = None
        self._estimate: SpaceSummary | None = None
        self.sampled_most = 0
        """The most distinct valid points one :meth:`sample` of this space (too large to
        enumerate) found: every strategy draws its points by such a call, so none proposes
        more (a baseline aside)."""
        names = [a.name for a in self.axes]
        self._depth_of_name = {n: i for i, n in enumerate(names)}
        self._derived_depth = {d: self._depth(e.names, ("derived", d))
                               for d, e in self.derived.items()}
        self._checks: list[list[ConstraintSpec]] = [[] for _ in self.axes]
        for c in self.constraints:
            depth = self._depth(c.expr.names, ("constraint", c.label))
            self._checks[max(depth, 0)].append(c)
        self._derived_at: list[list[str]] = [[] for _ in self.axes]
        for d in self.derived:
            self._derived_at[max(self._derived_depth[d], 0)].append(d)

    @classmethod
    def from_spec(cls, spec: StudySpec, workload_rules: list[ConstraintSpec] | None = None,
                  constants: Mapping[str, Any] | None = None,
                  refuses: Callable[[str, Any], str | None] | None = None) -> Space:
        """The space of a study, with the workload's rules that apply to its parameters and
        what it ``refuses`` of a derived value (see :class:`Space`)."""
        axes = [(p.name, p.values) for p in spec.parameters]
        if spec.env_sets is not None:
            axes.append((ENV_AXIS, tuple(spec.env_sets)))
        fixed = {"cores", *(constants or {})}
        for kind, names in (("parameter", [a for a, _ in axes]), ("derived", spec.derived)):
            for name in names:
                if name in fixed:
                    raise SpaceError(
                        f"{'derived value' if kind == 'derived' else kind} {name!r} has the "
                        f"name of a constant of the study ({', '.join(sorted(fixed))}), which "
                        "the constraints and the workload's rules read: name it otherwise",
                        (kind, name))
        known = {a for a, _ in axes} | set(spec.derived) | fixed
        rules = [r for r in workload_rules or [] if r.expr.names <= known]
        return cls(axes, spec.derived, [*rules, *spec.constraints], constants, refuses)

    def _depth(self, names: frozenset[str], subject: tuple[str, str]) -> int:
        what = f"{'derived value' if subject[0] == 'derived' else 'constraint'} {subject[1]!r}"
        depth = -1
        for n in names:
            if n in self._depth_of_name:
                depth = max(depth, self._depth_of_name[n])
            elif n in self.derived and n in getattr(self, "_derived_depth", {}):
                depth = max(depth, self._derived_depth[n])
            elif n not in self.constants:
                valid = [a.name for a in self.axes] + list(getattr(self, "_derived_depth", {}))
                raise SpaceError(
                    f"{what}: unknown name {n!r}; parameters and derived values: "
                    f"{', '.join(valid) or 'none'}; constants: {', '.join(self.constants)}",
                    subject)
        return depth

    @property
    def names(self) -> list[str]:
        """Axis names in binding order."""
        return [a.name for a in self.axes]

    @property
    def size(self) -> int:
        """Size of the full product, valid or not (computed, never enumerated)."""
        return math.prod(len(a.values) for a in self.axes)

    @property
    def enumerable(self) -> bool:
        """Whether the full product is small enough to enumerate whatever the constraints."""
        return self.size <= LIMITS.enumeration_steps // 2

    def _min_steps_from(self) -> list[int]:
        """For each depth d, a lower bound of the steps a walk entering depth d takes: no
        value is pruned before the first depth >= d that checks a rule, so every
        combination of the axes down to it is visited. (One more entry, 0, for the end.)"""
        n = len(self.axes)
        bounds = [0] * (n + 1)
        for d in range(n):
            prefix, total = 1, 0
            for j in range(d, n):
                prefix *= len(self.axes[j].values)
                total += prefix
                if self._checks[j] or self._derived_at[j] or total > LIMITS.enumeration_steps:
                    break
            bounds[d] = total
        return bounds

    def _too_large(self) -> SpaceError:
        shape = " x ".join(f"{len(a.values):,} {a.name}" for a in self.axes)
        return SpaceError(
            f"the space has {self.size:,} combinations ({shape}); enumerating it takes more "
            f"than the {LIMITS.enumeration_steps:,} steps a grid search may take: sample it "
            "with 'search: {strategy: random, samples: N}' (or optuna), or give fewer values "
            "or constraints on the first parameters that exclude more")

    def values(self, point: Mapping[str, Scalar]) -> dict[str, Any]:
        """The point's parameters plus its derived values (what commands and reports see)."""
        scope: dict[str, Any] = {**self.constants, **point}
        for d, e in self.derived.items():
            scope[d] = e.evaluate(scope)
        return {k: scope[k] for k in [*point, *self.derived]}

    def why_not(self, point: Mapping[str, Scalar]) -> str | None:
        """None if ``point`` is valid, else the reason (first failing rule)."""
        missing = [a.name for a in self.axes if a.name not in point]
        extra = [k for k in point if k not in self._depth_of_name]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing {', '.join(missing)}")
            if extra:
                parts.append(f"unknown {', '.join(extra)}")
            return "; ".join(parts)
        for axis, members in zip(self.axes, self._members, strict=True):
            value = point[axis.name]
            if (type(value), value) not in members:
                shown = list(axis.values[:20])
                more = f" and {len(axis.values) - 20:,} more" if len(axis.values) > 20 else ""
                return f"{axis.name}={value!r} is not one of {shown}{more}"
        return self._first_failure(point)

    def _first_failure(self, point: Mapping[str, Scalar]) -> str | None:
        """The reason the first failing rule gives for a point of the product, or None."""
        failed = self._first_failed(point)
        return None if failed is None else failed[1]

    def _first_failed(self, point: Mapping[str, Scalar]) -> tuple[str, str, bool] | None:
        """The first failing rule of a point of the product (as :meth:`_check_level`)."""
        scope: dict[str, Any] = {**self.constants, **point}
        for depth in range(len(self.axes)):
            failed = self._check_level(depth, scope)
            if failed is not None:
                return failed
        return None

    def contains(self, point: Mapping[str, Scalar]) -> bool:
        """Whether ``point`` is a valid point of this space."""
        return self.why_not(point) is None

    def _check_level(self, depth: int,
                     scope: dict[str, Any]) -> tuple[str, str, bool] | None:
        """None, or (the failing rule's label, the reason, whether the rule could not be
        evaluated at all — or gave a derived value the program never takes) for the names
        bound at ``depth``."""
        for d in self._derived_at[depth]:
            try:
                scope[d] = value = self.derived[d].evaluate(scope)
            except ExpressionError as exc:
                return d, f"derived value {d!r} cannot be computed: {exc}", True
            refused = self.refuses(d, value) if self.refuses is not None else None
            if refused is not None:
                return d, f"derived value {d!r} is {value_text(value)}, {refused}", True
        for c in self._checks[depth]:
            try:
                ok = bool(c.expr.evaluate(scope))
            except ExpressionError as exc:
                return c.label, f"constraint {c.label!r} cannot be evaluated: {exc}", True
            if not ok:
                return c.label, f"violates {c.label!r}" + (f" ({c.why})" if c.why else ""), \
                    False
        return None

    def _walk(self, summary: SpaceSummary | None) -> Iterator[Point]:
        n = len(self.axes)
        if n == 0:
            return
        rest = [math.prod(len(a.values) for a in self.axes[d + 1:]) for d in range(n)]
        scope: dict[str, Any] = dict(self.constants)
        chosen: dict[str, Scalar] = {}
        steps = 0
        min_steps = self._min_steps_from()
        if min_steps[0] > LIMITS.enumeration_steps:
            raise self._too_large()

        def rec(depth: int) -> Iterator[Point]:
            nonlocal steps
            axis = self.axes[depth]
            for v in axis.values:
                steps += 1
                if steps > LIMITS.enumeration_steps:
                    raise self._too_large()
                scope[axis.name] = v
                chosen[axis.name] = v
                failed = self._check_level(depth, scope)
                if failed is not None:
                    key, why, broken = failed
                    if summary is not None:
                        summary.excluded[key] = summary.excluded.get(key, 0) + rest[depth]
                    if broken:
                        self._note_broken(key, why, {a.name: chosen[a.name]
                                                     for a in self.axes[:depth + 1]})
                    continue
                if depth + 1 == n:
                    if summary is not None:
                        summary.valid += 1
                    yield Point(chosen)
                else:
                    if steps + min_steps[depth + 1] > LIMITS.enumeration_steps:
                        raise self._too_large()
                    yield from rec(depth + 1)

        yield from rec(0)

    def __iter__(self) -> Iterator[Point]:
        """Every valid point, in a deterministic order (SpaceError when the space is too
        large to enumerate)."""
        return self._walk(None)

    def summarize(self) -> tuple[SpaceSummary, list[Point]]:
        """Count valid points and what each constraint excluded; also return the points
        (enumerated once: later calls answer from the first).

        Raises :class:`SpaceError` when the space is too large to enumerate."""
        if self._summary is None:
            summary = SpaceSummary(total=self.size, valid=0)
            points = list(self._walk(summary))
            summary.broken = {k: v for k, v in self.broken.items() if k in summary.excluded}
            self._summary = summary, points
        summary, points = self._summary
        return replace(summary, excluded=dict(summary.excluded),
                       broken=dict(summary.broken)), list(points)

    def estimate(self, draws: int = ESTIMATE_DRAWS, seed: int = 0) -> SpaceSummary:
        """What a space too large to enumerate holds, estimated from ``draws`` combinations
        drawn at random (uniformly, with replacement): how many of them were valid and how
        many each rule left out (:attr:`SpaceSummary.drawn`); the rules that could not be
        evaluated are recorded (:attr:`broken`). Drawn once: later calls answer from the
        first."""
        if self._estimate is None:
            rng = random.Random(seed)
            summary = SpaceSummary(total=self.size, valid=0, drawn=draws)
            for _ in range(draws):
                values = {a.name: rng.choice(a.values) for a in self.axes}
                failed = self._first_failed(values)
                if failed is None:
                    summary.valid += 1
                    continue
                summary.excluded[failed[0]] = summary.excluded.get(failed[0], 0) + 1
                if failed[2]:
                    self._note_broken(failed[0], failed[1], values)
            summary.broken = {k: v for k, v in self.broken.items() if k in summary.excluded}
            self._estimate = summary
        return replace(self._estimate, excluded=dict(self._estimate.excluded),
                       broken=dict(self._estimate.broken))

    def _note_broken(self, rule: str, why: str, at: Mapping[str, Scalar]) -> None:
        """Record why ``rule`` could not be evaluated, at the first combination met."""
        if rule not in self.broken:
            where = ", ".join(f"{k}={v!r}" for k, v in at.items())
            self.broken[rule] = f"{why} (first at {where})"

    @property
    def valid_count(self) -> int | None:
        """How many valid points the space has, once it was enumerated (:meth:`summarize`);
        None before, and for a space too large to enumerate."""
        return self._summary[0].valid if self._summary is not None else None

    @property
    def left_out(self) -> dict[str, int]:
        """Per rule, how many combinations it left out, once the space was enumerated
        (:meth:`summarize`; empty before, and for a space too large to enumerate)."""
        return dict(self._summary[0].excluded) if self._summary is not None else {}

    def points(self) -> list[Point]:
        """Every valid point; raise :class:`SpaceError` when there is none."""
        summary, points = self.summarize()
        if not points:
            detail = ", ".join(f"{k!r} excluded {v}" for k, v in summary.excluded.items())
            combination = {a.name: a.values[0] for a in self.axes}
            first = self._first_failed(combination)
            at = ", ".join(f"{k}={v!r}" for k, v in combination.items())
            most = max(summary.excluded, key=summary.excluded.__getitem__, default=None)
            raise SpaceError(
                f"no valid point: all {summary.total} combinations are excluded"
                + (f" ({detail})" if detail else "")
                + (f"; the first combination ({at}): {first[1]}" if first and first[2]
                   else ""),
                None if most is None else self.subject_of(most))
        return points

    def subject_of(self, label: str) -> tuple[str, str]:
        """``("derived", name)`` or ``("constraint", label)``: what excluded points under
        ``label`` (the keys of :attr:`SpaceSummary.excluded`)."""
        return ("derived", label) if label in self.derived else ("constraint", label)

    def sample(self, n: int, seed: int = 0) -> list[Point]:
        """``n`` distinct valid points drawn at random (fewer if the space is smaller).

        A space small enough to enumerate is enumerated and sampled exactly; a larger one
        is drawn from at random, at most ``LIMITS.sample_draws`` times."""
        if n > LIMITS.samples:
            raise SpaceError(f"cannot sample {n:,} points: at most {LIMITS.samples:,}")
        rng = random.Random(seed)
        if self.enumerable:
            points = self.points()
            return rng.sample(points, min(n, len(points)))
        found: dict[Point, None] = {}
        for _ in range(min(max(1000, 200 * n), LIMITS.sample_draws)):
            values = {a.name: rng.choice(a.values) for a in self.axes}
            failed = self._first_failed(values)
            if failed is None:
                found[Point(values)] = None
                if len(found) == n:
                    break
            elif failed[2]:
                self._note_broken(failed[0], failed[1], values)
        if not found:
            raise SpaceError("no valid point found by random sampling; check the constraints")
        self.sampled_most = max(self.sampled_most, len(found))
        return list(found)


def _local_cores() -> int:
    """The cores this process may run on (its affinity), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
