"""End-to-end runner tests: real processes, the real CLI, the real SQLite store."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import PY, tunelab
from tunelab.execute.runner import plan_runs, run_study
from tunelab.execute.study import prepare_study
from tunelab.report.load import load_results
from tunelab.space import Point
from tunelab.spec import load_study
from tunelab.store import open_store
from tunelab.workloads.command import CommandWorkload

PROG = Path(__file__).parents[1] / "data" / "prog.py"


def study_text(modes: str, xs: str = "[1, 2]", repeats: int = 2, timeout: float = 20,
               extra: str = "", foms: str = "{value: 'value=(?P<value>[0-9.]+)'}") -> str:
    return f"""\
name: t
workload:
  name: command
  options:
    argv: [{PY}, {PROG}, "{{mode}}", "{{x}}"]
    foms: {foms}
parameters:
  mode: {modes}
  x: {xs}
repeats: {repeats}
timeout: {timeout}
{extra}"""


def runs(study_dir: Path) -> list[dict]:
    conn = sqlite3.connect(study_dir / "tunelab.db")
    conn.row_factory = sqlite3.Row
    rows = [dict(r) for r in conn.execute(
        "SELECT r.*, p.key FROM runs r JOIN points p ON p.id = r.point_id ORDER BY r.id")]
    conn.close()
    return rows


def test_study_records_every_run_with_foms_in_interleaved_order(write_study, tmp_path):
    path = write_study(study_text("[ok]", "[1, 2, 3]", repeats=3,
                                  extra="baseline: {mode: ok, x: 2}\n"))
    res = tunelab("run", path, "--dir", tmp_path / "d", "-q")
    assert res.returncode == 0, res.stderr
    rows = runs(tmp_path / "d")
    assert len(rows) == 9 and all(r["status"] == "ok" for r in rows)
    assert [r["repeat"] for r in rows] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # the seeded shuffle, the baseline (x = 2) too: not forced to open the study
    assert [json.loads(r["key"])["x"] for r in rows[:3]] == [1, 3, 2]
    frame = open_store(tmp_path / "d").runs_frame()
    assert (frame["fom.value"] == frame["x"] * 2).all()
    assert (frame["fom.wall_s"] > 0).all()
    assert (tmp_path / "d" / rows[0]["run_dir"] / "stdout.txt").read_text().startswith("progress")
    # the same command again: nothing to do, nothing repeated
    again = tunelab("run", path, "--dir", tmp_path / "d", "-q")
    assert again.returncode == 0 and "0 runs now, 9 done before" in again.stderr
    # more repeats: only the new round runs, the old ones stay as they were
    more = tunelab("run", path, "--dir", tmp_path / "d", "-q", "--repeats", "4")
    assert more.returncode == 0 and "3 runs now, 9 done before" in more.stderr
    assert [r["id"] for r in runs(tmp_path / "d")][:9] == [r["id"] for r in rows]


def test_plan_interleaves_rounds_and_is_seeded():
    pts = [Point({"x": i}) for i in range(5)]
    plan = plan_runs(pts, 3, seed=7)
    assert [r for _, r in plan] == [0] * 5 + [1] * 5 + [2] * 5
    assert plan == plan_runs(pts, 3, seed=7)
    assert plan_runs(pts, 4, seed=7)[:15] == plan


def test_a_slow_first_run_does_not_tilt_a_study_of_equal_points():
    """Field test: the study's first run is often slower (a file read cold from disk ran
    1.2-2.5x its warm time here). The baseline always ran first, so that cost tilted every
    comparison with it the same way: 21 equal points, 3 rounds, 2 % noise, a first run
    10 % slower gave a false verdict in 40 of 200 studies (simulated). Now the baseline is shuffled
    like the others (the order itself: the test above) and the first run's cost lands on
    one random point."""
    from tunelab.stats import Verdict, compare_to_baseline

    rng = np.random.default_rng(5)
    pts = [Point({"p": i}) for i in range(21)]
    studies, false = 120, 0
    for seed in range(studies):
        plan = plan_runs(pts, 3, seed=seed)
        values = {run: math.exp(rng.normal(0, 0.02)) for run in plan}
        values[plan[0]] *= 1.10
        frame = pd.DataFrame({"point": [p.key for p, _ in plan], "status": "ok",
                              "repeat": [r for _, r in plan],
                              "fom.wall_s": [values[run] for run in plan]})
        out = compare_to_baseline(frame, "wall_s", "minimize", pts[0].key)
        false += any(pc.comparison.verdict in (Verdict.BETTER, Verdict.WORSE)
                     for pc in out if not pc.is_baseline)
    assert false / studies <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / studies)


def test_crash_timeout_and_garbage_are_recorded_failures(write_study, tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    path = write_study(study_text("[ok, crash, hang, garbage]", "[1]", repeats=1, timeout=2))
    env = {**os.environ, "PIDFILE": str(pidfile)}
    res = subprocess.run([PY, "-m", "tunelab", "run", str(path), "--dir", str(tmp_path / "d"),
                          "-q"], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 1, res.stderr
    by_mode = {json.loads(r["key"])["mode"]: r for r in runs(tmp_path / "d")}
    assert by_mode["ok"]["status"] == "ok"
    assert by_mode["crash"]["status"] == "failed" and by_mode["crash"]["rc"] == 3
    assert "exit code 3" in by_mode["crash"]["reason"]
    assert "something broke badly" in by_mode["crash"]["reason"]
    assert by_mode["hang"]["status"] == "timeout" and by_mode["hang"]["rc"] is None
    assert 2 <= by_mode["hang"]["wall_s"] < 30
    grandchild = int(pidfile.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{grandchild}").exists() or \
        "zombie" in Path(f"/proc/{grandchild}/status").read_text().lower()
    assert by_mode["garbage"]["status"] == "failed"
    assert "unparsable output: FOM 'value': no match" in by_mode["garbage"]["reason"]
    status = tunelab("status", tmp_path / "d")
    assert "4/4 runs done" in status.stdout and "timeout" in status.stdout


def test_json_line_foms_and_env_sets(write_study, tmp_path):
    path = write_study(f"""\
