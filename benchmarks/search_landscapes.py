"""Generated landscapes for ``search_efficiency.py``: known truth, lognormal run-to-run noise.

Each is every valid point with :data:`RECORDED` runs drawn once, with a fixed seed, as
``truth(point) x exp(N(0, s))`` — a recorded landscape in memory, replayed like the shipped
ones (a run answers with one of the point's recorded runs). Their true value is the mean of
those recorded runs (what replay draws from). None is reshaped after drawing.

* ``synthetic`` (324 points, 20 runs each, CV 5 %): a smooth, nearly separable 4-parameter valley.
* ``interaction`` (108 points, CV 6 %): two parameters that only help together — every
  single change from the study's baseline is worse, the best point changes both.
* ``needle`` (64 points, CV 7 %): six on/off switches with mild effects of their own and one
  combination, drawn at random, 15 % faster than any other point.
* ``inert`` (256 points, CV 5 %): six parameters of which two matter; the other four do
  nothing.
* ``small`` (12 points, CV 7 %): one point within 5 % of the best, the runner-up 6 % behind,
  in no order a model could follow.
* ``small8``, ``small9``, ``small10`` (8, 9 and 10 points): the same kind drawn apart, so a
  rule is not fitted to one example — CV 7 % with the runner-up 6 % behind; CV 8 %, 6 %
  behind; CV 6 % with two runners-up 6 % and 7 % behind.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import numpy as np

from tunelab.expr import Expression
from tunelab.replay import Landscape
from tunelab.space import Point, Space
from tunelab.spec import ConstraintSpec

__all__ = ["GENERATED", "KINDS", "RECORDED", "generated", "interaction_kind", "is_kind",
           "needle_kind", "small_kind"]

RECORDED = 40
"""Runs recorded per point."""


def _record(name: str, space: Space, truth: Callable[[Point], float], cv: float,
            baseline: Point, seed: int, *, recorded: int = RECORDED,
            sigma: float | None = None) -> Landscape:
    """Every valid point with ``recorded`` lognormal runs of coefficient of variation ``cv``
    (or log standard deviation ``sigma``) around ``truth``."""
    if sigma is None:
        sigma = math.sqrt(math.log1p(cv * cv))
    rng = np.random.default_rng(seed)
    runs = {p: tuple(float(v) for v in truth(p) * np.exp(rng.normal(0, sigma, recorded)))
            for p in space.points()}
    return Landscape(name, "time_s", "minimize", runs, space, baseline=baseline, repeats=5)


def synthetic() -> Landscape:
    """A 4-parameter valley: ranks x threads x pools x block (324 valid points), CV 5 %.

    Time = (compute + communication) x cache factor: compute shrinks with cores (threads a
    little less efficient than ranks), all-to-all communication grows with ranks per pool,
    pools cost a little each, and the block size has a cache optimum that moves with threads.
    """
    axes: list[tuple[str, tuple[Any, ...]]] = [
        ("ranks", (1, 2, 4, 8, 16, 32, 64)), ("threads", (1, 2, 4, 8)),
        ("pools", (1, 2, 4, 8)), ("block", (16, 32, 64, 128, 256, 512))]
    rules = ["ranks * threads <= 64", "ranks % pools == 0", "ranks * threads >= 8"]
    space = Space(axes, None, [ConstraintSpec(Expression.parse(r)) for r in rules])

    def truth(p: Point) -> float:
        r, t, k, b = (int(p[n]) for n in ("ranks", "threads", "pools", "block"))
        compute = 400 / (r * t) * (1 + 0.06 * (t - 1))
        comm = 0.6 * math.log2(r / k + 1) * math.sqrt(r / k) + 0.3 * k
        cache = 1 + 0.12 * (math.log2(b) - math.log2(64 if t < 4 else 128)) ** 2
        return (compute + comm) * cache

    baseline = Point({"ranks": 8, "threads": 1, "pools": 1, "block": 64})
    # as first generated (20 runs, log standard deviation 0.05), so earlier tables stand
    return _record("synthetic", space, truth, 0.05, baseline, 2026, recorded=20, sigma=0.05)


def interaction() -> Landscape:
    """UCX transport x rendezvous protocol x threads x block (108 points), CV 6 %.

    The study's baseline (tcp, am, 2 threads, 256 KiB) is a local optimum: every other
    transport alone, every other protocol alone, every other thread count and block size is
    worse. RDMA (``rc``) with zero-copy get is 38 % faster than the baseline — together only.
    """
    space = Space([("tls", ("tcp", "sm", "rc", "ud")), ("rndv", ("am", "get", "put")),
                   ("threads", (1, 2, 4)), ("block", (64, 256, 1024))])
    joint = {("tcp", "am"): 1.00, ("tcp", "get"): 1.08, ("tcp", "put"): 1.14,
             ("sm", "am"): 1.10, ("sm", "get"): 1.04, ("sm", "put"): 1.12,
             ("rc", "am"): 1.18, ("rc", "get"): 0.62, ("rc", "put"): 0.84,
             ("ud", "am"): 1.25, ("ud", "get"): 0.97, ("ud", "put"): 1.05}
    threads = {1: 1.22, 2: 1.0, 4: 1.09}
    block = {64: 1.12, 256: 1.0, 1024: 1.07}

    def truth(p: Point) -> float:
        return (10.0 * joint[(str(p["tls"]), str(p["rndv"]))] * threads[int(p["threads"])]
                * block[int(p["block"])])

    baseline = Point({"tls": "tcp", "rndv": "am", "threads": 2, "block": 256})
    return _record("interaction", space, truth, 0.06, baseline, 29)


def needle() -> Landscape:
    """Six on/off switches (64 points), CV 7 %: mild effects of their own (-4 % .. +5 %), and
    one combination, drawn at random, 15 % faster than the best of the other 63 points."""
    effects = {"eager": 0.96, "pin": 0.97, "hugepages": 1.03, "prefetch": 0.98,
               "async_progress": 1.05, "shm": 0.99}
    space = Space([(name, (0, 1)) for name in effects])

    def switches(p: Point) -> float:
        return 10.0 * math.prod(effects[n] for n in effects if p[n])

    points = space.points()
    lone = random.Random(64).choice(points)
    fastest = min(switches(p) for p in points if p != lone)

    def truth(p: Point) -> float:
        return 0.85 * fastest if p == lone else switches(p)

    baseline = Point(dict.fromkeys(effects, 0))
    return _record("needle", space, truth, 0.07, baseline, 64)


def _small(name: str, space: Space, behind: tuple[float, ...], cv: float,
           seed: int) -> Landscape:
    """A small space whose points, in an order drawn at random (no structure to exploit),
    are the best, the runners-up ``behind`` it (fractions), then the others 4 % apart
    further on; the baseline is the last point of that order (the worst)."""
    order = space.points()
    random.Random(seed).shuffle(order)
    steps = (0.0, *behind)
    value = {p: 10.0 * (1 + (steps[i] if i < len(steps) else steps[-1] + 0.04 * (i - len(behind))))
             for i, p in enumerate(order)}
    return _record(name, space, lambda p: value[p], cv, order[-1], seed)


def small() -> Landscape:
    """MPI ranks x threads (12 points), CV 7 %: the small space of the clarified target —
    one point within 5 % of the best, the runner-up 6 % behind it, the others 4 % apart
    further on."""
    return _small("small", Space([("ranks", (1, 2, 3, 4)), ("threads", (1, 2, 4))]), (0.06,),
                  0.07, 12)


def small8() -> Landscape:
    """2 x 4 points, CV 7 %, the runner-up 6 % behind."""
    return _small("small8", Space([("a", (1, 2)), ("b", (1, 2, 3, 4))]), (0.06,), 0.07, 95)


def small9() -> Landscape:
    """3 x 3 points (as many as the QE space), CV 8 %, the runner-up 6 % behind."""
    return _small("small9", Space([("a", (1, 2, 3)), ("b", (1, 2, 4))]), (0.06,), 0.08, 91)


def small10() -> Landscape:
    """5 x 2 points, CV 6 %, two runners-up 6 % and 7 % behind."""
    return _small("small10", Space([("x", (1, 2, 3, 4, 5)), ("y", (0, 1))]), (0.06, 0.07),
                  0.06, 93)


def inert() -> Landscape:
    """MPI ranks x block size, which matter, and four switches that do not (256 points),
    CV 5 %: 16 points (the best ranks and block, whatever the switches) tie for the best."""
    space = Space([("ranks", (2, 4, 8, 16)), ("block", (32, 64, 128, 256)),
                   ("compiler", ("gcc", "clang")), ("malloc", ("glibc", "jemalloc")),
                   ("io", ("posix", "mpiio")), ("log", (0, 1))])

    def truth(p: Point) -> float:
        r, b = int(p["ranks"]), int(p["block"])
        return (20.0 / r ** 0.8 + 0.5 * r) * (1 + 0.1 * math.log2(b / 128) ** 2)

    baseline = Point({"ranks": 2, "block": 64, "compiler": "gcc", "malloc": "glibc",
                      "io": "posix", "log": 0})
    return _record("inert", space, truth, 0.05, baseline, 7)


SHAPES = ((2, 3), (2, 4), (3, 3), (2, 5), (3, 4), (2, 6), (4, 3))
"""The grids of :func:`small_kind` (6-12 points)."""


def small_kind(k: int) -> Landscape:
    """Member ``k`` of the small-space kind, drawn at random (seeded by ``k``): a 6-12-point
    grid of :data:`SHAPES`, CV 5-8 %, one or two runners-up 5.5-8 % behind the best (so one
    point is within 5 %), or, one time in four, a second point 2-4 % behind it (two within
    5 %); the others 4 % apart further on; the baseline the worst point."""
    rng = random.Random(7000 + k)
    rows, cols = rng.choice(SHAPES)
    space = Space([("a", tuple(range(1, rows + 1))), ("b", tuple(range(1, cols + 1)))])
    behind = sorted(round(rng.uniform(0.055, 0.08), 3) for _ in range(rng.choice((1, 2))))
    if rng.random() < 0.25:
        behind = [round(rng.uniform(0.02, 0.04), 3), *behind]
    cv = round(rng.uniform(0.05, 0.08), 3)
    return _small(f"kind{k}", space, tuple(behind), cv, 7000 + k)


def _axis(rng: random.Random, name: str) -> tuple[str, tuple[Any, ...]]:
    """An axis of a drawn landscape: ordered numbers (3-8 values, powers of two or a range),
    or 3-4 labels (categorical) one time in four."""
    if rng.random() < 0.25:
        return name, tuple(f"{name}{i}" for i in range(rng.choice((3, 4))))
    size = rng.choice((3, 4, 4, 5, 6, 8))
    if rng.random() < 0.5:
        return name, tuple(2 ** i for i in range(size))
    return name, tuple(range(1, size + 1))


def _drawn_axes(rng: random.Random, low: int, high: int) -> list[tuple[str, tuple[Any, ...]]]:
    """3-5 axes (:func:`_axis`) whose product has between ``low`` and ``high`` points."""
    while True:
        axes = [_axis(rng, name) for name in "abcde"[:rng.choice((3, 3, 4, 4, 5))]]
        if low <= math.prod(len(v) for _, v in axes) <= high:
            return axes


def _bowl(rng: random.Random, axes: list[tuple[str, tuple[Any, ...]]],
          steep: tuple[float, float]) -> tuple[dict[str, Any], Callable[[Point], float]]:
    """A smooth bowl over ``axes``: each axis has a preferred value drawn at random and costs
    a factor drawn per axis from ``steep`` per step away from it (an ordered axis: steps in
    order; a categorical one: one to three such steps, drawn per label); the preferred values
    and the bowl's factor (1 at its minimum)."""
    prefer: dict[str, Any] = {}
    cost: dict[str, dict[Any, float]] = {}
    for name, values in axes:
        centre = rng.randrange(len(values))
        prefer[name] = values[centre]
        step = rng.uniform(*steep)
        if isinstance(values[0], str):
            cost[name] = {v: 1.0 if i == centre else (1 + step) ** rng.uniform(1, 3)
                          for i, v in enumerate(values)}
        else:
            cost[name] = {v: (1 + step) ** abs(i - centre) for i, v in enumerate(values)}
    return prefer, lambda p: math.prod(cost[n][p[n]] for n, _ in axes)


