"""The results store: one SQLite database per study directory.

Schema (``tunelab.db``)::

    meta(key PRIMARY KEY, value)             study spec, identity hash, references, plan size
    points(id, key UNIQUE, params)           canonical point key and its parameters (JSON)
    runs(id, point_id, repeat, status, …)    one row per finished run, UNIQUE(point_id, repeat)
    foms(run_id, name, value)                figures of merit of a run
    sysinfo(id, taken_at, snapshot)          machine and software snapshot, referenced by runs
    noise(run_id, load_before, …, disturbed) how busy the machine was around a run (schema 2)
    jobs(token, launcher, job_id, state, …)  batch jobs and the runs each executes (resume)

A run is written in one transaction together with its figures of merit, only once it has
finished: a crash or ``kill -9`` loses at most the run in flight, never a finished one, and
never leaves half a run behind. The database runs in WAL mode; one ``tunelab run`` at a
time holds the study directory's lock (see :class:`StudyLock`).

Schema versions (``meta.schema_version``): 1 — the tables above but ``noise``; 2 — adds
``noise`` (one row per run recorded since; see :mod:`tunelab.noise`) and the run status
``pruned`` (a training run stopped early by the search's pruner). Opening a version-1
database for writing creates the table and sets version 2: nothing is rewritten, older runs
simply have no noise row (their ``noise.*`` columns are NaN in :meth:`Store.runs_frame`; a
version-1 store opened read-only has no ``noise`` table and reads the same). The status list
lives in a CHECK constraint, which SQLite cannot alter: the first ``pruned`` run recorded
into an older database rebuilds its ``runs`` table (one transaction, rows and ids unchanged)
just before.

Only ``tunelab run`` (and ``status`` collecting batch jobs) opens a store for writing
(``open_store(dir, create=True)`` or ``write=True``); every other command opens it read-only
(SQLite's ``mode=ro``, or ``immutable=1`` where even that cannot work, e.g. a WAL database on
a read-only file system), so a study on a read-only medium can still be read. A write that
fails (read-only, disk full, I/O error) rolls its transaction back and raises
:class:`~tunelab.errors.StoreError` naming the database: the store stays as it was, and the
study resumes once the cause is fixed.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import math
import os
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from tunelab.errors import StoreError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["DB_NAME", "RunRecord", "Store", "StoredJob", "StudyLock", "open_store"]

DB_NAME = "tunelab.db"
SCHEMA_VERSION = 2
STATUSES = ("ok", "failed", "timeout", "invalid", "pruned")
NOISE_COLUMNS = ("load_before", "load_after", "others_cpu", "steal", "mhz_before", "mhz_after",
                 "disturbed")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS points (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, params TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sysinfo (
    id INTEGER PRIMARY KEY, taken_at TEXT NOT NULL, snapshot TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    point_id INTEGER NOT NULL REFERENCES points(id),
    repeat INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('ok', 'failed', 'timeout', 'invalid', 'pruned')),
    reason TEXT,
    rc INTEGER,
    wall_s REAL NOT NULL,
    started_at TEXT NOT NULL,
    ended_at TEXT NOT NULL,
    host TEXT NOT NULL,
    command TEXT NOT NULL,
    env TEXT NOT NULL,
    run_dir TEXT NOT NULL,
    sysinfo_id INTEGER REFERENCES sysinfo(id),
    UNIQUE (point_id, repeat));
CREATE TABLE IF NOT EXISTS jobs (
    token TEXT PRIMARY KEY,
    launcher TEXT NOT NULL,
    job_id TEXT,
    state TEXT NOT NULL CHECK (state IN ('submitting', 'active', 'closed')),
    ended_state TEXT,
    submitted_at TEXT NOT NULL,
    runs TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS foms (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    name TEXT NOT NULL, value REAL NOT NULL, PRIMARY KEY (run_id, name));
CREATE TABLE IF NOT EXISTS noise (
    run_id INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
    load_before REAL, load_after REAL, others_cpu REAL, steal REAL,
    mhz_before REAL, mhz_after REAL, disturbed INTEGER NOT NULL DEFAULT 0);
"""


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
    noise: Mapping[str, float | None] | None = None
    """How busy the machine was around the run (:meth:`tunelab.noise.NoiseSample.as_dict`)."""


