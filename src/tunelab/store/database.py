"""Access to one study's results database: :class:`Store`, one transaction per write.

A run is written in one transaction together with its figures of merit, only once it has
finished: a crash or ``kill -9`` loses at most the run in flight, never a finished one, and
never leaves half a run behind. A write that fails (read-only, disk full, I/O error) rolls
its transaction back and raises :class:`~tunelab.errors.StoreError` naming the database: the
store stays as it was, and the study resumes once the cause is fixed. The tables are those of
:mod:`tunelab.store.schema`; :func:`tunelab.store.open_store` opens a store.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunelab.errors import StoreError
from tunelab.store.frame import read_runs_frame
from tunelab.store.schema import (
    NOISE_COLUMNS,
    STATUSES,
    rebuild_runs_table,
    runs_table_lacks,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["GuardedConnection", "RunRecord", "Store", "StoredJob"]


@dataclass(frozen=True)
class RunRecord:
    """A finished run, as the runner hands it to the store."""

    point_key: str
    params: Mapping[str, Any]
    repeat: int
    status: str
    reason: str | None
    rc: int | None
    wall_s: float
    started_at: str
    ended_at: str
    host: str
    command: list[str]
    env: Mapping[str, str]
    run_dir: str
    foms: Mapping[str, float]
    sysinfo_id: int | None = None
    noise: Mapping[str, float | str | None] | None = None
    """How busy the machine was around the run (:meth:`tunelab.noise.NoiseSample.as_dict`)."""


@dataclass(frozen=True)
class StoredJob:
    """A batch job as the store keeps it: token, launcher, scheduler id, state, runs."""

    token: str
    launcher: str
    job_id: str | None
    state: str
    runs: list[dict[str, Any]]


class GuardedConnection(sqlite3.Connection):
    """The connection of a store open for writing: every statement first calls
    :attr:`guard` (the store's check of its files, :meth:`Store._check_files`). SQLite writes
    to its memory-mapped ``-shm`` on reads too (a reader's mark), and a write to the mapping
    of a file made immutable meanwhile kills the process with SIGBUS instead of returning an
    error."""

    guard: Callable[[], None] | None = None

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        if self.guard is not None:
            self.guard()
        return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        if self.guard is not None:
            self.guard()
        return super().executemany(sql, parameters)

    def cursor(self, *args: Any, **kwargs: Any) -> Any:  # pandas reads through a cursor
        if self.guard is not None:
            self.guard()
        return super().cursor(*args, **kwargs)


class Store:
    """Access to one study's database. Create with :func:`open_store`."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path
        self._abandoned = False
        if isinstance(conn, GuardedConnection):
            conn.guard = self._check_files

    def _check_files(self) -> None:
        """Stop before SQLite touches a database file that became read-only or immutable
        (see :class:`GuardedConnection`): one StoreError, and the connection abandoned."""
        for path in (self.path.parent, *(Path(f"{self.path}{s}") for s in ("", "-wal", "-shm"))):
            if path.exists() and not os.access(path, os.W_OK):
                self._abandon()
                raise StoreError(f"cannot write {path}: it became read-only or immutable; the "
                                 "finished runs are stored, fix this and run the same command "
                                 "again to resume")

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """One transaction; a failed write rolls back and becomes a StoreError. The
        database's files are checked first (:meth:`_check_files`)."""
        self._check_files()
        try:
            with self._conn:
                yield self._conn
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot write the results database: {exc}; the "
                             "finished runs are stored, fix this and run the same command "
                             "again to resume") from None

    def close(self) -> None:
        """Close the connection (unless it was abandoned, see :meth:`_abandon`)."""
        if not self._abandoned:
            self._conn.close()

    def _abandon(self) -> None:
        """Never close this connection, not even when the interpreter exits.

        Closing a WAL database checkpoints it, which writes to the memory-mapped ``-shm``
        file; when that file has become immutable the write is a SIGBUS that kills the
        process before it can say why. The operating system releases the file and its
        locks at exit instead, and the next ``tunelab run`` recovers the WAL as usual."""
        if not self._abandoned:
            self._abandoned = True
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(self._conn))

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- meta ---------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        """A stored meta value, or None."""
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, values: Mapping[str, str]) -> None:
        """Store meta values (one transaction)."""
        with self._writing():
            self._conn.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                list(values.items()),
            )

    def spec(self) -> dict[str, Any]:
        """The study file's content as stored when the study started."""
        raw = self.get_meta("spec")
        if raw is None:
            raise StoreError(f"{self.path}: holds no study yet")
        return dict(json.loads(raw))

    # --- writing ------------------------------------------------------------------------

    def add_sysinfo(self, taken_at: str, snapshot: Mapping[str, Any]) -> int:
        """Store a machine snapshot; returns its id."""
        with self._writing():
            cur = self._conn.execute(
                "INSERT INTO sysinfo (taken_at, snapshot) VALUES (?, ?)",
                (taken_at, json.dumps(snapshot, sort_keys=True, default=str)),
            )
        return int(cur.lastrowid or 0)

    def record_run(self, run: RunRecord) -> int:
        """Store a finished run and its figures of merit in one transaction."""
        if run.status not in STATUSES:
            raise ValueError(f"unknown run status {run.status!r}")
        if not all(math.isfinite(v) for v in run.foms.values()):
            raise ValueError(f"figures of merit must be finite, got {dict(run.foms)}")
        if run.status in ("pruned", "lost"):
            self._allow_status(run.status)
        with self._writing():
            point_id = self._point_id(run.point_key, run.params)
            self._conn.execute(  # a run lost before is replaced by its new attempt
                "DELETE FROM runs WHERE point_id = ? AND repeat = ? AND status = 'lost'",
                (point_id, run.repeat))
            cur = self._conn.execute(
                "INSERT INTO runs (point_id, repeat, status, reason, rc, wall_s, started_at, "
                "ended_at, host, command, env, run_dir, sysinfo_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (point_id, run.repeat, run.status, run.reason, run.rc, run.wall_s,
                 run.started_at, run.ended_at, run.host, json.dumps(run.command),
                 json.dumps(dict(run.env), sort_keys=True), run.run_dir, run.sysinfo_id),
            )
            run_id = int(cur.lastrowid or 0)
            self._conn.executemany(
                "INSERT INTO foms (run_id, name, value) VALUES (?, ?, ?)",
                [(run_id, k, float(v)) for k, v in run.foms.items()],
            )
            if run.noise is not None:
                names = [c for c in NOISE_COLUMNS if c in run.noise or c == "disturbed"]
                self._conn.execute(
                    f"INSERT INTO noise (run_id, {', '.join(names)}) "
                    f"VALUES (?{', ?' * len(names)})",
                    (run_id, *(int(bool(run.noise.get(c))) if c == "disturbed"
                               else run.noise.get(c) for c in names)),
                )
        return run_id

    def _allow_status(self, status: str) -> None:
        """Rebuild an older ``runs`` table whose CHECK does not know ``status``."""
        if not runs_table_lacks(self._conn, status):
            return
        self._conn.execute("PRAGMA foreign_keys=OFF")
        try:
            with self._writing():
                rebuild_runs_table(self._conn)
        finally:
            self._conn.execute("PRAGMA foreign_keys=ON")

    def _point_id(self, key: str, params: Mapping[str, Any]) -> int:
        row = self._conn.execute("SELECT id FROM points WHERE key = ?", (key,)).fetchone()
        if row:
            return int(row[0])
        cur = self._conn.execute(
            "INSERT INTO points (key, params) VALUES (?, ?)",
            (key, json.dumps(dict(params), sort_keys=True)),
        )
        return int(cur.lastrowid or 0)

    def point_id(self, key: str) -> int | None:
        """The id of a stored point, or None."""
        row = self._conn.execute("SELECT id FROM points WHERE key = ?", (key,)).fetchone()
        return int(row[0]) if row else None

    def next_point_id(self) -> int:
        """The id the next new point will get (for naming run directories)."""
        row = self._conn.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM points").fetchone()
        return int(row[0])

    # --- batch jobs -----------------------------------------------------------------------

    def add_job(self, token: str, launcher: str, runs: list[dict[str, Any]],
                submitted_at: str) -> None:
        """Record a job about to be submitted (before ``sbatch``: a controller that dies in
        between finds it by name when it comes back)."""
        with self._writing():
            self._conn.execute(
                "INSERT INTO jobs (token, launcher, state, submitted_at, runs) "
                "VALUES (?, ?, 'submitting', ?, ?)",
                (token, launcher, submitted_at, json.dumps(runs)))

    def set_job_id(self, token: str, job_id: str) -> None:
        """The scheduler accepted the job: store its id."""
        with self._writing():
            self._conn.execute("UPDATE jobs SET job_id = ?, state = 'active' WHERE token = ?",
                               (job_id, token))

    def close_job(self, token: str, ended_state: str) -> None:
        """The job will run nothing more (``ended_state``: the scheduler's word, or why)."""
        with self._writing():
            self._conn.execute("UPDATE jobs SET state = 'closed', ended_state = ? "
                               "WHERE token = ?", (ended_state, token))

    def _has_jobs_table(self) -> bool:
        """Whether the store has the ``jobs`` table (a store written before batch
        launchers existed, opened read-only, has not)."""
        return self._conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                                  "name = 'jobs'").fetchone() is not None

    def open_jobs(self) -> list[StoredJob]:
        """Jobs not yet closed, oldest first."""
        if not self._has_jobs_table():
            return []
        rows = self._conn.execute(
            "SELECT token, launcher, job_id, state, runs FROM jobs WHERE state != 'closed' "
            "ORDER BY submitted_at, token")
        return [StoredJob(t, lau, jid, st, json.loads(runs)) for t, lau, jid, st, runs in rows]

    def job_counts(self) -> dict[str, int]:
        """Number of jobs per state (``submitting``, ``active``, ``closed``)."""
        if not self._has_jobs_table():
            return {}
        rows = self._conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state")
        return {s: int(n) for s, n in rows}

    # --- reading ------------------------------------------------------------------------

    def completed(self) -> set[tuple[str, int]]:
        """(point key, repeat) of every finished run, whatever its status but ``lost``
        (a lost run is run again when the study resumes)."""
        rows = self._conn.execute(
            "SELECT p.key, r.repeat FROM runs r JOIN points p ON p.id = r.point_id "
            "WHERE r.status != 'lost'"
        )
        return {(k, int(rep)) for k, rep in rows}

    # --- lost attempts ----------------------------------------------------------------------

    def record_attempt(self, point_key: str, params: Mapping[str, Any], repeat: int, *,
                       job: str | None, state: str, node: str | None, reason: str,
                       at: str) -> int:
        """Store one attempt of a run that the infrastructure lost (node failure,
        preemption, cancelled from outside, vanished job); returns how many attempts of
        that run are stored now."""
        with self._writing():
            point_id = self._point_id(point_key, params)
            self._conn.execute(
                "INSERT INTO attempts (point_id, repeat, job, state, node, reason, at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (point_id, repeat, job, state, node, reason, at))
            row = self._conn.execute(
                "SELECT COUNT(*) FROM attempts WHERE point_id = ? AND repeat = ?",
                (point_id, repeat)).fetchone()
        return int(row[0])

    def lost_attempts(self, limit: int = 10) -> tuple[int, list[tuple[str, int, str, str, str]]]:
        """How many attempts the infrastructure lost in all, and the latest ``limit`` of
        them: (point key, repeat, state, node(s) or "", reason), newest first."""
        if not self._has_table("attempts"):
            return 0, []
        (total,) = self._conn.execute("SELECT COUNT(*) FROM attempts").fetchone()
        rows = self._conn.execute(
            "SELECT p.key, a.repeat, a.state, COALESCE(a.node, ''), a.reason FROM attempts a "
            "JOIN points p ON p.id = a.point_id ORDER BY a.id DESC LIMIT ?", (limit,))
        return int(total), [(k, int(rep), st, node, reason) for k, rep, st, node, reason in rows]

    def _has_table(self, name: str) -> bool:
        return self._conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                                  "name = ?", (name,)).fetchone() is not None

    def run_value(self, point_key: str, repeat: int, fom: str) -> float | None:
        """``fom`` of run ``repeat`` of a point when that run is ok, else None."""
        row = self._conn.execute(
            "SELECT f.value FROM foms f JOIN runs r ON r.id = f.run_id "
            "JOIN points p ON p.id = r.point_id "
            "WHERE p.key = ? AND r.repeat = ? AND f.name = ? AND r.status = 'ok'",
            (point_key, repeat, fom),
        ).fetchone()
        return float(row[0]) if row and row[0] is not None else None

    def objective_mean(self, point_key: str, fom: str) -> float | None:
        """Mean of ``fom`` over a point's ok runs, or None if it has none."""
        row = self._conn.execute(
            "SELECT AVG(f.value) FROM foms f JOIN runs r ON r.id = f.run_id "
            "JOIN points p ON p.id = r.point_id "
            "WHERE p.key = ? AND f.name = ? AND r.status = 'ok'", (point_key, fom)
        ).fetchone()
        return float(row[0]) if row and row[0] is not None else None

    def status_counts(self) -> dict[str, int]:
        """Number of runs per status."""
        rows = self._conn.execute("SELECT status, COUNT(*) FROM runs GROUP BY status")
        return {s: int(n) for s, n in rows}

    def failures(self, limit: int = 10) -> list[tuple[str, int, str, str]]:
        """The latest non-ok runs: (point key, repeat, status, reason)."""
        rows = self._conn.execute(
            "SELECT p.key, r.repeat, r.status, COALESCE(r.reason, '') FROM runs r "
            "JOIN points p ON p.id = r.point_id WHERE r.status != 'ok' "
            "ORDER BY r.id DESC LIMIT ?", (limit,)
        )
        return [(k, int(rep), s, reason) for k, rep, s, reason in rows]

    def sysinfo(self) -> dict[str, Any]:
        """The latest machine snapshot (empty if none)."""
        row = self._conn.execute(
            "SELECT snapshot FROM sysinfo ORDER BY id DESC LIMIT 1").fetchone()
        return dict(json.loads(row[0])) if row else {}

    # --- disturbed runs ---------------------------------------------------------------------

    def judged_runs(self, fom: str) -> list[tuple[int, str, str, float]]:
        """(run id, status, reason, value of ``fom``) of the runs stored ``ok`` or
        ``invalid`` that have ``fom``, in the order they were stored."""
        rows = self._conn.execute(
            "SELECT r.id, r.status, COALESCE(r.reason, ''), f.value FROM foms f "
            "JOIN runs r ON r.id = f.run_id "
            "WHERE f.name = ? AND r.status IN ('ok', 'invalid') ORDER BY r.id", (fom,))
        return [(int(i), str(st), str(why), float(v)) for i, st, why, v in rows]

    def rejudge(self, verdicts: Mapping[int, tuple[str, str | None]],
                meta: Mapping[str, str]) -> None:
        """Set the status (``ok`` or ``invalid``) and reason of stored runs by run id, and
        meta values, in one transaction."""
        if any(status not in ("ok", "invalid") for status, _ in verdicts.values()):
            raise ValueError("a run is judged again only as ok or invalid")
        with self._writing() as conn:
            conn.executemany("UPDATE runs SET status = ?, reason = ? WHERE id = ?",
                             [(st, why, i) for i, (st, why) in verdicts.items()])
            conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?) "
                             "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                             list(meta.items()))

    def disturbed_runs(self) -> list[tuple[str, int, str]]:
        """The ok runs the noise watch flagged disturbed: (point key, repeat, evidence)."""
        if not self._has_table("noise"):
            return []
        rows = self._conn.execute(
            "SELECT p.key, r.repeat, COALESCE(n.evidence, '') FROM runs r "
            "JOIN points p ON p.id = r.point_id JOIN noise n ON n.run_id = r.id "
            "WHERE r.status = 'ok' AND n.disturbed != 0 ORDER BY r.id")
        return [(k, int(rep), str(ev)) for k, rep, ev in rows]

    def discard_runs(self, runs: list[tuple[str, int, str]], at: str) -> None:
        """Remove the (point key, repeat, evidence) runs so that they run again, in one
        transaction; each is noted in the meta value ``discarded_runs`` (a JSON list of
        ``{point, repeat, evidence, at}``), so that the study says what it ran twice."""
        if not runs:
            return
        note = json.loads(self.get_meta("discarded_runs") or "[]")
        with self._writing() as conn:
            for key, repeat, evidence in runs:
                row = conn.execute(
                    "SELECT r.id FROM runs r JOIN points p ON p.id = r.point_id "
                    "WHERE p.key = ? AND r.repeat = ?", (key, repeat)).fetchone()
                if row is None:
                    continue
                for table, column in (("foms", "run_id"), ("noise", "run_id"),
                                      ("runs", "id")):
                    conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (row[0],))
                note.append({"point": key, "repeat": repeat, "evidence": evidence, "at": at})
            conn.execute("INSERT INTO meta (key, value) VALUES ('discarded_runs', ?) "
                         "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                         (json.dumps(note),))

    def runs_frame(self) -> pd.DataFrame:
        """One row per run: run columns, one column per parameter, ``fom.<name>`` columns."""
        return read_runs_frame(self._conn)

    def run_envs(self) -> dict[int, str]:
        """Per run id, the environment its command was started with, as stored: a JSON
        object of the variables set over the inherited environment (the env set's and the
        workload's own, e.g. ``OMP_NUM_THREADS``)."""
        return {int(run_id): str(env) for run_id, env in
                self._conn.execute("SELECT id, env FROM runs ORDER BY id")}
