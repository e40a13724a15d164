"""The command line as a script, a pipe and a batch job see it: formats, streams, exit codes,
one-line errors, init templates, two-study comparison. Real studies, real processes."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import PY, tunelab
from tunelab.workloads import available_workloads

PROG = Path(__file__).parent / "data" / "prog.py"


def study(tmp_path: Path, name: str = "s", modes: str = "[ok]", xs: str = "[1, 2, 3]",
          repeats: int = 3, extra: str = "", fom: str = "value") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"""\
name: {name}
workload:
  name: command
  options:
    argv: [{PY}, {PROG}, "{{mode}}", "{{x}}"]
    foms: {{value: 'value=(?P<value>[0-9.]+)'}}
parameters:
  mode: {modes}
  x: {xs}
repeats: {repeats}
timeout: 30
objective: {{fom: {fom}, direction: minimize}}
{extra}""")
    return path


@pytest.fixture(scope="module")
def done_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished study with a baseline (x=3 is the slowest-valued: others are better)."""
    tmp = tmp_path_factory.mktemp("done")
    d = tmp / "d"
    res = tunelab("run", study(tmp, extra="baseline: {mode: ok, x: 3}\n"), "--dir", d, "-q")
    assert res.returncode == 0, res.stderr
    return d


def test_piped_compare_prints_whole_rows_whatever_columns_says(done_study):
    for columns in ("40", "200", None):
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
        if columns:
            env["COLUMNS"] = columns
        res = subprocess.run([PY, "-m", "tunelab", "compare", str(done_study)],
                             capture_output=True, text=True, env=env)
        assert res.returncode == 0, res.stderr
        rows = [line for line in res.stdout.splitlines() if " better " in f"{line} "]
        assert len(rows) == 2  # x=1 and x=2 are better than the baseline x=3
        for row in rows:  # the whole record: point, mean ± sd, speedup, interval, p, verdict
            assert "±" in row and "×" in row and "[" in row and "]" in row
        assert all(line == line.rstrip() for line in res.stdout.splitlines())
        assert "\x1b[" not in res.stdout


def test_compare_json_has_the_documented_schema(done_study):
    res = tunelab("compare", done_study, "--format", "json")
    doc = json.loads(res.stdout)
    assert doc["schema"] == "tunelab.compare" and doc["version"] == 2
    assert doc["objective"] == {"fom": "value", "direction": "minimize", "unit": None}
    assert doc["baseline"] == {"mode": "ok", "x": 3}
    by_x = {p["point"]["x"]: p for p in doc["points"]}
    assert by_x[3]["is_baseline"] and by_x[3]["verdict"] == "baseline"
    one = by_x[1]
    for key in ("n", "mean", "sd", "median", "speedup", "ci_low", "ci_high", "p", "p_raw",
                "test", "adjustment", "detectable", "verdict", "failures", "disturbed"):
        assert key in one
    assert one["n"] == 3 and one["mean"] == pytest.approx(2.0)
    assert one["speedup"] == pytest.approx(3.0) and one["verdict"] == "better"
    assert one["ci_low"] <= 3.0 <= one["ci_high"]


def test_compare_csv_and_markdown(done_study):
    rows = list(csv.DictReader(io.StringIO(tunelab("compare", done_study, "--format",
                                                   "csv").stdout)))
    assert len(rows) == 3 and {"x", "mode", "speedup", "verdict"} <= set(rows[0])
    md = tunelab("compare", done_study, "--format", "markdown").stdout
    assert md.count("\n| ") >= 4 and "|---:|" in md


def test_best_status_space_workloads_speak_json(done_study, tmp_path):
    best = json.loads(tunelab("best", done_study, "--format", "json").stdout)
    assert best["schema"] == "tunelab.best" and best["best"]["point"] == {"mode": "ok", "x": 1}
    status = json.loads(tunelab("status", done_study, "--format", "json").stdout)
    assert status["done"] == status["planned"] == 9 and status["counts"] == {"ok": 9}
    space = json.loads(tunelab("space", study(tmp_path), "--format", "json").stdout)
    assert space["valid"] == 3 and space["plan"]["runs"] == 9
    names = [w["name"] for w in json.loads(tunelab("workloads", "--format",
                                                   "json").stdout)["workloads"]]
    assert {"command", "qe", "merge", "leopard"} <= set(names)


def test_export_to_stdout_is_valid_json_with_points_as_objects(done_study):
    res = tunelab("export", done_study, "-f", "json", "-o", "-")
    records = json.loads(res.stdout)
    assert len(records) == 9 and records[0]["point"]["mode"] == "ok"
    assert "9 runs written to standard output" in res.stderr
    assert not (Path("-")).exists()


