"""The store's runs table (:meth:`Store.runs_frame <tunelab.store.Store.runs_frame>`)."""

from __future__ import annotations

import json
from pathlib import Path

from tunelab.store import RunRecord, open_store


def _run(params: dict[str, object], repeat: int, value: float) -> RunRecord:
    return RunRecord(point_key=json.dumps(params, sort_keys=True), params=params, repeat=repeat,
                     status="ok", reason=None, rc=0, wall_s=0.5, started_at="t", ended_at="t",
                     host="node7", command=[], env={}, run_dir="r", foms={"value": value})


def test_a_parameter_named_like_a_run_column_is_kept_as_param_name(tmp_path: Path):
    """A parameter ``host`` (``repeat``, ``status``, ``point``, …) was dropped from the
    table: every reader of it (export, compare, best, report) lost the parameter."""
    with open_store(tmp_path, create=True) as store:
        for i, host in enumerate((1, 2)):
            params = {"host": host, "repeat": 10 + i, "status": "s", "point": "p",
                      "run_id": 99, "rc": 3, "reason": "why", "wall_s": "w", "x": i}
            store.record_run(_run(params, repeat=0, value=float(host)))
        frame = store.runs_frame()
    assert frame["host"].tolist() == ["node7", "node7"]  # the run's columns keep their meaning
    assert frame["repeat"].tolist() == [0, 0] and frame["status"].tolist() == ["ok", "ok"]
    assert frame["run_id"].tolist() == [1, 2] and frame["rc"].tolist() == [0, 0]
    assert frame["wall_s"].tolist() == [0.5, 0.5]
    assert [json.loads(p)["host"] for p in frame["point"]] == [1, 2]
    assert frame["param.host"].tolist() == [1, 2]  # and the parameters theirs
    assert frame["param.repeat"].tolist() == [10, 11]
    assert frame["param.status"].tolist() == ["s", "s"]
    assert frame["param.point"].tolist() == ["p", "p"]
    assert frame["param.run_id"].tolist() == [99, 99]
    assert frame["param.wall_s"].tolist() == ["w", "w"]
    assert frame["x"].tolist() == [0, 1]  # a name no column has stays as it is
    assert "param.x" not in frame.columns
    assert frame["fom.value"].tolist() == [1.0, 2.0]
    assert not frame.columns.duplicated().any()