@dataclass(frozen=True)
class StoredJob:
    """A batch job as the store keeps it: token, launcher, scheduler id, state, runs."""

    token: str
    launcher: str
    job_id: str | None
    state: str
    runs: list[dict[str, Any]]


class Store:
    """Access to one study's database. Create with :func:`open_store`."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path
        self._abandoned = False

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """One transaction; a failed write rolls back and becomes a StoreError.

        The database's files are checked first: SQLite maps ``-shm`` into memory, and a
        write to a mapping of a file made immutable meanwhile kills the process with SIGBUS
        instead of returning an error."""
        for path in (self.path.parent, *(Path(f"{self.path}{s}") for s in ("", "-wal", "-shm"))):
            if path.exists() and not os.access(path, os.W_OK):
                self._abandon()
                raise StoreError(f"cannot write {path}: it became read-only or immutable; the "
                                 "finished runs are stored, fix this and run the same command "
                                 "again to resume")
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
        if run.status == "pruned":
            self._allow_pruned()
        with self._writing():
            point_id = self._point_id(run.point_key, run.params)
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
                self._conn.execute(
                    f"INSERT INTO noise (run_id, {', '.join(NOISE_COLUMNS)}) "
                    f"VALUES (?{', ?' * len(NOISE_COLUMNS)})",
                    (run_id, *(run.noise.get(c) for c in NOISE_COLUMNS[:-1]),
                     int(bool(run.noise.get("disturbed")))),
                )
        return run_id

    def _allow_pruned(self) -> None:
        """Rebuild a version-1 ``runs`` table whose CHECK does not know ``pruned``."""
        row = self._conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'runs'").fetchone()
        if row is None or "'pruned'" in row[0]:
            return
        start = _SCHEMA.index("CREATE TABLE IF NOT EXISTS runs (")
        create = _SCHEMA[start:_SCHEMA.index(";", start)].replace(
            "CREATE TABLE IF NOT EXISTS runs (", "CREATE TABLE runs_v2 (")
        self._conn.execute("PRAGMA foreign_keys=OFF")
        try:
            with self._writing():
                self._conn.execute(create)
                self._conn.execute("INSERT INTO runs_v2 SELECT * FROM runs")
                self._conn.execute("DROP TABLE runs")
                self._conn.execute("ALTER TABLE runs_v2 RENAME TO runs")
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
        """(point key, repeat) of every finished run, whatever its status."""
        rows = self._conn.execute(
            "SELECT p.key, r.repeat FROM runs r JOIN points p ON p.id = r.point_id"
        )
        return {(k, int(rep)) for k, rep in rows}

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

    def runs_frame(self) -> pd.DataFrame:
        """One row per run: run columns, one column per parameter, ``fom.<name>`` columns."""
        import pandas as pd  # on use: ``tunelab run`` starts its first run sooner without it

        runs = pd.read_sql_query(
            "SELECT r.id AS run_id, r.point_id, p.key AS point, p.params, r.repeat, r.status, "
            "r.reason, r.rc, r.wall_s, r.started_at, r.ended_at, r.host FROM runs r "
            "JOIN points p ON p.id = r.point_id ORDER BY r.id",
            self._conn,
        )
        params = pd.DataFrame([json.loads(p) for p in runs.pop("params")], index=runs.index)
        foms = pd.read_sql_query("SELECT run_id, name, value FROM foms", self._conn)
        if len(foms):
            wide = foms.pivot(index="run_id", columns="name", values="value")
            wide.columns = [f"fom.{c}" for c in wide.columns]
            wide = wide.reindex(runs["run_id"]).reset_index(drop=True)
        else:
            wide = pd.DataFrame(index=runs.index)
        has_noise = self._conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                                       "AND name = 'noise'").fetchone() is not None
        query = (f"SELECT run_id, {', '.join(NOISE_COLUMNS)} FROM noise" if has_noise else
                 f"SELECT NULL AS run_id, {', '.join(f'NULL AS {c}' for c in NOISE_COLUMNS)} "
                 "WHERE 0")  # an old store opened read-only has no noise table
        noise = pd.read_sql_query(query, self._conn).set_index("run_id").reindex(
            runs["run_id"]).reset_index(drop=True)
        noise.columns = [f"noise.{c}" for c in noise.columns]
        params = params.drop(columns=[c for c in params.columns if c in runs.columns])
        return pd.concat([runs, params, wide, noise.astype(float)], axis=1)


def open_store(study_dir: str | Path, *, create: bool = False, write: bool = False) -> Store:
    """Open the store of ``study_dir``: read-only; with ``write`` for writing an existing
    store; with ``create`` for writing, making the directory and the schema as needed."""
    study_dir = Path(study_dir)
    path = study_dir / DB_NAME
    if not create or write:
        if not path.is_file():
            raise StoreError(f"{study_dir}: not a tunelab study directory (no {DB_NAME})")
        if not write:
            return Store(_connect_readonly(path), path)
    try:
        study_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create {study_dir}: {exc.strerror or exc}") from None
    try:
        conn = sqlite3.connect(path, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.executescript(_SCHEMA)
        with conn:
            conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
                         "ON CONFLICT (key) DO UPDATE SET value = excluded.value "
                         "WHERE CAST(meta.value AS INTEGER) < CAST(excluded.value AS INTEGER)",
                         (str(SCHEMA_VERSION),))
    except sqlite3.Error as exc:
        raise StoreError(f"{path}: cannot open the results database for writing: {exc}") \
            from None
    return Store(conn, path)


def _connect_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection: ``mode=ro``, or ``immutable=1`` when the directory or the
    medium cannot be written at all (then SQLite takes no locks and reads the file as is)."""
    uri = "file:" + quote(str(path.resolve()))
    problem: sqlite3.Error | None = None
    for options in ("mode=ro", "mode=ro&immutable=1"):
        try:
            conn = sqlite3.connect(f"{uri}?{options}", uri=True, timeout=30)
        except sqlite3.Error as exc:
            problem = exc
            continue
        try:
            tables = {row[0] for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not {"meta", "points", "runs", "foms"} <= tables:
                conn.close()
                raise StoreError(f"{path}: holds no tunelab results (a database of "
                                 "something else, or one whose writer never finished)")
            return conn
        except sqlite3.DatabaseError as exc:
            conn.close()
            problem = exc
            if "not a database" in str(exc) or "malformed" in str(exc):
                break
    raise StoreError(f"{path}: cannot read the results database: {problem}")


class StudyLock:
    """An exclusive lock on a study directory, held while one ``tunelab run`` works in it.

    Uses ``flock`` on ``DIR/.tunelab.lock``: the kernel releases it when the process dies,
    so a ``kill -9`` never leaves a stale lock.
    """

    def __init__(self, study_dir: Path) -> None:
        self.path = Path(study_dir) / ".tunelab.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`StoreError` naming the holder."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot open the lock file {self.path}: "
                             f"{exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreError(
                f"{self.path.parent}: another tunelab run (pid {holder}) is working in this "
                "study directory; wait for it or use another --dir"
            ) from None
        with suppress(OSError):  # a lock file that cannot hold the pid still locks
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Release the lock."""
        if self._fd is not None:
            with suppress(OSError):
                os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lock for the duration of a ``with`` block."""
        self.acquire()
        try:
            yield
        finally:
            self.release()
