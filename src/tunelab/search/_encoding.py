"""A space's valid points as coordinates a model-based sampler can learn from.

Each axis becomes one or more *dimensions*:

* a numeric axis (all values int or float): its position in sorted order, an integer
  ``0 .. k-1`` — ordered, so TPE, a Gaussian process and CMA-ES see that ``np=2`` lies
  between 1 and 4;
* any other axis: a categorical choice among its values;
* the ``env`` axis, when its sets are given: one categorical dimension per environment
  variable, valued by what each set assigns it (or ``-`` when unset), so the sets
  ``{UCX_TLS: tcp}``, ``{UCX_RNDV_SCHEME: am}`` and their union sit at the corners of a
  cube rather than at unrelated labels.

:meth:`SpaceEncoding.nearest` maps any proposal to the closest valid point not yet taken
(normalised distance: |Δposition| / (k-1) per numeric dimension, 0/1 per categorical one;
ties broken by a seeded generator). Proposals therefore always land on a valid, new point:
nothing is rejected, and the space is exhausted only after every valid point was proposed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunelab.errors import SpaceError
from tunelab.limits import LIMITS
from tunelab.space import Point, Space
from tunelab.spec import ENV_AXIS

__all__ = ["MAX_POOL", "Dimension", "SpaceEncoding"]

MAX_POOL = 200_000
"""Largest product of the axes enumerated in full for candidates (a larger space: a seeded
sample of ``LIMITS.samples`` valid points)."""

UNSET = "-"


@dataclass(frozen=True)
class Dimension:
    """One coordinate: ``numeric`` (positions 0..len(choices)-1) or categorical."""

    name: str
    choices: tuple[Any, ...]
    numeric: bool


def _is_numeric(values: tuple[Any, ...]) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


class SpaceEncoding:
    """The valid points of ``space`` and their coordinates (see the module docstring)."""

    def __init__(self, space: Space, env_sets: dict[str, dict[str, str]] | None = None,
                 seed: int = 0) -> None:
        self.space = space
        if space.size <= MAX_POOL:
            self.points = space.points()
        else:
            self.points = space.sample(LIMITS.samples, seed)
        if not self.points:
            raise SpaceError("no valid point to search")
        self.dimensions: list[Dimension] = []
        self._env_vars: list[str] = []
        columns: list[np.ndarray] = []
        for axis in space.axes:
            if axis.name == ENV_AXIS and env_sets:
                self._env_vars = sorted({v for s in env_sets.values() for v in s})
                for var in self._env_vars:
                    settings = sorted({s.get(var, UNSET) for s in env_sets.values()})
                    self.dimensions.append(Dimension(f"env:{var}", tuple(settings), False))
                    index = {c: i for i, c in enumerate(settings)}
                    columns.append(np.array([index[env_sets[str(p[ENV_AXIS])].get(var, UNSET)]
                                             for p in self.points], dtype=float))
                continue
            choices: tuple[Any, ...]
            if _is_numeric(axis.values):
                choices = tuple(sorted(axis.values))
                self.dimensions.append(Dimension(axis.name, choices, True))
            else:
                choices = tuple(axis.values)
                self.dimensions.append(Dimension(axis.name, choices, False))
            lookup: dict[tuple[type, Any], int] = {(type(c), c): i
                                                   for i, c in enumerate(choices)}
            columns.append(np.array([lookup[(type(p[axis.name]), p[axis.name])]
                                     for p in self.points], dtype=float))
        self._env_sets = env_sets or {}
        self.codes = np.column_stack(columns) if columns else np.zeros((len(self.points), 0))
        self._numeric = np.array([d.numeric for d in self.dimensions], dtype=bool)
        spans = np.array([max(len(d.choices) - 1, 1) for d in self.dimensions], dtype=float)
        self._scale = np.where(self._numeric, 1.0 / spans, 1.0)
        self._index = {p: i for i, p in enumerate(self.points)}
        self.taken = np.zeros(len(self.points), dtype=bool)
        self._rng = random.Random(seed)

    def index(self, point: Point) -> int | None:
        """Position of ``point`` among the candidates (None when not among them)."""
        return self._index.get(point)

    def params(self, point: Point) -> dict[str, Any]:
        """The sampler's view of a candidate point: dimension name -> value."""
        i = self._index[point]
        out: dict[str, Any] = {}
        for d, code in zip(self.dimensions, self.codes[i], strict=True):
            out[d.name] = int(code) if d.numeric else d.choices[int(code)]
        return out

    def nearest(self, params: dict[str, Any], *, spill_at_random: bool = False
                ) -> Point | None:
        """The closest candidate not yet taken (None when all are taken); marks it taken.
        ``spill_at_random``: when the proposal itself is taken, a free candidate drawn at
        random instead of the nearest — for a sampler's random phase, where the nearest
        would favour points with many neighbours (an edge or a corner has fewer: in 1000
        seeds, 5 random proposals over 2 x 5 points measured a corner 0.44-0.46 of the
        time, an inner point 0.53-0.55)."""
        free = np.flatnonzero(~self.taken)
        if free.size == 0:
            return None
        target = np.empty(len(self.dimensions))
        for j, d in enumerate(self.dimensions):
            value = params.get(d.name)
            if d.numeric:
                target[j] = float(value) if value is not None else np.nan
            else:
                target[j] = d.choices.index(value) if value in d.choices else -1
        diff = self.codes[free] - target
        diff = np.where(self._numeric, np.abs(diff), diff != 0) * self._scale
        distance = np.nan_to_num(diff, nan=1.0).sum(axis=1)
        if spill_at_random and distance.min() > 0:
            distance = np.zeros_like(distance)
        closest = free[np.flatnonzero(distance == distance.min())]
        chosen = int(closest[0]) if closest.size == 1 else self._rng.choice(closest.tolist())
        self.taken[chosen] = True
        return self.points[chosen]
