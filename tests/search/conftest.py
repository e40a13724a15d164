"""Small landscapes in memory for the strategy tests (seeded, fast)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from tunelab.expr import Expression
from tunelab.replay import Landscape
from tunelab.space import Point, Space
from tunelab.spec import ENV_AXIS, ConstraintSpec


def make_landscape(space: Space, truth: Callable[[Point], float], *, noise: float = 0.05,
                   runs: int = 20, baseline: Point | None = None, seed: int = 0,
                   direction: str = "minimize",
                   env_sets: dict[str, dict[str, str]] | None = None) -> Landscape:
    """Every valid point with ``runs`` recorded values: truth x lognormal noise."""
    rng = np.random.default_rng(seed)
    recorded = {p: tuple(float(v) for v in truth(p) * np.exp(rng.normal(0, noise, runs)))
                for p in space.points()}
    return Landscape("test", "time_s", direction, recorded, space, baseline=baseline,
                     env_sets=env_sets)


@pytest.fixture
def qe_like() -> Landscape:
    """np x npool x ndiag under pw.x's rules (9 valid points of 64); np=2 npool=2 is best
    by 30 %, noise 5 %."""
    rules = ["np % npool == 0", "is_square(ndiag)", "ndiag <= np // npool"]
    space = Space([("np", (1, 2, 3, 4)), ("npool", (1, 2, 3, 4)), ("ndiag", (1, 2, 3, 4))],
                  None, [ConstraintSpec(Expression.parse(r)) for r in rules])

    def truth(p: Point) -> float:
        base = {1: 10.0, 2: 7.0, 3: 9.0, 4: 9.5}[int(p["np"])]
        return base * (0.7 if (p["np"], p["npool"]) == (2, 2) else 1.0) * (
            1.2 if p["ndiag"] == 4 else 1.0)

    return make_landscape(space, truth, baseline=Point({"np": 1, "npool": 1, "ndiag": 1}))


UCX_OPTIONS = {"a": {"UCX_A": "y"}, "b": {"UCX_B": "y"}, "c": {"UCX_C": "y"},
               "d": {"UCX_D": "1", "UCX_E": "2"}}


def factorial_env_sets() -> dict[str, dict[str, str]]:
    """All 16 on/off combinations of four options, named like ``a+c``."""
    names = list(UCX_OPTIONS)
    sets: dict[str, dict[str, str]] = {}
    for mask in range(2 ** len(names)):
        chosen = [n for i, n in enumerate(names) if mask >> i & 1]
        env: dict[str, str] = {}
        for n in chosen:
            env.update(UCX_OPTIONS[n])
        sets["+".join(chosen) or "baseline"] = env
    return sets


@pytest.fixture
def ucx_like() -> Landscape:
    """A throughput (maximised) over 16 env sets: options a and c help (10 %, 8 %), b
    hurts (15 %), d does nothing; a+c is the best."""
    sets = factorial_env_sets()
    space = Space([(ENV_AXIS, tuple(sets))])

    def truth(p: Point) -> float:
        on = set(str(p[ENV_AXIS]).split("+"))
        return 100.0 * (1.10 if "a" in on else 1) * (1.08 if "c" in on else 1) * (
            0.85 if "b" in on else 1)

    return make_landscape(space, truth, baseline=Point({ENV_AXIS: "baseline"}),
                          direction="maximize", env_sets=sets)
