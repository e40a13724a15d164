"""Replay: a finished study as a workload, the shipped landscapes, and verdicts under drift."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml

from tests.conftest import PY, tunelab
from tunelab.execute.runner import run_study
from tunelab.execute.study import prepare_study
from tunelab.replay import load_landscape
from tunelab.report.load import load_results
from tunelab.space import Point
from tunelab.spec import load_study
from tunelab.stats import Verdict
from tunelab.store import open_store

PROG = Path(__file__).parents[1] / "data" / "prog.py"
LANDSCAPES = Path(__file__).parents[2] / "benchmarks" / "landscapes"


def _run(path: Path, directory: Path) -> None:
    outcome = run_study(prepare_study(load_study(path)), directory)
    assert outcome.ran > 0


def test_replay_of_a_finished_study_answers_with_its_recorded_runs(write_study, tmp_path):
    path = write_study(f"""\
        name: small
        workload:
          name: command
          options:
            argv: [{PY}, {PROG}, ok, "{{x}}"]
            foms: {{value: 'value=(?P<value>[0-9.]+)'}}
        parameters:
          x: [1, 2, 3, 4]
        derived:
          half: x / 2
        constraints:
          - expr: x != 3
            why: three is unlucky
        repeats: 2
        baseline: {{x: 1}}
        objective: {{fom: value}}
        """)
    _run(path, tmp_path / "d")
    res = tunelab("replay", tmp_path / "d", "-o", tmp_path / "replay.yaml")
    assert res.returncode == 0, res.stderr
    conn = sqlite3.connect(tmp_path / "d" / "tunelab.db")
    with conn:  # the noise watch flagged two runs: the replay says its noise is partly theirs
        conn.execute("UPDATE noise SET disturbed = (run_id IN (1, 2))")
    conn.close()
    flagged = tunelab("replay", tmp_path / "d", "-o", tmp_path / "flagged.yaml")
    assert "2 of its 6 recorded runs were disturbed by other processes" in flagged.stderr
    source = yaml.safe_load((tmp_path / "flagged.yaml").read_text())["workload"]["options"]
    assert source["source"]["disturbed_runs"] == 2 and source["source"]["runs"] == 6
    again = tunelab("replay", tmp_path / "d", "-o", tmp_path / "replay.yaml")
    assert again.returncode == 2 and "pass --force" in again.stderr
    landscape = load_landscape(tmp_path / "replay.yaml")
    assert sorted(p["x"] for p in landscape.space.points()) == [1, 2, 4]
    assert landscape.runs[Point({"x": 4})] == (8.0, 8.0)  # prog.py prints value = 2x
    assert landscape.baseline == Point({"x": 1}) and landscape.fom == "value"
    text = yaml.safe_load((tmp_path / "replay.yaml").read_text())
    assert text["constraints"] == [{"expr": "x != 3", "why": "three is unlucky"}]
    # the replay study runs through the real runner and answers with recorded values
    _run(tmp_path / "replay.yaml", tmp_path / "r")
    with open_store(tmp_path / "r") as store:
        frame = store.runs_frame()
    assert len(frame) == 6 and (frame["status"] == "ok").all()
    assert (frame["fom.value"] == frame["x"] * 2).all()
    # the study's runs were watched for noise; the replay's measure nothing of this
    # machine, so none is flagged disturbed by its load (every one was, on a busy machine)
    assert _noise_rows(tmp_path / "d") == 6 and _noise_rows(tmp_path / "r") == 0


def _noise_rows(directory: Path) -> int:
    conn = sqlite3.connect(directory / "tunelab.db")
    try:
        return int(conn.execute("SELECT COUNT(*) FROM noise").fetchone()[0])
    except sqlite3.OperationalError:  # no noise table: nothing was sampled
        return 0
    finally:
        conn.close()


def test_replay_of_a_wall_time_study_answers_under_its_own_name(write_study, tmp_path):
    path = write_study(f"""\
        name: walls
        workload:
          name: command
          options:
            argv: [{PY}, {PROG}, ok, "{{x}}"]
        parameters:
          x: [1, 2]
        repeats: 2
        objective: {{fom: wall_s}}
        """)
    _run(path, tmp_path / "d")
    res = tunelab("replay", tmp_path / "d", "-o", tmp_path / "replay.yaml")
    assert res.returncode == 0, res.stderr
    landscape = load_landscape(tmp_path / "replay.yaml")
    assert landscape.fom == "replayed_wall_s"  # tunelab measures the replay's own wall_s
    _run(tmp_path / "replay.yaml", tmp_path / "r")
    with open_store(tmp_path / "r") as store:
        frame = store.runs_frame()
    recorded = {v for runs in landscape.runs.values() for v in runs}
    assert set(frame["fom.replayed_wall_s"]) <= recorded
    text = (tmp_path / "replay.yaml").read_text().replace("replayed_wall_s", "wall_s")
    (tmp_path / "bad.yaml").write_text(text)
    bad = tunelab("space", tmp_path / "bad.yaml")
    assert bad.returncode == 2 and "what tunelab measures" in bad.stderr


def test_replay_of_a_directory_without_a_study_is_one_clear_error(tmp_path):
    res = tunelab("replay", tmp_path, "-o", tmp_path / "r.yaml")
    assert res.returncode == 2
    assert "not a tunelab study directory" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_shipped_landscapes_hold_every_point_five_times():
    for name, points in (("qe-si8.yaml", 9), ("merge-ucx.yaml", 64)):
        path = LANDSCAPES / name
        if not path.exists():
            pytest.skip(f"{name} not recorded yet")
        landscape = load_landscape(path)
        assert len(landscape.space.points()) == points
        assert set(landscape.runs) == set(landscape.space.points())
        assert all(len(runs) >= 5 for runs in landscape.runs.values())


def _replayed(tmp_path: Path, name: str, seed: int, drift: dict[str, float]) -> Path:
    data = yaml.safe_load((LANDSCAPES / "qe-si8.yaml").read_text())
    data["name"] = name
    data["workload"]["options"].update(seed=seed, drift=drift)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_back_to_back_studies_never_give_opposite_verdicts_under_drift(tmp_path):
    """The demo study twice, the second while the machine slows down (1 % per run, so the
    last runs take 1.5x as long): verdicts may move between faster/slower and
    indistinguishable, never from faster to slower."""
    first = _replayed(tmp_path, "quiet", seed=1, drift={})
    second = _replayed(tmp_path, "loaded", seed=2, drift={"per_run": 0.01})
    verdicts = []
    for path in (first, second):
        _run(path, tmp_path / path.stem)
        results = load_results(tmp_path / path.stem)
        verdicts.append({pc.point: pc.comparison.verdict for pc in results.comparisons})
        assert any(v is not Verdict.INDISTINGUISHABLE for v in verdicts[-1].values())
    opposite = {Verdict.BETTER, Verdict.WORSE}
    for point, verdict in verdicts[0].items():
        assert {verdict, verdicts[1][point]} != opposite, point


def test_racing_study_runs_through_the_runner_and_resumes(tmp_path):
    data = yaml.safe_load((LANDSCAPES / "qe-si8.yaml").read_text())
    data["search"] = {"strategy": "racing", "seed": 3, "max_runs": 30}
    path = tmp_path / "race.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    res = tunelab("run", path, "--dir", tmp_path / "d", "-q")
    assert res.returncode == 0, res.stderr
    with open_store(tmp_path / "d") as store:
        frame = store.runs_frame()
    per_point = frame.groupby("point").size()
    assert len(frame) <= 30 and per_point.min() >= 1
    assert per_point.max() > per_point.min()  # repeats went where they decide
    # a replay measures nothing of this machine: no run's noise was sampled
    assert "noise.load_before" not in frame or frame["noise.load_before"].isna().all()
    again = tunelab("run", path, "--dir", tmp_path / "d", "-q")
    assert again.returncode == 0 and f"0 runs now, {len(frame)} done before" in again.stderr
    shutil.rmtree(tmp_path / "d")


def test_tunelab_best_crowns_the_point_the_strategy_recommends(tmp_path):
    """Item 1 of issue 29: one recommendation. An auto study runs through the runner on a
    recorded landscape; ``tunelab best`` (from the store) and the strategy (driven in memory
    on the same recorded runs) name the same point, with the same probability."""
    import json

    from tunelab.replay import replay_strategy
    from tunelab.search import Budget, SearchSettings, make_run_strategy

    data = yaml.safe_load((LANDSCAPES / "qe-si8.yaml").read_text())
    data["search"] = {"strategy": "auto", "seed": 3, "max_runs": 16}
    path = tmp_path / "auto.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    res = tunelab("run", path, "--dir", tmp_path / "d", "-q")
    assert res.returncode == 0, res.stderr
    shown = tunelab("best", tmp_path / "d", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    landscape = load_landscape(path)
    strategy = make_run_strategy(SearchSettings("auto", seed=3), landscape.space,
                                 direction=landscape.direction, repeats=landscape.repeats,
                                 baseline=landscape.baseline, budget=Budget(16))
    replayed = replay_strategy(strategy, landscape, seed=0)
    assert replayed.runs == 16
    assert document["best"]["point"] == dict(replayed.chosen)
    choice = strategy.evidence.recommend()  # type: ignore[attr-defined]
    assert document["p_best"] == pytest.approx(choice.p_best)
    text = tunelab("best", tmp_path / "d")
    assert f"Probability that it is the best, given all runs: {choice.p_best:.0%}" in text.stdout