def interaction_kind(k: int) -> Landscape:
    """Member ``k`` of the interaction kind, drawn at random (seeded by ``k``): 3-5 axes of
    48-200 points (ordered or categorical), a smooth bowl (2-6 % per step away from a value
    drawn per axis) whose minimum is a local optimum, and 2 or 3 axes that help only
    together: values drawn at random away from the bowl's are 20-35 % faster than the bowl's
    minimum when all of them are set (the other axes cost as usual), while every single
    change, and every pair of the three, is worse; CV 5-8 %; the baseline the bowl's
    minimum."""
    rng = random.Random(8000 + k)
    axes = _drawn_axes(rng, 48, 200)
    prefer, bowl = _bowl(rng, axes, (0.02, 0.06))
    joined = rng.sample(axes, rng.choice((2, 2, 3)))
    good = {n: rng.choice([v for v in values if v != prefer[n]]) for n, values in joined}
    gain = rng.uniform(0.20, 0.35)

    def truth(p: Point) -> float:
        if all(p[n] == v for n, v in good.items()):
            return 10.0 * (1 - gain) * bowl(Point({**dict(p), **{n: prefer[n] for n in good}}))
        return 10.0 * bowl(p)

    return _record(f"ikind{k}", Space(axes), truth, rng.uniform(0.05, 0.08), Point(prefer),
                   8000 + k)


