"""``tunelab export``'s Parquet table: every valid study's runs can be written."""

from __future__ import annotations

import io

import pandas as pd
import pytest

from tunelab.report.export import parquet_frame


@pytest.mark.parametrize(("values", "text"), [
    ([1, "fast", None], ["1", "fast", None]),          # a parameter of mixed types
    ([99999999999999999999999999, 2], ["99999999999999999999999999", "2"]),  # beyond int64
    ([0, True], ["0", "True"]),                          # an integer and a boolean
    ([1.5, "x", float("nan")], ["1.5", "x", None]),
])
def test_a_column_parquet_cannot_type_is_written_as_strings(values, text):
    frame = pd.DataFrame({"x": pd.Series(values, dtype=object), "fom.v": [1.0] * len(values)})
    buffer = io.BytesIO()
    parquet_frame(frame).to_parquet(buffer, index=False)
    back = pd.read_parquet(io.BytesIO(buffer.getvalue()))
    assert [None if v is None or v != v else v for v in back["x"]] == text
    assert back["fom.v"].tolist() == [1.0] * len(values)  # other columns keep their type


def test_columns_of_one_type_keep_it():
    frame = pd.DataFrame({"n": pd.Series([1, 2**62], dtype=object),
                          "s": pd.Series(["a", None], dtype=object)})
    buffer = io.BytesIO()
    parquet_frame(frame).to_parquet(buffer, index=False)
    back = pd.read_parquet(io.BytesIO(buffer.getvalue()))
    assert back["n"].tolist() == [1, 2**62] and back["s"].tolist()[0] == "a"


@pytest.mark.parametrize("runs", [0, 1, 3])
def test_the_json_export_is_written_run_by_run_as_the_whole_list_would_be(
        runs: int, tmp_path, capsys) -> None:
    """JSON is written one run at a time (20,000 runs took 367 MB as one string), byte for
    byte what ``json.dumps`` of the whole list writes: reasons with newlines, quotes and
    non-ASCII text, missing figures, to a file and to standard output."""
    import json

    from tunelab.report.export import _write_json_runs, run_records

    frame = pd.DataFrame({
        "run_id": list(range(1, runs + 1)), "point": ['{"x": 1, "s": "a\\nb"}'] * runs,
        "repeat": list(range(runs)), "status": ["ok", "failed", "ok"][:runs],
        "reason": [None, 'line one\nline "two" é', None][:runs],
        "fom.t": [1.5, float("nan"), 2.0][:runs]})
    whole = json.dumps(run_records(frame), indent=1, ensure_ascii=False, allow_nan=False) + "\n"
    _write_json_runs(tmp_path / "runs.json", frame)
    assert (tmp_path / "runs.json").read_text() == whole
    _write_json_runs(None, frame)
    assert capsys.readouterr().out == whole
    assert len(json.loads(whole)) == runs


def _export(directory, fmt: str):
    """``tunelab export DIR -f FMT`` (the real command line, in this process): the path."""
    from typer.testing import CliRunner

    from tunelab.cli import app

    result = CliRunner().invoke(app, ["export", str(directory), "-f", fmt])
    assert result.exit_code == 0, result.output
    return directory / f"runs.{fmt}"


def test_the_export_has_each_run_s_environment(write_study, tmp_path) -> None:
    """A run's environment (the workload's OMP_NUM_THREADS, the env set's UCX_TLS) was in
    the store but in no export: CSV had no column for it, JSON no key."""
    import csv
    import json
    import shutil

    from tunelab.execute.runner import run_study
    from tunelab.execute.study import prepare_study
    from tunelab.spec import load_study

    study = write_study(f"""
        name: envs
        workload:
          name: command
          options:
            argv: [{shutil.which("echo")}, "t=1"]
            foms: {{t: 't=(?P<t>[0-9]+)'}}
            env: {{OMP_NUM_THREADS: "2"}}
        parameters:
          run_env: [p]
        env:
          tcp: {{UCX_TLS: "tcp,self"}}
          shm: {{UCX_TLS: 'sm "quoted", é'}}
        repeats: 1
        """)
    assert run_study(prepare_study(load_study(study)), tmp_path / "d").counts == {"ok": 2}
    with _export(tmp_path / "d", "csv").open(newline="") as text:
        rows = list(csv.DictReader(text))
    header = list(rows[0])
    assert header[header.index("host") + 1] == "run_env"
    by_set = {r["env"]: json.loads(r["run_env"]) for r in rows}  # env: the env set's name
    assert by_set == {"tcp": {"OMP_NUM_THREADS": "2", "UCX_TLS": "tcp,self"},
                      "shm": {"OMP_NUM_THREADS": "2", "UCX_TLS": 'sm "quoted", é'}}
    assert {r["param.run_env"] for r in rows} == {"p"}  # a parameter of that name kept
    runs = json.loads(_export(tmp_path / "d", "json").read_text())
    assert {r["point"]["env"]: r["env"]["UCX_TLS"] for r in runs} == {
        "tcp": "tcp,self", "shm": 'sm "quoted", é'}
    back = pd.read_parquet(_export(tmp_path / "d", "parquet"))
    assert json.loads(back["run_env"][0])["OMP_NUM_THREADS"] == "2"


def test_a_parameter_named_host_reaches_every_reader(write_study, tmp_path) -> None:
    """A parameter named like a run column (``host``) was dropped from the runs table: the
    export's ``host`` column held the machine and the parameter was only inside ``point``.
    Now the export has it as ``param.host``; compare, best and report label and rank the
    points ``host=1`` and ``host=2`` apart."""
    import csv
    import json
    import shutil

    from typer.testing import CliRunner

    from tunelab.cli import app
    from tunelab.execute.runner import run_study
    from tunelab.execute.study import prepare_study
    from tunelab.spec import load_study

    study = write_study(f"""
        name: hosts
        workload:
          name: command
          options:
            argv: [{shutil.which("echo")}, "value={{host}}"]
            foms: {{value: 'value=(?P<value>[0-9]+)'}}
        parameters:
          host: [1, 2]
        repeats: 2
        baseline: {{host: 1}}
        objective: {{fom: value, direction: minimize}}
        """)
    directory = tmp_path / "d"
    assert run_study(prepare_study(load_study(study)), directory).counts == {"ok": 4}
    with _export(directory, "csv").open(newline="") as text:
        rows = list(csv.DictReader(text))
    assert {(r["param.host"], r["fom.value"]) for r in rows} == {("1", "1.0"), ("2", "2.0")}
    assert {r["host"] for r in rows} != {"1", "2"}  # the machine's name, not the parameter
    back = pd.read_parquet(_export(directory, "parquet"))
    assert sorted(back["param.host"]) == [1, 1, 2, 2]
    runner = CliRunner()
    compared = runner.invoke(app, ["compare", str(directory), "--format", "json"])
    assert compared.exit_code == 0, compared.output
    assert [(p["label"], p["verdict"]) for p in json.loads(compared.output)["points"]] == [
        ("host=1", "baseline"), ("host=2", "worse")]
    best = runner.invoke(app, ["best", str(directory), "--format", "json"])
    assert best.exit_code == 0, best.output
    doc = json.loads(best.output)
    assert (doc["best"]["point"], doc["runner_up"]["point"]) == ({"host": 1}, {"host": 2})
    report = runner.invoke(app, ["report", str(directory), "-o", str(tmp_path / "r.html")])
    assert report.exit_code == 0, report.output
    html = (tmp_path / "r.html").read_text()
    assert "host=1" in html and "host=2" in html
