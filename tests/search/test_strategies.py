"""The search strategies against in-memory landscapes (no process is started)."""

from __future__ import annotations

import pytest

from tests.search.conftest import make_landscape
from tunelab.errors import StudyError
from tunelab.replay import Landscape, replay_strategy
from tunelab.search import (
    Budget,
    RunRequest,
    SearchSettings,
    make_run_strategy,
    make_strategy,
)
from tunelab.search._one_at_a_time import env_options, neighbours
from tunelab.space import Point, Space
from tunelab.spec import ENV_AXIS


def run_strategy(landscape: Landscape, seed: int = 0, repeats: int = 3,
                 max_runs: int | None = None, **settings: object):
    strategy = make_run_strategy(
        SearchSettings(seed=seed, **settings), landscape.space,  # type: ignore[arg-type]
        direction=landscape.direction, repeats=repeats, baseline=landscape.baseline,
        env_sets=landscape.env_sets, budget=Budget(max_runs))
    return strategy, replay_strategy(strategy, landscape, seed)


def test_racing_finds_the_best_and_spends_runs_on_contenders() -> None:
    space = Space([("x", tuple(range(8)))])
    best, twin = Point({"x": 3}), Point({"x": 5})  # equally fast: only repeats can tell

    def truth(p: Point) -> float:
        return {3: 10.0, 5: 10.0}.get(int(p["x"]), 14.0 + int(p["x"]))

    landscape = make_landscape(space, truth, noise=0.05, baseline=Point({"x": 0}))
    strategy, result = run_strategy(landscape, strategy="racing", propose="grid")
    assert result.chosen in (best, twin)
    ev = strategy.evidence  # type: ignore[attr-defined]
    clear_losers = [p for p in space.points() if p not in (best, twin)]
    assert all(ev.attempts(p) == 2 for p in clear_losers)  # dropped after min_repeats
    # the extra repeats went to the twins only; an equal twin may be dropped once it
    # cannot be better than the leader by more than the indifference (2 %)
    assert ev.attempts(result.chosen) > 2
    assert sum(ev.attempts(p) for p in (best, twin)) == result.runs - 2 * len(clear_losers)
    assert result.runs < 8 * 10  # far fewer than every point at max_repeats


def test_racing_keeps_rounds_interleaved_and_repeats_deterministic(qe_like: Landscape) -> None:
    def requests(seed: int) -> list[list[RunRequest]]:
        strategy = make_run_strategy(SearchSettings("racing", seed=seed), qe_like.space,
                                     direction="minimize", repeats=3,
                                     baseline=qe_like.baseline)
        rounds = []
        while not strategy.done and (batch := strategy.ask_runs(100)):
            rounds.append(batch)
            for r in batch:
                strategy.tell_run(r, qe_like.draw(r.point, r.repeat, 7))
        return rounds

    first, again = requests(1), requests(1)
    assert first == again  # a resumed study asks for the same runs
    for batch in first:
        assert len({r.point for r in batch}) == len(batch)  # one run per point per round
    assert qe_like.baseline in [r.point for r in first[0]]  # the baseline is in the first round


@pytest.mark.parametrize("name", ["auto", "racing", "one-at-a-time", "hierarchical"])
def test_run_strategies_shuffle_the_baseline_within_its_rounds(qe_like: Landscape,
                                                                name: str) -> None:
    """A study's first run is often slower (cold caches): a baseline always run first in
    its round would carry that cost into every comparison with it, so it takes its place in
    the round's shuffled order like every other point (it opened every round before)."""
    places = []
    for seed in range(6):
        strategy = make_run_strategy(SearchSettings(name, seed=seed), qe_like.space,
                                     direction="minimize", repeats=3,
                                     baseline=qe_like.baseline, budget=Budget(60))
        while not strategy.done and (batch := strategy.ask_runs(100)):
            points = [r.point for r in batch]
            if qe_like.baseline in points and len(points) >= 3:
                places.append(points.index(qe_like.baseline))
            for r in batch:
                strategy.tell_run(r, qe_like.draw(r.point, r.repeat, seed))
    assert len(places) >= 6
    assert places.count(0) <= len(places) / 2


def test_budget_is_never_exceeded(qe_like: Landscape) -> None:
    for name in ("auto", "racing", "one-at-a-time", "hierarchical", "grid"):
        _, result = run_strategy(qe_like, strategy=name, max_runs=7)
        assert result.runs <= 7


@pytest.mark.parametrize("sampler", ["tpe", "cmaes", "gp"])
def test_optuna_proposes_every_valid_point_once_and_nothing_else(qe_like: Landscape,
                                                                 sampler: str) -> None:
    space = qe_like.space
    strategy = make_strategy("optuna", space, samples=100, sampler=sampler, seed=3,
                             first=qe_like.baseline)
    seen: list[Point] = []
    while not strategy.done:
        batch = strategy.ask(1)
        assert batch, "asked for nothing before every valid point was proposed"
        for p in batch:
            assert space.contains(p) and p not in seen
            seen.append(p)
            strategy.tell(p, qe_like.draw(p, 0, 0))
    assert seen[0] == qe_like.baseline
    assert sorted(p.key for p in seen) == sorted(p.key for p in space.points())


