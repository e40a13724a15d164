"""The one recommendation (tunelab.stats.recommend): the point most likely best given all
runs, what ``tunelab best`` crowns and every search strategy returns."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

from tunelab.search._evidence import Evidence
from tunelab.space import Point
from tunelab.stats import best, posterior, recommend


def test_two_well_measured_points_get_the_normal_probability() -> None:
    rng = np.random.default_rng(1)
    a, b = np.exp(rng.normal(0.0, 0.05, 40)), np.exp(rng.normal(0.03, 0.05, 40))
    post = posterior({"a": a, "b": b}, "minimize")
    la, lb = np.log(a), np.log(b)
    sigma = math.sqrt((((la - la.mean()) ** 2).sum() + ((lb - lb.mean()) ** 2).sum()
                       + np.var([la.mean(), lb.mean()], ddof=1)) / 79)
    expected = norm.cdf((lb.mean() - la.mean()) / (sigma * math.sqrt(2 / 40)))
    p = post.p_best()
    assert p["a"] == pytest.approx(expected, abs=0.002)
    assert p["a"] + p["b"] == pytest.approx(1.0)
    assert recommend({"a": a, "b": b}, "maximize").point == "b"  # bigger is better then


def _lucky_pair() -> dict[str, list[float]]:
    """A: ten runs around 10; B: two runs, 3 % better on average; eight more points 5 %
    behind A (10 % noise throughout)."""
    e = math.exp(0.1)
    samples = {"A": [10 * e, 10 / e] * 5, "B": [9.1, 10.3]}
    samples.update({f"c{i}": [10.5 * e, 10.5, 10.5 / e] for i in range(8)})
    return samples


def test_two_lucky_runs_are_believed_less_than_ten() -> None:
    """B has the best mean, but from two runs against A's ten, and the other points pull an
    uncertain mean towards theirs: A is the more likely best."""
    samples = _lucky_pair()
    assert np.mean(np.log(samples["B"])) < np.mean(np.log(samples["A"]))
    choice = recommend(samples, "minimize")
    assert choice is not None and choice.point == "A" and choice.ranking[1] == "B"
    assert choice.p_best is not None and choice.p_best > choice.p_best_of["B"]


def test_judged_on_its_own_runs_the_lucky_pair_is_the_likelier_best() -> None:
    """What decides the crown (shrunk) and what decides the next runs (each point on its own
    runs) differ exactly there: unshrunk, B's better mean makes it the likelier best."""
    post = posterior(_lucky_pair(), "minimize")
    shrunk, own = post.p_best(), post.p_best_unpooled()
    assert shrunk["A"] > shrunk["B"] and own["B"] > own["A"]
    assert sum(own.values()) == pytest.approx(1.0)


def test_the_order_of_points_and_runs_changes_nothing() -> None:
    rng = np.random.default_rng(3)
    samples = {f"p{i}": list(np.exp(rng.normal(0.02 * (i % 5), 0.07, 1 + i % 3)))
               for i in range(15)}
    shuffled = {k: list(reversed(v)) for k, v in reversed(list(samples.items()))}
    one, other = recommend(samples, "minimize"), recommend(shuffled, "minimize")
    assert one == other


def test_equal_values_drawn_twice_make_nobody_sure() -> None:
    """A replayed point can answer twice with the same recorded run: zero spread in one
    point is not zero noise while the points differ."""
    samples = {"a": [10.0, 10.0], "b": [10.6], "c": [11.5]}
    post = posterior(samples, "minimize")
    assert post.p_within(math.log1p(0.02))["a"] < 0.95
    assert post.sigma > 0


def test_no_noise_to_speak_of_gives_no_probability() -> None:
    assert recommend({"a": [3.0]}, "minimize").p_best is None  # type: ignore[union-attr]
    same = recommend({"a": [3.0, 3.0], "b": [3.0, 3.0]}, "minimize")
    assert same is not None and same.p_best is None and same.point == "a"
    assert recommend({"a": [math.nan]}, "minimize") is None


def test_values_that_are_not_all_positive_are_compared_as_they_are() -> None:
    choice = recommend({"a": [-1.0, -1.2, -0.9], "b": [0.5, 0.4, 0.6], "c": [2.0, 2.1]},
                       "minimize")
    assert choice is not None and choice.point == "a"


def _runs_table(samples: dict[str, list[float]]) -> pd.DataFrame:
    rows = []
    for point_id, (label, values) in enumerate(samples.items()):
        for repeat, value in enumerate(values):
            rows.append({"point": json.dumps({"x": label}), "point_id": point_id,
                         "repeat": repeat, "status": "ok", "fom.t": value})
    return pd.DataFrame(rows)


def test_best_and_a_strategy_crown_the_same_point_with_its_probability() -> None:
    """The runs table (``tunelab best``) and a strategy's memory (``result``) hold the same
    runs in other orders and types; both recommend the same point, with the same
    probability — here not the point with the best mean, which has two runs against ten."""
    samples = _lucky_pair()
    evidence = Evidence("minimize")
    for label, values in reversed(list(samples.items())):
        for repeat, value in enumerate(values):
            evidence.add(Point({"x": label}), repeat, value)
    result = best(_runs_table(samples), "t", "minimize")
    assert evidence.recommended() == Point({"x": "A"})
    assert json.loads(result.best.point) == {"x": "A"}
    assert result.runner_up is not None and json.loads(result.runner_up.point) == {"x": "B"}
    choice = evidence.recommend()
    assert choice is not None and result.p_best == pytest.approx(choice.p_best)
