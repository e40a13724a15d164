"""The store's schema 3: lost runs and their attempts, and the noise table's new columns, on
new databases and on version-2 ones (migrated in place when written, read as they are)."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest

from tunelab.errors import StoreError
from tunelab.store import RunRecord, open_store

V2_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE points (id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, params TEXT NOT NULL);
CREATE TABLE sysinfo (id INTEGER PRIMARY KEY, taken_at TEXT NOT NULL, snapshot TEXT NOT NULL);
CREATE TABLE runs (id INTEGER PRIMARY KEY, point_id INTEGER NOT NULL REFERENCES points(id),
    repeat INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('ok', 'failed', 'timeout', 'invalid', 'pruned')),
    reason TEXT, rc INTEGER, wall_s REAL NOT NULL, started_at TEXT NOT NULL,
    ended_at TEXT NOT NULL, host TEXT NOT NULL, command TEXT NOT NULL, env TEXT NOT NULL,
    run_dir TEXT NOT NULL, sysinfo_id INTEGER REFERENCES sysinfo(id), UNIQUE (point_id, repeat));
CREATE TABLE foms (run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    name TEXT NOT NULL, value REAL NOT NULL, PRIMARY KEY (run_id, name));
CREATE TABLE noise (run_id INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
    load_before REAL, load_after REAL, others_cpu REAL, steal REAL,
    mhz_before REAL, mhz_after REAL, disturbed INTEGER NOT NULL DEFAULT 0);
INSERT INTO meta VALUES ('schema_version', '2');
INSERT INTO points VALUES (1, '{"x": 1}', '{"x": 1}');
INSERT INTO runs VALUES (1, 1, 0, 'ok', NULL, 0, 1.0, 't', 't', 'h', '[]', '{}', 'r', NULL);
INSERT INTO foms VALUES (1, 'wall_s', 1.0);
INSERT INTO noise VALUES (1, 1.0, 1.0, 0.9, 0.0, NULL, NULL, 1);
"""


def _run(repeat: int, status: str, value: float = 1.0, **noise: float | str) -> RunRecord:
    return RunRecord(point_key='{"x": 1}', params={"x": 1}, repeat=repeat, status=status,
                     reason=None if status == "ok" else f"{status} for a test", rc=None,
                     wall_s=value, started_at="t", ended_at="t", host="h", command=[], env={},
                     run_dir="r", foms={"wall_s": value}, noise=noise or None)


def _v2(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "tunelab.db")
    conn.executescript(V2_SCHEMA)
    conn.close()


def test_a_version_2_store_reads_as_it_is_with_the_new_columns_empty(tmp_path: Path):
    _v2(tmp_path)
    with open_store(tmp_path) as store:  # read-only: nothing migrated
        frame = store.runs_frame()
        assert store.lost_attempts() == (0, [])
    assert frame.loc[0, "noise.others_cpu"] == 0.9 and frame.loc[0, "noise.disturbed"] == 1
    assert math.isnan(frame.loc[0, "noise.others_share"])
    assert frame.loc[0, "noise.evidence"] == ""
    conn = sqlite3.connect(tmp_path / "tunelab.db")
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("2",)
    conn.close()


def test_a_version_2_store_gains_the_columns_the_table_and_the_lost_status(tmp_path: Path):
    _v2(tmp_path)
    with open_store(tmp_path, write=True) as store:
        assert store.get_meta("schema_version") == "3"
        store.record_run(_run(1, "lost"))
        store.record_run(_run(2, "ok", 2.0, others_share=0.1, cpu_list="0-1",
                              evidence="quiet", disturbed=0.0))
        frame = store.runs_frame()
        assert store.status_counts() == {"ok": 2, "lost": 1}
    assert list(frame["run_id"]) == [1, 2, 3]
    assert frame.loc[2, "noise.others_share"] == 0.1 and frame.loc[2, "noise.cpu_list"] == "0-1"
    assert math.isnan(frame.loc[0, "noise.others_share"])
    conn = sqlite3.connect(tmp_path / "tunelab.db")
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    conn.close()


def test_a_lost_run_is_not_completed_and_its_next_attempt_replaces_it(tmp_path: Path):
    with open_store(tmp_path, create=True) as store:
        assert store.record_attempt('{"x": 1}', {"x": 1}, 0, job="7", state="NODE_FAIL",
                                    node="node2", reason="node2 failed", at="t") == 1
        assert store.record_attempt('{"x": 1}', {"x": 1}, 0, job="9", state="CANCELLED",
                                    node=None, reason="cancelled", at="t") == 2
        store.record_run(_run(0, "lost"))
        assert store.completed() == set()
        assert store.status_counts() == {"lost": 1}
        assert store.lost_attempts(limit=1) == (
            2, [('{"x": 1}', 0, "CANCELLED", "", "cancelled")])
        store.record_run(_run(0, "ok"))
        assert store.completed() == {('{"x": 1}', 0)}
        assert store.status_counts() == {"ok": 1}


def test_a_store_holding_a_trigger_is_read_but_never_written(tmp_path: Path):
    """A trigger (tunelab never makes one) would change rows behind the runner's writes."""
    _v2(tmp_path)
    conn = sqlite3.connect(tmp_path / "tunelab.db")
    conn.execute("CREATE TRIGGER t AFTER INSERT ON runs BEGIN DELETE FROM foms; END")
    conn.close()
    before = (tmp_path / "tunelab.db").read_bytes()
    with open_store(tmp_path) as store:
        assert len(store.runs_frame()) == 1
    with pytest.raises(StoreError, match="is not a tunelab results database .*the trigger t"):
        open_store(tmp_path, write=True)
    assert (tmp_path / "tunelab.db").read_bytes() == before


def test_runs_judged_again_change_together_and_only_between_ok_and_invalid(tmp_path: Path):
    with open_store(tmp_path, create=True) as store:
        first, second = store.record_run(_run(0, "ok", 10.0)), store.record_run(
            _run(1, "invalid", 2.0))
        assert store.judged_runs("wall_s") == [(first, "ok", "", 10.0),
                                               (second, "invalid", "invalid for a test", 2.0)]
        with pytest.raises(ValueError, match="only as ok or invalid"):
            store.rejudge({first: ("failed", "x")}, {"reference.wall_s": "2.0"})
        assert store.status_counts() == {"ok": 1, "invalid": 1}
        assert store.get_meta("reference.wall_s") is None  # nothing written
        store.rejudge({first: ("invalid", "odd"), second: ("ok", None)},
                      {"reference.wall_s": "2.0"})
        assert store.judged_runs("wall_s") == [(first, "invalid", "odd", 10.0),
                                               (second, "ok", "", 2.0)]
        assert store.get_meta("reference.wall_s") == "2.0"