def test_optunas_random_start_measures_corners_as_often_as_inner_points() -> None:
    """5 of 2 x 5 points from TPE's random start, 300 seeds: a proposal already taken went to
    its nearest free neighbour, so a corner (fewer neighbours) ran 0.44-0.46 of the time and
    an inner point 0.53-0.55; a free point drawn at random instead evens them out."""
    from tunelab.search._optuna import OptunaSearch

    space = Space([("a", (1, 2)), ("b", (1, 2, 3, 4, 5))])
    counts = dict.fromkeys(space.points(), 0)
    for seed in range(300):
        search = OptunaSearch(space, trials=10, direction="minimize", seed=seed)
        for k in range(5):
            point = search.ask(1)[0]
            counts[point] += 1
            search.tell(point, float(1 + (seed * 7 + k) % 5))
    corner = [counts[p] / 300 for p in counts if p["b"] in (1, 5)]
    inner = [counts[p] / 300 for p in counts if p["b"] not in (1, 5)]
    assert abs(sum(corner) / len(corner) - sum(inner) / len(inner)) < 0.04


def test_a_proposal_measured_already_goes_to_a_neighbour_then_anywhere_not_outward() -> None:
    """A model proposing a point it has measured got the closest free point, so its search
    walked outward from its favourite one ring at a time and measured the points it liked
    least last: a point good only where every single change is bad was never reached. Now a
    free neighbour one step away, drawn at random, and once those are measured a free point
    drawn anywhere."""
    from tunelab.search._encoding import SpaceEncoding

    space = Space([("a", tuple(range(8))), ("b", tuple(range(8)))])
    encoding = SpaceEncoding(space, seed=3)
    centre = {"a": 3, "b": 3}
    assert encoding.nearest(centre) == Point(centre)
    ring = [encoding.nearest(centre) for _ in range(4)]
    assert sorted((int(p["a"]), int(p["b"])) for p in ring) == [(2, 3), (3, 2), (3, 4), (4, 3)]
    far = []
    for seed in range(200):  # the ring taken: anywhere, not the next ring around the centre
        encoding = SpaceEncoding(space, seed=seed)
        for p in [Point(centre), *ring]:
            encoding.taken[encoding.index(p)] = True
        point = encoding.nearest(centre)
        far.append(abs(int(point["a"]) - 3) + abs(int(point["b"]) - 3) > 2)
    assert sum(far) / len(far) > 0.6  # 51 of the 59 free points lie more than two steps out


def test_optuna_sees_env_sets_by_their_variables(ucx_like: Landscape) -> None:
    from tunelab.search._encoding import SpaceEncoding

    encoding = SpaceEncoding(ucx_like.space, ucx_like.env_sets)
    assert [d.name for d in encoding.dimensions] == [
        "env:UCX_A", "env:UCX_B", "env:UCX_C", "env:UCX_D", "env:UCX_E"]
    wanted = {"env:UCX_A": "y", "env:UCX_B": "-", "env:UCX_C": "y", "env:UCX_D": "-",
              "env:UCX_E": "-"}
    assert encoding.nearest(wanted) == Point({ENV_AXIS: "a+c"})
    assert encoding.nearest(wanted) != Point({ENV_AXIS: "a+c"})  # taken: the next nearest


def test_optuna_accepts_points_it_did_not_propose(qe_like: Landscape) -> None:
    strategy = make_strategy("optuna", qe_like.space, samples=9, seed=0)
    strategy.tell(qe_like.baseline, 10.0)  # raced by someone else
    proposed = []
    while not strategy.done and (batch := strategy.ask(1)):
        proposed += batch
        strategy.tell(batch[0], 9.0)
    assert qe_like.baseline not in proposed and len(proposed) == 8


def test_env_options_are_the_sets_adding_one_option(ucx_like: Landscape) -> None:
    sets = ucx_like.env_sets or {}
    assert set(env_options(sets, "baseline")) == {"a", "b", "c", "d"}
    around = {str(p[ENV_AXIS]) for p in neighbours(Point({ENV_AXIS: "a+c"}), ucx_like.space,
                                                  sets)}
    assert around == {"a", "c", "a+b+c", "a+c+d"}


@pytest.mark.parametrize("seed", range(4))
def test_one_at_a_time_combines_the_better_options(ucx_like: Landscape, seed: int) -> None:
    strategy, result = run_strategy(ucx_like, strategy="one-at-a-time", seed=seed)
    better = {str(p[ENV_AXIS]) for p in strategy.better_options}  # type: ignore[attr-defined]
    assert {"a", "c"} <= better and "b" not in better  # d (no effect) may slip in by chance
    combination = strategy.combination  # type: ignore[attr-defined]
    assert combination == Point({ENV_AXIS: "+".join(o for o in "abcd" if o in better)})
    assert result.chosen is not None and {"a", "c"} <= set(str(result.chosen[ENV_AXIS]).split("+"))
    assert ucx_like.within(result.chosen, 0.05)
    assert result.points < 16  # never measured the whole cube


