"""The search section of a study file: run strategies' settings and their errors."""

from __future__ import annotations

import pytest

from tests.conftest import PY, tunelab
from tunelab.errors import StudyError
from tunelab.execute.study import prepare_study
from tunelab.spec import load_study

HEAD = f"""\
name: s
workload:
  name: command
  options:
    argv: [{PY}, -c, "print('v=1')"]
    foms: {{v: 'v=(?P<value>[0-9]+)'}}
parameters:
  a: [1, 2, 3]
  b: [x, y]
baseline: {{a: 1, b: x}}
objective: {{fom: v}}
"""


def test_run_strategy_settings_reach_the_strategy(write_study) -> None:
    path = write_study(HEAD + "search: {strategy: racing, propose: optuna, sampler: cmaes, "
                              "max_runs: 12, max_wall: 5m, min_repeats: 1, indifference: 0.05}\n")
    study = prepare_study(load_study(path))
    settings = study.search_settings()
    assert (settings.strategy, settings.propose, settings.sampler) == ("racing", "optuna", "cmaes")
    assert settings.max_runs == 12 and settings.max_wall_s == 300.0
    assert settings.race(0.02).indifference == 0.05
    assert study.decides_repeats and study.planned_runs == 12
    assert study.new_run_strategy().name == "racing"
    # a strategy made again in the same process (runs judged again) keeps the wall clock
    # of the first: max_wall is not granted twice
    import time

    again = study.new_run_strategy(started=time.monotonic() - 300.0)
    assert again.ask_runs(10) == []


@pytest.mark.parametrize(("search", "message"), [
    ("{strategy: racing, propose: annealing}", "'search.propose'"),
    ("{strategy: racing, propose: random}", "racing with propose: random needs 'samples: N'"),
    ("{strategy: hierarchical, min_repeats: 5, max_repeats: 3}",
     "'min_repeats' (5) is larger than 'max_repeats' (3)"),
    ("{strategy: racing, max_wall: soon}", "'max_wall' must be a duration"),
    ("{strategy: optuna, samples: 3, sampler: bayes}", "'search.sampler'"),
    ("{strategy: simulated-annealing}", "'search.strategy'"),
])
def test_bad_search_settings_are_one_line_errors(write_study, search: str, message: str) -> None:
    path = write_study(HEAD + f"search: {search}\n")
    with pytest.raises(StudyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_study(path)


def test_space_command_describes_a_run_strategy_or_says_what_is_wrong(write_study) -> None:
    path = write_study(HEAD + "search: {strategy: one-at-a-time, max_runs: 20}\n")
    res = tunelab("space", path)
    assert res.returncode == 0, res.stderr
    assert "runs chosen by one-at-a-time (repeats where they decide), up to 20 runs" in res.stdout
    bad = write_study(HEAD + "search: {strategy: racing, propose: random}\n", "bad.yaml")
    res = tunelab("space", bad)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "bad.yaml:" in res.stderr and "needs 'samples: N'" in res.stderr


def test_auto_over_a_space_too_large_to_enumerate_needs_max_runs(write_study) -> None:
    big = HEAD.replace("  a: [1, 2, 3]\n", "".join(f"  p{i}: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n"
                                                   for i in range(8)))
    big = big.replace("baseline: {a: 1, b: x}\n", "")
    path = write_study(big + "search: {strategy: auto}\n")
    res = tunelab("space", path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "study.yaml:" in res.stderr and "needs 'max_runs: N'" in res.stderr
    fine = write_study(big + "search: {strategy: auto, max_runs: 40}\n", "fine.yaml")
    assert prepare_study(load_study(fine)).new_run_strategy().name == "auto"


def test_a_search_plans_no_more_points_than_the_space_holds(write_study) -> None:
    """Optuna asked for 6 samples of a space whose constraint leaves 2 valid points plans
    2 points (it said "up to 6 points … = up to 18 runs", then ran 6)."""
    path = write_study(HEAD + "constraints: ['a == 1']\nsearch: {strategy: optuna, samples: 6}\n"
                              "repeats: 3\n")
    study = prepare_study(load_study(path))
    assert study.planned_runs == 2 * 3
    res = tunelab("space", path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("2 valid points of 6 combinations")
    assert "up to 2 points chosen by optuna x 3 repeats = up to 6 runs" in res.stdout
    one = write_study(HEAD.replace("b: [x, y]", "b: [x]") + "constraints: ['a == 1']\n",
                      "one.yaml")
    assert tunelab("space", one).stdout.startswith("1 valid point of 3 combinations")


def test_a_run_strategy_plans_no_more_runs_than_its_points_can_take(write_study) -> None:
    """racing with max_runs 40 on 2 valid points of at most 3 repeats each plans 6 runs."""
    path = write_study(HEAD + "constraints: ['a == 1']\nsearch: {strategy: racing, "
                              "max_runs: 40, max_repeats: 3}\n")
    assert prepare_study(load_study(path)).planned_runs == 2 * 3
    res = tunelab("space", path)
    assert "runs chosen by racing (repeats where they decide), up to 6 runs" in res.stdout
