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