def test_one_at_a_time_on_parameters_and_its_local_check(qe_like: Landscape) -> None:
    strategy, result = run_strategy(qe_like, strategy="one-at-a-time")
    # alone: np 2, 3, 4 (npool and ndiag alone are not valid with np=1)
    assert {p["np"] for p in strategy.options} == {2, 3, 4}  # type: ignore[attr-defined]
    # np=2 wins alone; the local check around it finds npool=2
    assert result.chosen == Point({"np": 2, "npool": 2, "ndiag": 1})


def test_one_at_a_time_needs_a_baseline(qe_like: Landscape) -> None:
    with pytest.raises(StudyError, match="needs a baseline"):
        make_run_strategy(SearchSettings("one-at-a-time"), qe_like.space,
                          direction="minimize", repeats=3)


def test_hierarchical_tunes_groups_in_order_and_freezes_winners(qe_like: Landscape) -> None:
    strategy, result = run_strategy(qe_like, strategy="hierarchical",
                                    groups=[["np"], ["npool", "ndiag"]])
    winners = strategy.winners  # type: ignore[attr-defined]
    assert winners[0]["np"] == 2  # stage 1: np with npool=ndiag=1
    assert all(p["np"] == 2 for p in winners[1:2])  # stage 2 keeps np=2
    assert result.chosen == Point({"np": 2, "npool": 2, "ndiag": 1})


def test_hierarchical_rejects_unknown_groups(qe_like: Landscape) -> None:
    with pytest.raises(StudyError, match="threads is not a parameter; parameters: np, npool"):
        make_run_strategy(SearchSettings("hierarchical", groups=[["threads"]]), qe_like.space,
                          direction="minimize", repeats=3, baseline=qe_like.baseline)


def test_point_strategies_as_run_strategies_keep_the_classic_plan(qe_like: Landscape) -> None:
    strategy, result = run_strategy(qe_like, strategy="grid", repeats=2)
    assert result.runs == 18 and result.points == 9
    assert result.chosen == qe_like.true_best()[0]


MERGE_DERIVED = """\
name: m
workload: {name: merge, options: {transport: tcp}}
parameters:
  workers: [2, 3, 4]
  iterations: [1, 2, 3]
derived:
  chunk_size: 1500 - 500 * workers
search: {strategy: %s}
"""
"""Workers 3 and 4 give a chunk size (0, -500) the merge benchmark never takes."""


def merge_derived_study(tmp_path, search: str):
    from tunelab.execute.study import prepare_study
    from tunelab.spec import load_study

    path = tmp_path / "s.yaml"
    path.write_text(MERGE_DERIVED % search)
    return prepare_study(load_study(path), dry_run=True)


def test_optuna_never_proposes_a_point_whose_derived_value_the_workload_never_takes(
        tmp_path) -> None:
    """Before, optuna proposed them: each run failed at command build and the trial was
    told a failure; now they are no points of the space, as a constraint's exclusions."""
    from optuna.trial import TrialState

    study = merge_derived_study(tmp_path, "optuna, samples: 9")
    strategy = study.new_strategy()
    seen: list[Point] = []
    while not strategy.done:
        for p in strategy.ask(1):
            seen.append(p)
            strategy.tell(p, 10.0 * int(p["iterations"]))
    assert sorted(p.key for p in seen) == sorted(p.key for p in study.space.points())
    assert {p["workers"] for p in seen} == {2} and len(seen) == 3
    for p in seen:  # every point makes its command
        study.workload.point_options(study.space.values(p))
    states = {t.state for t in strategy._study.trials}  # type: ignore[attr-defined]
    assert states == {TrialState.COMPLETE}
    assert study.space.left_out == {"chunk_size": 6}
    assert "chunk_size' is 0, a value workload 'merge' never takes" in \
        study.space.broken["chunk_size"]


@pytest.mark.parametrize("search", ["racing, max_runs: 12", "auto, max_runs: 12",
                                    "racing, propose: optuna, samples: 9, max_runs: 12"])
def test_run_strategies_never_request_a_point_whose_derived_value_the_workload_never_takes(
        tmp_path, search: str) -> None:
    study = merge_derived_study(tmp_path, search)
    strategy = study.new_run_strategy()
    requested: list[RunRequest] = []
    while not strategy.done and (batch := strategy.ask_runs(4)):
        for r in batch:
            requested.append(r)
            strategy.tell_run(r, 10.0 * int(r.point["iterations"]) + r.repeat)
    assert requested and {r.point["workers"] for r in requested} == {2}
