"""Noise watch: the arithmetic of the shares, the flag, waiting, and the store's schema 2."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest

from tunelab import noise
from tunelab.noise import DISTURB_MARGIN, NoiseWatch
from tunelab.report.results import results_from_frame
from tunelab.store import RunRecord, open_store
from tunelab.workload import Objective


class FakeMachine:
    """A 2-core machine whose CPU counters the test advances by hand."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 0.0
        self.busy = 0.0
        self.steal = 0.0
        self.own = 0.0
        monkeypatch.setattr(noise, "_cpu_seconds", lambda: (self.busy, self.steal))
        monkeypatch.setattr(noise, "_own_seconds", lambda: self.own)
        monkeypatch.setattr(noise, "_load", lambda: 1.5)
        monkeypatch.setattr(noise, "_mhz", lambda: 2400.0)

    def advance(self, seconds: float, others: float, own: float = 0.0) -> None:
        """``seconds`` pass; other processes use ``others`` of the machine, we ``own``."""
        self.now += seconds
        self.busy += (others + own) * seconds * 2
        self.own += own * seconds * 2

    def sleep(self, seconds: float) -> None:
        self.advance(seconds, self.others_while_sleeping)

    others_while_sleeping = 0.1


def test_a_run_is_disturbed_when_others_use_more_of_the_machine(monkeypatch):
    m = FakeMachine(monkeypatch)
    watch = NoiseWatch(2, clock=lambda: m.now, sleep=m.sleep)  # reference: others at 10 %
    before = watch.start()
    m.advance(10, others=0.2, own=0.5)  # our run used half the machine: not counted
    quiet = watch.stop(before)
    assert quiet.others_cpu == pytest.approx(0.2) and not quiet.disturbed
    assert quiet.load_before == 1.5 and quiet.mhz_after == 2400.0
    before = watch.start()
    m.advance(10, others=0.1 + DISTURB_MARGIN + 0.05, own=0.5)
    busy = watch.stop(before)
    assert busy.disturbed and busy.as_dict()["disturbed"] == 1.0
    assert watch.reference == (pytest.approx(0.1), pytest.approx(0.0))


def test_wait_quiet_waits_for_a_quiet_machine_or_gives_up(monkeypatch):
    m = FakeMachine(monkeypatch)
    m.others_while_sleeping = 0.9
    watch = NoiseWatch(2, clock=lambda: m.now, sleep=m.sleep)
    assert watch.wait_quiet(level=0.15, max_wait_s=30) == pytest.approx(30, abs=1.01)
    m.others_while_sleeping = 0.05
    assert watch.wait_quiet(level=0.15, max_wait_s=30) == pytest.approx(1.0)


def test_the_real_machine_is_readable():
    watch = NoiseWatch()
    sample = watch.stop(watch.start())
    assert sample.others_cpu is None or 0.0 <= sample.others_cpu <= 1.0
    assert sample.load_before is None or sample.load_before >= 0


OLD_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE points (id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, params TEXT NOT NULL);
CREATE TABLE sysinfo (id INTEGER PRIMARY KEY, taken_at TEXT NOT NULL, snapshot TEXT NOT NULL);
CREATE TABLE runs (id INTEGER PRIMARY KEY, point_id INTEGER NOT NULL REFERENCES points(id),
    repeat INTEGER NOT NULL, status TEXT NOT NULL, reason TEXT, rc INTEGER,
    wall_s REAL NOT NULL, started_at TEXT NOT NULL, ended_at TEXT NOT NULL, host TEXT NOT NULL,
    command TEXT NOT NULL, env TEXT NOT NULL, run_dir TEXT NOT NULL,
    sysinfo_id INTEGER REFERENCES sysinfo(id), UNIQUE (point_id, repeat));
CREATE TABLE foms (run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    name TEXT NOT NULL, value REAL NOT NULL, PRIMARY KEY (run_id, name));
INSERT INTO points VALUES (1, '{"x": 1}', '{"x": 1}');
INSERT INTO runs VALUES (1, 1, 0, 'ok', NULL, 0, 1.0, 't', 't', 'h', '[]', '{}', 'r', NULL);
INSERT INTO foms VALUES (1, 'wall_s', 1.0);
"""


def _record(point: dict[str, int], repeat: int, value: float, disturbed: bool) -> RunRecord:
    return RunRecord(
        point_key=json.dumps(point), params=point, repeat=repeat, status="ok", reason=None,
        rc=0, wall_s=value, started_at="t", ended_at="t", host="h", command=[], env={},
        run_dir="r", foms={"wall_s": value},
        noise={"load_before": 1.0, "load_after": 2.0, "others_cpu": 0.5, "steal": 0.0,
               "mhz_before": None, "mhz_after": None, "disturbed": 1.0 if disturbed else 0.0})


def test_a_schema_1_store_is_migrated_in_place(tmp_path: Path):
    conn = sqlite3.connect(tmp_path / "tunelab.db")
    conn.executescript(OLD_SCHEMA)
    conn.close()
    with open_store(tmp_path, write=True) as store:
        assert store.get_meta("schema_version") == "3"
        store.record_run(_record({"x": 1}, 1, 1.1, disturbed=True))
        frame = store.runs_frame()
    assert len(frame) == 2
    assert math.isnan(frame.loc[0, "noise.others_cpu"])  # the old run has no sample
    assert frame.loc[1, "noise.others_cpu"] == 0.5 and frame.loc[1, "noise.disturbed"] == 1
    assert math.isnan(frame.loc[1, "noise.mhz_after"])


def test_disturbed_runs_are_counted_and_warned_about(tmp_path: Path):
    with open_store(tmp_path, create=True) as store:
        for r in range(3):
            store.record_run(_record({"x": 1}, r, 10.0 + r / 10, disturbed=False))
            store.record_run(_record({"x": 2}, r, 8.0 + r / 10, disturbed=r == 2))
        frame = store.runs_frame()
    results = results_from_frame(frame, Objective("wall_s"), json.dumps({"x": 1}),
                                 n_resamples=200)
    by_x = {s.params["x"]: s for s in results.summaries}
    assert by_x[1].disturbed == 0 and by_x[2].disturbed == 1
    warning = [n for n in results.notes if n.startswith("Warning: runs taken while")]
    assert warning and "x=2 (1 of 3)" in warning[0]


def test_a_pruned_run_rebuilds_an_old_runs_table_keeping_every_row(tmp_path: Path):
    conn = sqlite3.connect(tmp_path / "tunelab.db")
    conn.executescript(OLD_SCHEMA)
    conn.close()
    pruned = RunRecord(
        point_key='{"x": 2}', params={"x": 2}, repeat=0, status="pruned",
        reason="pruned at step 2", rc=None, wall_s=0.5, started_at="t", ended_at="t",
        host="h", command=[], env={}, run_dir="r", foms={"wall_s": 0.5})
    with open_store(tmp_path, write=True) as store:
        store.record_run(pruned)
        assert store.status_counts() == {"ok": 1, "pruned": 1}
        frame = store.runs_frame()
    assert list(frame["run_id"]) == [1, 2] and frame.loc[0, "fom.wall_s"] == 1.0
    conn = sqlite3.connect(tmp_path / "tunelab.db")
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    conn.close()
