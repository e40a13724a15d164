"""The fraction of bound per point: a study's runs judged against a machine's profile.

:func:`study_headroom` is the pure step: for every ok run it asks the workload what the run
did (:meth:`Workload.work <tunelab.workload.Workload.work>`), finds the bound each item is
judged against (:func:`~tunelab.bounds.match.find_bound`) and averages the fractions over a
point's runs. Link work is also put beside the one-way (ping-pong) bound of the same size and
stack, so the both-ways limit and the one-way figure people quote are seen together.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tunelab.bounds.match import Match, bound_label, find_bound, value_text
from tunelab.bounds.profile import Bound, Profile

if TYPE_CHECKING:
    import pandas as pd

    from tunelab.workload import Work, Workload

__all__ = ["Headroom", "HeadroomItem", "PointHeadroom", "run_work", "study_headroom"]


@dataclass(frozen=True)
class HeadroomItem:
    """One kind of work of one point: the mean achieved rate, the bound, the mean fraction
    (and its range over the runs), the runs it rests on, the approximations of the match;
    ``oneway`` is the fraction of the one-way bound (link work only, NaN without one);
    ``amount`` the mean work of a run (NaN when the workload does not say)."""

    kind: str
    what: str
    rate: float
    amount: float
    bound: Bound | None
    fraction: float
    low: float
    high: float
    n: int
    approx: tuple[str, ...] = ()
    oneway: float = math.nan
    oneway_bound: Bound | None = None
    variant: Mapping[str, Any] | None = None

    @property
    def label(self) -> str:
        """The bound in words, or what was not measured."""
        if self.bound is not None:
            return bound_label(self.bound)
        v = dict(self.variant or {})
        shown = ", ".join(f"{k} {value_text(k, v[k])}" for k in sorted(v))
        return f"{self.kind} ({shown})" if shown else self.kind


@dataclass(frozen=True)
class PointHeadroom:
    """The work items of one point (key ``point``, its ``params``)."""

    point: str
    params: Mapping[str, Any]
    items: tuple[HeadroomItem, ...]

    @property
    def binding(self) -> HeadroomItem | None:
        """The item nearest its bound (the one that limits the point), if any has a bound."""
        judged = [i for i in self.items if i.bound is not None and math.isfinite(i.fraction)]
        return max(judged, key=lambda i: i.fraction) if judged else None


@dataclass(frozen=True)
class Headroom:
    """A study's points against a machine's profile (None when no profile is stored)."""

    profile: Profile | None
    points: Mapping[str, PointHeadroom]

    @property
    def kinds(self) -> list[str]:
        """The kinds of work the study's runs declared, in first-seen order."""
        seen: dict[str, None] = {}
        for p in self.points.values():
            for i in p.items:
                seen.setdefault(i.kind, None)
        return list(seen)


def run_work(workload: type[Workload], options: Mapping[str, Any], row: Mapping[str, Any],
             params: Mapping[str, Any]) -> list[Work]:
    """What one run (a row of the runs table) did, by the workload's own account."""
    foms = {}
    for key, value in row.items():
        if isinstance(key, str) and key.startswith("fom."):
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue
            if math.isfinite(number):
                foms[key[4:]] = number
    try:
        return list(workload.work(options, params, foms))
    except (ArithmeticError, KeyError, TypeError, ValueError):
        return []  # a workload's account that cannot be read says nothing of this run


def _mean(xs: list[float]) -> float:
    good = [x for x in xs if math.isfinite(x)]
    return sum(good) / len(good) if good else math.nan


def study_headroom(runs: pd.DataFrame, workload: type[Workload], options: Mapping[str, Any],
                   profile: Profile | None) -> Headroom | None:
    """Every point's work against ``profile``; None when no run declares any work."""
    if not len(runs) or "status" not in runs.columns:
        return None
    ok = runs[runs["status"] == "ok"]
    collected: dict[str, dict[tuple[str, str], list[tuple[Work, Match | None,
                                                          Match | None]]]] = {}
    params_of: dict[str, dict[str, Any]] = {}
    for row in ok.to_dict("records"):
        key = str(row.get("point"))
        try:
            params = json.loads(key)
        except ValueError:
            continue
        params_of[key] = params
        for w in run_work(workload, options, row, params):
            match = find_bound(profile, w) if profile is not None else None
            oneway = None
            if profile is not None and w.kind == "link":
                oneway = find_bound(profile, replace(
                    w, variant={**w.variant, "pattern": "oneway"}))
            collected.setdefault(key, {}).setdefault((w.kind, w.what), []).append(
                (w, match, oneway))
    if not collected:
        return None
    points = {}
    for key, groups in collected.items():
        items = []
        for (kind, what), entries in groups.items():
            fractions = [m.fraction for _, m, _ in entries if m is not None]
            match = next((m for _, m, _ in reversed(entries) if m is not None), None)
            oneway = next((o for _, _, o in reversed(entries) if o is not None), None)
            amounts = [w.amount for w, _, _ in entries if w.amount is not None]
            items.append(HeadroomItem(
                kind=kind, what=what, rate=_mean([w.rate for w, _, _ in entries]),
                amount=_mean([float(a) for a in amounts]),
                bound=match.bound if match else None, fraction=_mean(fractions),
                low=min(fractions, default=math.nan), high=max(fractions, default=math.nan),
                n=len(entries), approx=match.approx if match else (),
                oneway=_mean([o.fraction for _, _, o in entries if o is not None]),
                oneway_bound=oneway.bound if oneway else None, variant=entries[-1][0].variant))
        points[key] = PointHeadroom(key, params_of[key], tuple(items))
    return Headroom(profile, points)