name: j
workload:
  name: command
  options:
    argv: [{PY}, {PROG}, "{{mode}}", "3"]
    json_line: true
parameters:
  mode: [json, env]
env:
  none: {{}}
  some: {{TUNELAB_TEST_VAR: abcd}}
repeats: 1
objective: {{fom: wall_s}}
""")
    study = prepare_study(load_study(path))
    study.workload.options = study.workload.options.model_copy(update={"json_line": False,
                                                                       "foms": {}})
    assert tunelab("run", path, "--dir", tmp_path / "d", "-q").returncode == 1  # env mode
    frame = open_store(tmp_path / "d").runs_frame()
    json_runs = frame[frame["mode"] == "json"]
    assert (json_runs["fom.score"] == 30).all() and (json_runs["status"] == "ok").all()
    env_runs = frame[frame["mode"] == "env"]
    assert (env_runs["status"] == "failed").all()  # prints no JSON line
    assert set(frame["env"]) == {"none", "some"}


def test_env_set_reaches_the_command(write_study, tmp_path):
    path = write_study(study_text("[env]", "[1]", repeats=1,
                                  extra="env:\n  none: {}\n  some: {TUNELAB_TEST_VAR: abcd}\n"))
    assert tunelab("run", path, "--dir", tmp_path / "d", "-q").returncode == 0
    frame = open_store(tmp_path / "d").runs_frame().set_index("env")
    assert frame.loc["none", "fom.value"] == 0 and frame.loc["some", "fom.value"] == 4


def wait_for_runs(db: Path, n: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if db.exists():
            try:
                conn = sqlite3.connect(db)
                count = conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
                conn.close()
                if count >= n:
                    return
            except sqlite3.OperationalError:
                pass
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} runs after {timeout} s")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_study_resumes_without_losing_or_repeating_runs(write_study, tmp_path, sig):
    path = write_study(study_text("[slow]", "[1, 2, 3, 4]", repeats=2))
    d = tmp_path / "d"
    proc = subprocess.Popen([PY, "-m", "tunelab", "run", str(path), "--dir", str(d), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    wait_for_runs(d / "tunelab.db", 3)
    if sig == signal.SIGKILL:
        os.killpg(proc.pid, signal.SIGKILL)  # tunelab and the run in flight
    else:
        os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends
    _, err = proc.communicate(timeout=60)
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "Run the same command again to resume" in err
        lines = [line for line in err.strip().splitlines()
                 if "the machine is busy" not in line]  # the noise watch's note at start
        assert len(lines) == 1, err  # no traceback, whatever it hit
    before = runs(d)
    assert 3 <= len(before) < 8
    conn = sqlite3.connect(d / "tunelab.db")
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    res = tunelab("run", path, "--dir", d, "-q")
    assert res.returncode == 0, res.stderr
    after = runs(d)
    assert len(after) == 8
    assert len({(r["key"], r["repeat"]) for r in after}) == 8
    assert [(r["id"], r["key"], r["repeat"]) for r in after[:len(before)]] == \
        [(r["id"], r["key"], r["repeat"]) for r in before]
    # the resumed runs are a second session's; a round cut in two is not paired across it
    frame = load_results(d).runs
    assert frame["session"].tolist() == [1] * len(before) + [2] * (8 - len(before))
    split = [len(before) // 4] if len(before) % 4 else []
    assert [b.round for b in load_results(d).unpaired] == split


def test_second_run_on_the_same_directory_is_refused(write_study, tmp_path):
    path = write_study(study_text("[slow]", "[1, 2, 3]", repeats=2))
    d = tmp_path / "d"
    first = subprocess.Popen([PY, "-m", "tunelab", "run", str(path), "--dir", str(d), "-q"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env={**os.environ, "SLOW_S": "3"})  # outlasts a slow start-up
    try:
        wait_for_runs(d / "tunelab.db", 1)
        second = tunelab("run", path, "--dir", d, "-q")
        assert second.returncode == 2
        assert f"another tunelab run (pid {first.pid})" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
    finally:
        first.wait(timeout=60)
    assert first.returncode == 0
    assert len(runs(d)) == 6


def test_a_changed_study_file_is_refused_in_the_same_directory(write_study, tmp_path):
    d = tmp_path / "d"
    assert tunelab("run", write_study(study_text("[ok]", "[1]", 1)), "--dir", d,
                   "-q").returncode == 0
    res = tunelab("run", write_study(study_text("[ok]", "[1, 2]", 1)), "--dir", d, "-q")
    assert res.returncode == 2 and "made from a different study file" in res.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (study_text("[ok]").replace("name: command", "name: nosuch"),
         "unknown workload 'nosuch'; installed workloads: command"),
        (study_text("[ok]").replace(PY, "/no/such/program"),
         "executable '/no/such/program' not found"),
        (study_text("[ok]", extra="constraints: ['x > 100']\n"),
         "no valid point: all 2 combinations are excluded ('x > 100' excluded 2)"),
        (study_text("[ok]", extra="constraints: ['y > 1']\n"), "unknown name 'y'"),
        (study_text("[ok]", extra="baseline: {mode: ok, x: 7}\n"),
         "the baseline is not a valid point: x=7 is not one of [1, 2]"),
        (study_text("[ok]", extra="derived: {cores: 'x * 2'}\n"),
         "derived value 'cores' has the name of a constant of the study (cores, "
         "cores_per_node), which the constraints and the workload's rules read: name it "
         "otherwise"),
        (study_text("[ok]").replace("    foms:", "    colour: red\n    foms:"),
         "workload 'command' option 'colour': Extra inputs are not permitted"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(write_study, tmp_path, text, message):
    res = tunelab("run", write_study(text), "--dir", tmp_path / "d")
    assert res.returncode == 2
    assert message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "d" / "tunelab.db").exists()


def test_a_run_strategy_study_has_every_run_watched_for_noise(write_study, tmp_path):
    """A strategy that decides the runs (racing) goes through the same noise watch as a
    fixed plan: every run has its noise sample."""
    path = write_study(study_text("[ok]", "[1, 2, 3]", extra=(
        "baseline: {mode: ok, x: 1}\nsearch: {strategy: racing, max_runs: 6}\n")))
    assert tunelab("run", path, "--dir", tmp_path / "d", "-q").returncode == 0
    with open_store(tmp_path / "d") as store:
        frame = store.runs_frame()
    assert len(frame) == 6 and frame["noise.load_before"].notna().all()


def test_dry_run_prints_commands_and_runs_nothing(write_study, tmp_path):
    res = tunelab("run", write_study(study_text("[ok]")), "--dir", tmp_path / "d", "--dry-run")
    assert res.returncode == 0
    assert f"{PROG} ok 1" in res.stdout and f"{PROG} ok 2" in res.stdout
    assert "2 points x 2 repeats = 4 runs" in res.stderr
    assert len(res.stdout.splitlines()) == 2  # one line per point, nothing else
    assert not (tmp_path / "d").exists()


class EnergyWorkload(CommandWorkload):
    """The command workload plus an invariant, as the qe workload has for total energy."""

    def invariants(self) -> dict[str, float]:
        return {"value": 0.5}


def test_invariant_violations_are_invalid_runs(write_study, tmp_path):
    study = prepare_study(load_study(write_study(study_text("[ok]", "[1, 1.2, 3]", 1,
                                                            extra="baseline: {mode: ok, x: 1}\n"))))
    study.workload = EnergyWorkload(study.workload.options, study.spec.path)
    outcome = run_study(study, tmp_path / "d")
    assert outcome.counts == {"ok": 2, "invalid": 1}
    bad = [r for r in runs(tmp_path / "d") if r["status"] == "invalid"][0]
    assert json.loads(bad["key"])["x"] == 3
    assert "value differs by 4 > 0.5 from the study's reference (6.0 vs 2.0)" in bad["reason"]


class UnitWorkload(CommandWorkload):
    """The command workload with a unit on its figure (as merge's throughput in B/s)."""

    fom_units = {"value": "B/s"}


def test_a_figure_s_unit_is_stored_and_shown_beside_the_objective(write_study, tmp_path):
    """merge's throughput read '1.548e+08' in compare, best and the report, in no unit."""
    from tunelab.report.load import stored_units

    study = prepare_study(load_study(write_study(study_text(
        "[ok]", "[1, 2]", extra="baseline: {mode: ok, x: 1}\n"
                                "objective: {fom: value, direction: maximize}\n"))))
    study.workload = UnitWorkload(study.workload.options, study.spec.path)
    run_study(study, tmp_path / "d")
    shown = tunelab("compare", tmp_path / "d")
    assert "value in B/s (maximize) against mode=ok x=1" in shown.stdout
    best = tunelab("best", tmp_path / "d")
    assert re.search(r"Best point: .* mean value [0-9.e+]+ ± \S+ B/s \(n=2", best.stdout)
    doc = json.loads(tunelab("compare", tmp_path / "d", "--format", "json").stdout)
    assert doc["objective"] == {"fom": "value", "direction": "maximize", "unit": "B/s"}
    # a unit is only ever shown: a stored value that is not a mapping of short names is none
    assert stored_units('{"value": "B/s"}') == {"value": "B/s"}
    assert stored_units("[1, 2]") == stored_units("{") == stored_units(None) == {}
    assert stored_units('{"value": "x\\u001b[31m"}') == {}


class OddFirstWorkload(EnergyWorkload):
    """The first run parsed reports a value far from all the others."""

    parsed = 0

    def parse(self, stdout, stderr, run_dir):
        foms = super().parse(stdout, stderr, run_dir)
        self.parsed += 1
        return {**foms, "value": 10.0} if self.parsed == 1 else foms


def test_a_first_run_that_is_the_odd_one_out_is_judged_again_by_the_majority(write_study,
                                                                            tmp_path):
    """The first valid run set the reference for good: when it was the odd one out, it
    stayed ok (and could be 'best') while every later run was invalid."""
    study = prepare_study(load_study(write_study(study_text("[ok]", "[1, 1.05, 1.1, 1.15]", 1))))
    study.workload = OddFirstWorkload(study.workload.options, study.spec.path)
    run_study(study, tmp_path / "d")
    stored = runs(tmp_path / "d")
    assert [r["status"] for r in stored] == ["invalid", "ok", "ok", "ok"]
    assert stored[0]["reason"].startswith("value differs by ")
    assert stored[0]["reason"].endswith(
        "which 2 runs agree on: judged again when they outnumbered the 1 that agreed with "
        "the first valid run's 10.0")
    conn = sqlite3.connect(tmp_path / "d" / "tunelab.db")
    (ref,) = conn.execute("SELECT value FROM meta WHERE key = 'reference.value'").fetchone()
    conn.close()
    assert 2.0 <= float(ref) <= 2.3
    res = tunelab("best", tmp_path / "d")
    assert "excluded: value differs by" in res.stdout  # exit 1: a run did not succeed


def test_a_strategy_decides_on_runs_as_judged_again(write_study, tmp_path, monkeypatch):
    """A racing study whose first run is the odd one out: once the reference moved, that run
    is invalid in the store, but the strategy had been told its value and went on deciding
    with it. It now starts over from the store (as a resumed study does)."""
    from tunelab.execute.study import Study

    made = []
    new_run_strategy = Study.new_run_strategy

    def record(self, started=None):
        made.append(new_run_strategy(self, started))
        return made[-1]

    monkeypatch.setattr(Study, "new_run_strategy", record)
    study = prepare_study(load_study(write_study(study_text(
        "[ok]", "[1, 1.05]", 1,
        extra="baseline: {mode: ok, x: 1}\nsearch: {strategy: racing, max_runs: 6}\n"))))
    study.workload = OddFirstWorkload(study.workload.options, study.spec.path)
    before = len(made)
    run_study(study, tmp_path / "d")
    stored = runs(tmp_path / "d")  # round 1: the odd run, one disagreeing; round 2 moves it
    assert [r["status"] for r in stored][:3] == ["invalid", "ok", "ok"]
    assert len(made) - before == 2  # the strategy started over once the reference moved
    evidence = made[-1].evidence
    for run in stored:  # what the strategy decided on is what the store says
        told = evidence.runs(Point.from_key(run["key"])).get(run["repeat"])
        assert (told is None) == (run["status"] != "ok"), run


class TwoInvariantsWorkload(CommandWorkload):
    """Two figures that must agree across runs; the first run parsed is off in both."""

    parsed = 0

    def invariants(self) -> dict[str, float]:
        return {"value": 0.5, "second": 0.5}

    def parse(self, stdout, stderr, run_dir):
        foms = super().parse(stdout, stderr, run_dir)
        self.parsed += 1
        off = self.parsed == 1
        return {**foms, "value": 10.0 if off else foms["value"],
                "second": 10.0 if off else foms["value"]}


def test_with_two_invariants_the_majority_is_found_and_no_reason_is_stale(write_study,
                                                                          tmp_path):
    """A run invalid for both invariants did not vote, so a first run off in both kept the
    references for good (it stayed ok, every later run invalid); a reason named an
    invariant the run agreed with once a reference had moved."""
    study = prepare_study(load_study(write_study(study_text("[ok]", "[1, 1.05, 1.1, 1.15]", 1))))
    study.workload = TwoInvariantsWorkload(study.workload.options, study.spec.path)
    run_study(study, tmp_path / "d")
    stored = runs(tmp_path / "d")
    assert [r["status"] for r in stored] == ["invalid", "ok", "ok", "ok"]
    parts = stored[0]["reason"].split("; ")
    assert [p.split(" ")[0] for p in parts] == ["value", "second"]
    assert all(r["reason"] is None for r in stored[1:])


class RelabelWorkload(EnergyWorkload):
    """A program that reports having run x=1 when asked for x=3 (as pw.x reports the
    OpenMP threads, pools or diagonalisation group it really used)."""

    def configuration_problem(self, values, foms):
        return "the program ran x=1, not x=3" if values["x"] == 3 else None


def test_a_run_of_another_configuration_is_invalid_and_sets_no_reference(write_study,
                                                                          tmp_path):
    study = prepare_study(load_study(write_study(study_text("[ok]", "[3, 1, 1.2]", 1))))
    study.workload = RelabelWorkload(study.workload.options, study.spec.path)
    outcome = run_study(study, tmp_path / "d")
    assert outcome.counts == {"ok": 2, "invalid": 1}
    bad = [r for r in runs(tmp_path / "d") if r["status"] == "invalid"][0]
    assert json.loads(bad["key"])["x"] == 3
    assert bad["reason"] == "the program ran x=1, not x=3"


class ScratchWorkload(CommandWorkload):
    """A program that leaves scratch data in ``RUN/out`` (as pw.x its outdir); the workload
    names it, and, wrongly, paths outside the run directory."""

    outside: Path

    def command(self, ctx):
        (ctx.run_dir / "out").mkdir()
        (ctx.run_dir / "out" / "wfc1.dat").write_bytes(b"\0" * 1000)
        return super().command(ctx)

    def scratch(self, run_dir):
        return (run_dir / "out", run_dir, run_dir / "..", self.outside)


def test_scratch_the_workload_names_is_deleted_once_the_run_is_recorded(write_study,
                                                                          tmp_path):
    study = prepare_study(load_study(write_study(study_text("[ok, crash]", "[1]", 1))))
    study.workload = ScratchWorkload(study.workload.options, study.spec.path)
    study.workload.outside = tmp_path / "keep"
    study.workload.outside.mkdir()
    outcome = run_study(study, tmp_path / "d")
    assert outcome.counts == {"ok": 1, "failed": 1}
    for run in runs(tmp_path / "d"):
        run_dir = tmp_path / "d" / run["run_dir"]
        assert (run_dir / "stdout.txt").is_file()
        assert not (run_dir / "out").exists()
    assert study.workload.outside.is_dir()


def test_export_formats(write_study, tmp_path):
    d = tmp_path / "d"
    assert tunelab("run", write_study(study_text("[ok]")), "--dir", d, "-q").returncode == 0
    import pandas as pd

    for fmt, reader in (("csv", pd.read_csv), ("parquet", pd.read_parquet)):
        res = tunelab("export", d, "--format", fmt)
        assert res.returncode == 0, res.stderr
        frame = reader(d / f"runs.{fmt}")
        assert len(frame) == 4 and {"x", "fom.value", "status", "host"} <= set(frame.columns)
    assert tunelab("export", d, "--format", "json").returncode == 0
    records = json.loads((d / "runs.json").read_text())
    assert len(records) == 4
    assert all(isinstance(r["point"], dict) and r["point"]["mode"] == "ok" for r in records)
    assert all(r["foms"]["value"] == 2 * r["point"]["x"] for r in records)
    bad = tunelab("export", d, "--format", "xlsx")
    assert bad.returncode == 2 and "valid: csv, parquet, json" in bad.stderr


def test_space_command_reports_exclusions(write_study):
    res = tunelab("space", write_study(study_text("[ok, crash]", "[1, 2, 3, 4]",
                                                  extra="constraints: ['x % 2 == 0']\n")))
    assert res.returncode == 0, res.stderr
    assert "4 valid points of 8 combinations" in res.stdout
    assert "will run 4 points x 2 repeats = 8 runs" in res.stdout
    assert any(line.split()[:2] == ["4", "x"] and "x % 2 == 0" in line
               for line in res.stdout.splitlines())


def test_init_writes_a_study_that_loads(tmp_path):
    out = tmp_path / "s.yaml"
    assert tunelab("init", "command", "--output", out).returncode == 0
    spec = load_study(out)
    assert spec.workload == "command" and spec.objective_fom == "seconds"
    assert tunelab("init", "command", "--output", out).returncode == 2
    assert "unknown workload" in tunelab("init", "nosuch").stderr


def test_workloads_lists_command():
    res = tunelab("workloads")
    assert res.returncode == 0 and "command" in res.stdout


def test_optuna_search_runs_valid_distinct_points_and_resumes(write_study, tmp_path):
    text = study_text("[ok]", "{type: int, min: 1, max: 40}", repeats=1, extra="""\
constraints: ['x % 3 != 0']
baseline: {mode: ok, x: 20}
search: {strategy: optuna, samples: 12, seed: 3}
objective: {fom: value, direction: minimize}
""")
    path = write_study(text)
    study = prepare_study(load_study(path))
    assert study.adaptive and study.points == [Point({"mode": "ok", "x": 20})]
    outcome = run_study(study, tmp_path / "d")
    assert outcome.counts == {"ok": 12} and outcome.planned == 12
    rows = runs(tmp_path / "d")
    xs = [json.loads(r["key"])["x"] for r in rows]
    assert xs[0] == 20 and len(set(xs)) == 12 and all(x % 3 for x in xs)
    # resuming proposes the same points again, so nothing new runs
    again = run_study(prepare_study(load_study(path)), tmp_path / "d")
    assert again.ran == 0 and len(runs(tmp_path / "d")) == 12


def test_usage_errors_exit_2_without_a_traceback(tmp_path):
    res = tunelab("compare", tmp_path, "--no-such-option")
    assert res.returncode == 2 and "No such option: --no-such-option" in res.stderr
    assert "Traceback" not in res.stderr
    missing = tunelab("status", tmp_path / "nothing")
    assert missing.returncode == 2 and "nothing: no such directory" in missing.stderr
    (tmp_path / "a-file").write_text("x")
    a_file = tunelab("best", tmp_path / "a-file")
    assert a_file.returncode == 2 and "a-file: a file, not a study directory" in a_file.stderr
    empty = tunelab("report", tmp_path)
    assert empty.returncode == 2 and "not a tunelab study directory" in empty.stderr


def test_combine_writes_the_follow_up_study_of_the_better_options(write_study, tmp_path):
    path = write_study(study_text(
        "[options]", "[1]", repeats=4, foms="{work_s: 'work_s=(?P<value>[0-9.]+)'}", extra="""\
env:
  baseline: {OPT_A: slow, OPT_B: slow}
  a: {OPT_A: fast}
  b: {OPT_B: fast}
  useless: {OPT_C: fast}
baseline: {mode: options, x: 1, env: baseline}
objective: {fom: work_s}
"""))
    d = tmp_path / "d"
    assert tunelab("run", path, "--dir", d, "-q").returncode == 0
    out = tmp_path / "combined.yaml"
    res = tunelab("combine", d, "-o", out)
    assert res.returncode == 0, res.stderr
    assert "better than the baseline: a, b" in res.stderr.replace("b, a", "a, b")
    assert "left out: useless (indistinguishable)" in res.stderr
    spec = load_study(out)
    assert spec.name == "t-combined"
    assert spec.env_sets["combined"] == {"OPT_A": "fast", "OPT_B": "fast"}
    assert set(spec.env_sets) == {"baseline", "a", "b", "combined"}
    assert tunelab("run", out, "--dir", tmp_path / "d2", "-q", "--repeats", "2").returncode == 0
    frame = open_store(tmp_path / "d2").runs_frame()
    means = frame.groupby("env")["fom.work_s"].mean()
    assert means["combined"] < means["a"] < means["baseline"]


class ThreadsWorkload(CommandWorkload):
    """The command workload setting its runs' threads itself, as leopard, ddp and qe do."""

    def command(self, ctx):
        cmd = super().command(ctx)
        return type(cmd)(argv=cmd.argv, env={**cmd.env, "OMP_NUM_THREADS": "2"}, cwd=cmd.cwd)


def test_a_variable_the_workload_sets_over_the_users_is_said_once(write_study, tmp_path,
                                                                  monkeypatch):
    """``OMP_NUM_THREADS=1 tunelab run examples/leopard-tune.yaml`` ran every run with 2
    threads and said nothing; the run now says once which variable the workload set over
    the shell's (or an env set's) value, and the run's record keeps what it set."""
    study = prepare_study(load_study(write_study(study_text(
        "[ok]", "[1, 2]", repeats=1, extra="env:\n  one: {OMP_NUM_THREADS: '1'}\n"
                                           "  two: {OMP_NUM_THREADS: '2'}\n"))))
    study.workload = ThreadsWorkload(study.workload.options, study.spec.path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    notes: list[str] = []
    assert run_study(study, tmp_path / "d", on_note=notes.append).counts == {"ok": 4}
    said = [n for n in notes if "OMP_NUM_THREADS" in n]
    assert said == ["command: its runs set OMP_NUM_THREADS=2 (the env set's: 1): the workload "
                    "sets these itself (its threads come from the cores a run may use; its "
                    "threads option or parameter chooses them), and each run's record keeps "
                    "what it set"]
    assert {json.loads(r["env"])["OMP_NUM_THREADS"] for r in runs(tmp_path / "d")} == {"2"}


def test_overridden_env_names_the_shells_value_when_no_env_set_gives_one():
    from tunelab.execute.guards import overridden_env

    assert overridden_env({"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}, {},
                          {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "2"}) == \
        ["OMP_NUM_THREADS=2 (this shell's: 1)"]
    assert overridden_env({"OMP_NUM_THREADS": "2"}, {"OMP_NUM_THREADS": "2"},
                          {"OMP_NUM_THREADS": "1"}) == []