def test_status_does_not_load_the_statistics(done_study):
    """`status` (polled by scripts while a study runs) imported scipy, pandas and the
    runner through the verdict styles and the batch-job collector: 1.1-1.2 s a call on a
    20,000-run study, 0.5-0.8 s without them."""
    code = ("import sys; from tunelab.cli import app\n"
            "try:\n    app(['status', sys.argv[1], '--format', 'json'])\n"
            "except SystemExit:\n    pass\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'scipy', 'pandas', 'matplotlib', 'numpy'}), file=sys.stderr)")
    res = subprocess.run([PY, "-c", code, str(done_study)], capture_output=True, text=True)
    assert json.loads(res.stdout)["done"] == 9
    assert res.stderr.strip().splitlines()[-1] == "[]"


def test_readers_say_a_study_is_not_finished(done_study, tmp_path):
    """compare, best and report of a study a `tunelab run` is still adding runs to (or that
    stopped) said nothing of it: a ranking of 945 of 6,400 runs read as the study's."""
    import shutil
    import sqlite3

    half = tmp_path / "half"
    shutil.copytree(done_study, half)
    with sqlite3.connect(half / "tunelab.db") as conn:
        last = [r for (r,) in conn.execute("SELECT id FROM runs ORDER BY id DESC LIMIT 2")]
        for table, column in (("foms", "run_id"), ("noise", "run_id"), ("runs", "id")):
            conn.executemany(f"DELETE FROM {table} WHERE {column} = ?", [(r,) for r in last])
    line = "The study is not finished: 7 of its 9 planned runs are stored"
    doc = json.loads(tunelab("compare", half, "--format", "json").stdout)
    assert doc["notes"][0].startswith(line)
    assert line in tunelab("compare", half).stdout
    assert line in tunelab("best", half).stdout
    assert line in json.loads(tunelab("best", half, "--format", "json").stdout)["notes"][0]
    assert tunelab("report", half).returncode == 0
    assert line in (half / "report.html").read_text()
    finished = json.loads(tunelab("compare", done_study, "--format", "json").stdout)
    assert not any("not finished" in note for note in finished["notes"])


def test_compare_two_studies_judges_common_points_and_lists_the_rest(done_study, tmp_path):
    other = tmp_path / "b"
    assert tunelab("run", study(tmp_path, "b", xs="[1, 2, 4]"), "--dir", other,
                   "-q").returncode == 0
    text = tunelab("compare", done_study, other)
    assert text.returncode == 0, text.stderr
    assert "only in 's' (A)" in text.stdout and "only in 'b' (B)" in text.stdout
    doc = json.loads(tunelab("compare", other, "--baseline-study", done_study, "--format",
                             "json").stdout)
    assert doc["schema"] == "tunelab.compare-studies"
    assert sorted(p["point"]["x"] for p in doc["points"]) == [1, 2]
    # the same program on the same inputs: indistinguishable, never a verdict from noise
    assert all(p["verdict"] == "indistinguishable" for p in doc["points"])
    assert [p["point"]["x"] for p in doc["only_a"]] == [3]
    assert [p["point"]["x"] for p in doc["only_b"]] == [4]
    report = tunelab("report", other, "--baseline-study", done_study)
    assert report.returncode == 0, report.stderr
    html = Path(report.stdout.strip()).read_text()
    assert "Against study &#39;s&#39;" in html or "Against study 's'" in html


def test_compare_refuses_studies_with_different_objectives(done_study, tmp_path):
    other = tmp_path / "w"
    assert tunelab("run", study(tmp_path, "w", fom="wall_s", repeats=1), "--dir", other,
                   "-q").returncode == 0
    res = tunelab("compare", done_study, other)
    assert res.returncode == 2 and "figure of merit or its direction differ" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_status_says_what_the_infrastructure_lost_though_every_run_ended_ok(tmp_path):
    """Attempts a node failure or a cancellation lost were run again and every run is ok:
    ``status`` still says they happened (a study that hides a failed node hides a fact about
    its cluster), in text and JSON, and they count nowhere as results."""
    from tunelab.store import open_store

    d = tmp_path / "d"
    assert tunelab("run", study(tmp_path, xs="[1, 2]", repeats=1), "--dir", d,
                   "-q").returncode == 0
    assert "infrastructure" not in tunelab("status", d).stdout
    with open_store(d, write=True) as store:
        for state, node in (("NODE_FAIL", "node1,node2"), ("CANCELLED", None)):
            store.record_attempt('{"mode": "ok", "x": 2}', {"mode": "ok", "x": 2}, 0, job="7",
                                 state=state, node=node, reason=f"scheduler: {state}", at="t")
    text = tunelab("status", d)
    assert text.returncode == 0, text.stderr
    assert "2/2 runs done (2 ok)" in text.stdout
    assert "the infrastructure lost 2 attempts (CANCELLED, NODE_FAIL)" in text.stdout
    assert "never counts as a result" in text.stdout
    row = next(line for line in text.stdout.splitlines() if line.startswith("NODE_FAIL"))
    assert "mode=ok x=2" in row and "node1,node2" in row and "scheduler: NODE_FAIL" in row
    doc = json.loads(tunelab("status", d, "--format", "json").stdout)
    assert doc["counts"] == {"ok": 2} and doc["lost_attempts"]["total"] == 2
    assert [a["state"] for a in doc["lost_attempts"]["latest"]] == ["CANCELLED", "NODE_FAIL"]