def needle_kind(k: int) -> Landscape:
    """Member ``k`` of the needle kind, drawn at random (seeded by ``k``): 3-5 axes of 48-160
    points, a shallow bowl (1-3 % per step), and one point drawn at random 12-20 % faster
    than the best other point; one time in three its one-step neighbours sit 6-8 % behind it
    (a plateau just outside the 5 %); CV 5-8 %; the baseline the bowl's minimum."""
    rng = random.Random(9000 + k)
    axes = _drawn_axes(rng, 48, 160)
    prefer, bowl = _bowl(rng, axes, (0.01, 0.03))
    space = Space(axes)
    points = space.points()
    lone = rng.choice(points)
    needle = 10.0 * min(bowl(p) for p in points if p != lone) * (1 - rng.uniform(0.12, 0.20))
    plateau = rng.uniform(0.06, 0.08) if rng.random() < 1 / 3 else None
    order = {n: {v: i for i, v in enumerate(values)} for n, values in axes}

    def steps(p: Point) -> int:
        return sum(int(p[n] != lone[n]) if isinstance(lone[n], str)
                   else abs(order[n][p[n]] - order[n][lone[n]]) for n, _ in axes)

    def truth(p: Point) -> float:
        if p == lone:
            return needle
        if plateau is not None and steps(p) == 1:
            return needle * (1 + plateau)
        return 10.0 * bowl(p)

    return _record(f"nkind{k}", space, truth, rng.uniform(0.05, 0.08), Point(prefer), 9000 + k)


GENERATED: dict[str, Callable[[], Landscape]] = {
    "synthetic": synthetic, "interaction": interaction, "needle": needle, "inert": inert,
    "small": small, "small8": small8, "small9": small9, "small10": small10}


KINDS: dict[str, Callable[[int], Landscape]] = {
    "kind": small_kind, "ikind": interaction_kind, "nkind": needle_kind}
"""The kinds drawn at random, by the prefix of their members' names (``kind3``, ``ikind0``)."""


def is_kind(name: str) -> bool:
    """Whether ``name`` is a member of a kind: ``kindK`` (:func:`small_kind`), ``ikindK``
    (:func:`interaction_kind`) or ``nkindK`` (:func:`needle_kind`)."""
    prefix = name.rstrip("0123456789")
    return prefix in KINDS and name != prefix


def generated(name: str) -> Landscape:
    """The generated landscape called ``name`` (a member of a kind: :func:`is_kind`)."""
    if is_kind(name):
        prefix = name.rstrip("0123456789")
        return KINDS[prefix](int(name[len(prefix):]))
    return GENERATED[name]()