def test_every_run_failed_is_exit_1_everywhere_and_report_still_writes(tmp_path):
    d = tmp_path / "d"
    res = tunelab("run", study(tmp_path, modes="[crash]", repeats=1), "--dir", d)
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr and "failed" in res.stderr
    for command in ("status", "compare", "best"):
        read = tunelab(command, d)
        assert read.returncode == 1, (command, read.stderr)
        assert "Traceback" not in read.stderr
    report = tunelab("report", d)
    assert report.returncode == 1 and (d / "report.html").is_file()
    assert "something broke badly" in (d / "report.html").read_text()


def test_run_logs_a_line_per_finished_run_while_it_runs(tmp_path):
    path = study(tmp_path, modes="[slow]", xs="[1, 2]", repeats=2)
    log = tmp_path / "log"
    with log.open("w") as out:  # like `tunelab run study.yaml > log 2>&1 &`
        proc = subprocess.Popen([PY, "-m", "tunelab", "run", str(path), "--dir",
                                 str(tmp_path / "d")], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "SLOW_S": "1.0"})
        try:
            deadline = time.monotonic() + 60
            while "[1/4]" not in log.read_text() and time.monotonic() < deadline:
                assert proc.poll() is None, log.read_text()
                time.sleep(0.1)
            assert proc.poll() is None, "the first run's line must appear before the end"
        finally:
            proc.wait(timeout=120)
    lines = log.read_text().splitlines()
    progress = [ln for ln in lines if ln.startswith("[")]
    assert len(progress) == 4 and all(" ok " in ln and ln.endswith(tuple("0123456789"))
                                      or "value=" in ln for ln in progress)
    assert progress[-1].startswith("[4/4] ")


def test_malformed_input_to_every_command_is_one_line_and_exit_2(tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("name: [unclosed\n")
    brace = tmp_path / "brace.yaml"
    brace.write_text('name: b\nworkload: {name: command, options: {argv: [echo, "{level"]}}\n'
                     "parameters: {level: [1]}\n")
    nowhere = tmp_path / "no-such-dir"
    cases = [
        ("run", bad_yaml), ("run", bad_yaml, "--dry-run"), ("space", bad_yaml),
        ("space", brace), ("run", brace, "--dry-run"), ("status", nowhere),
        ("compare", nowhere), ("compare", nowhere, nowhere, nowhere), ("best", nowhere),
        ("report", nowhere), ("export", nowhere), ("script", nowhere, "-s", "pbs"),
        ("combine", nowhere, "-o", tmp_path / "c.yaml"), ("init", "nosuchworkload"),
        ("compare", tmp_path, "--format", "yaml"), ("run", bad_yaml, "--bogus-flag"),
        ("workloads", "--format", "xml"), ("run", tmp_path / "missing.yaml"),
    ]
    for args in cases:
        res = tunelab(*args)
        assert res.returncode == 2, (args, res.returncode, res.stderr)
        assert "Traceback" not in res.stderr, args
        lines = res.stderr.strip().splitlines()  # click's four-line usage box too
        assert len(lines) == 1 and lines[0].startswith("tunelab: error: "), (args, res.stderr)
    assert "invalid value 'yaml' for --format" in tunelab(
        "compare", tmp_path, "--format", "yaml").stderr
    brace_error = tunelab("space", brace).stderr
    assert "brace.yaml:2" in brace_error and "{{" in brace_error


@pytest.mark.parametrize("workload", sorted(available_workloads()))
def test_init_writes_a_study_that_space_and_dry_run_accept(workload, tmp_path):
    env = {**os.environ, "TUNELAB_CACHE": str(tmp_path / "cache")}

    def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PY, "-m", "tunelab", *map(str, args)], capture_output=True,
                              text=True, cwd=tmp_path, env=env, timeout=120)

    made = cli("init", workload)
    assert made.returncode == 0, made.stderr
    path = tmp_path / f"{workload}-study.yaml"
    assert f"tunelab space {path.name}" in path.read_text()  # names the file it is
    assert cli("space", path).returncode == 0
    dry = cli("run", path, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.count("\n") >= 1 and "tunelab-dry-" not in dry.stdout
    # --dry-run has no side effects: no study directory, no generated data
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()
    again = cli("init", workload)
    assert again.returncode == 2 and "--force" in again.stderr


def test_version_short_help_and_flags_shown_as_flags():
    assert tunelab("--version").stdout.startswith("tunelab ")
    short = tunelab("run", "-h")
    assert short.returncode == 0 and "--dry-run" in short.stdout
    assert "<bool>" not in short.stdout


def test_a_derived_value_that_cannot_be_computed_is_said_by_space_and_run(tmp_path):
    path = study(tmp_path, extra="derived:\n  lim: \"1 if x < 3 else None\"\n")
    space = json.loads(tunelab("space", path, "--format", "json").stdout)
    assert space["valid"] == 2
    (excluded,) = space["excluded"]
    assert excluded["constraint"] == "lim" and excluded["count"] == 1
    assert "gives None" in excluded["why"] and excluded["why"].endswith("(first at mode='ok', x=3)")
    dry = tunelab("run", path, "--dry-run")
    assert dry.returncode == 0
    (note,) = [line for line in dry.stderr.splitlines() if "left out" in line]
    assert note.startswith(f"{path}:") and "derived value 'lim' cannot be computed" in note
    assert note.endswith(f": 1 of 3 combinations are left out where {excluded['why']}; "
                         f"'tunelab space {path}' lists them")


STEPS = """\
import sys
n, k = (int(a) for a in sys.argv[1:])
compute, grad = 0.17, 1.0e8
ring = 2 * (n - 1) / n * grad * (1 / 0.6e9 if k == 1 else 1 / 0.11e9)
step = (compute + 0.01 + ring) * (1 + 0.01 * ((7 * n + 3 * k) % 5 - 2))
print(f"step_s={step} compute_s={compute} grad_bytes={grad} throughput={64 * n / step}")
"""


def test_forecast_gives_the_model_s_throughput_or_why_not(tmp_path):
    """The scaling model's forecasts were shown only in the HTML report: a user could not
    ask for one from the command line, nor as JSON."""
    program = tmp_path / "steps.py"
    program.write_text(STEPS)
    foms = "\n".join(f"      {f}: '{f}=(?P<value>[0-9.eE+-]+)'"
                     for f in ("step_s", "compute_s", "grad_bytes", "throughput"))
    path = tmp_path / "scale.yaml"
    path.write_text(f"""\
name: scale
workload:
  name: command
  options:
    argv: [{PY}, {program}, "{{workers}}", "{{nodes}}"]
    foms:
{foms}
parameters:
  workers: [1, 2, 4]
  nodes: [1, 2]
constraints: ["workers % nodes == 0"]
repeats: 2
timeout: 30
objective: {{fom: throughput, direction: maximize}}
""")
    assert tunelab("run", path, "--dir", tmp_path / "d", "-q").returncode == 0
    res = tunelab("forecast", tmp_path / "d", "-n", "4,8,64", "--nodes", "1,2", "--format",
                  "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["schema"] == "tunelab.forecast" and doc["model"]["fitted_on"] == [
        [1, 1], [2, 1], [2, 2], [4, 1], [4, 2]]
    by = {(f["workers"], f["nodes"]): f for f in doc["forecasts"]}
    assert set(by) == {(4, 1), (8, 1), (64, 1), (4, 2), (8, 2), (64, 2)}
    assert by[(4, 1)]["measured"] and by[(4, 1)]["factor"] == 1.0
    assert by[(8, 2)]["throughput"] and "extrapolated 2.0x" in by[(8, 2)]["note"]
    assert "extrapolated 16.0x" in by[(64, 1)]["note"]
    assert "no check reached further than 2x" in by[(64, 1)]["note"]
    text = tunelab("forecast", tmp_path / "d", "-n", "8")
    assert text.returncode == 0 and "scaling model of study 'scale'" in text.stdout
    bad = tunelab("forecast", tmp_path / "d", "-n", "eight")
    assert bad.returncode == 2 and bad.stderr.startswith("tunelab: error: --workers: expected")


def test_forecast_of_a_study_without_the_model_s_figures_says_so(done_study):
    res = tunelab("forecast", done_study, "-n", "8")
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "no scaling model:" in res.stderr
