"""The results database's schema, its versions and its migrations: the one place to change it.

Schema (``tunelab.db``)::

    meta(key PRIMARY KEY, value)             study spec, identity hash, references, plan size
    points(id, key UNIQUE, params)           canonical point key and its parameters (JSON)
    runs(id, point_id, repeat, status, …)    one row per finished run, UNIQUE(point_id, repeat)
    foms(run_id, name, value)                figures of merit of a run
    sysinfo(id, taken_at, snapshot)          machine and software snapshot, referenced by runs
    noise(run_id, load_before, …, disturbed) how busy the machine was around a run (schema 2;
                                             more columns in 3: the run's own cores, evidence)
    jobs(token, launcher, job_id, state, …)  batch jobs and the runs each executes (resume)
    attempts(point_id, repeat, attempt, …)   runs the infrastructure lost: node, scheduler
                                             state, reason (schema 3)

Schema versions (``meta.schema_version``): 1 — the tables above but ``noise``; 2 — adds
``noise`` (one row per run recorded since; see :mod:`tunelab.noise`) and the run status
``pruned`` (a training run stopped early by the search's pruner). Opening a version-1
database for writing creates the table and sets version 2: nothing is rewritten, older runs
simply have no noise row (their ``noise.*`` columns are NaN in
:meth:`~tunelab.store.Store.runs_frame`; a version-1 store opened read-only has no ``noise``
table and reads the same). The status list lives in a CHECK constraint, which SQLite cannot
alter: the first ``pruned`` run recorded into an older database rebuilds its ``runs`` table
(one transaction, rows and ids unchanged) just before (:func:`rebuild_runs_table`). 3 — the
run status ``lost`` (the infrastructure ended the run: node failure, preemption, a job
cancelled from outside, a vanished job; it is re-submitted, and stored as ``lost`` only when
its retries ran out), the ``attempts`` table (every lost attempt), and ``noise`` columns for
evidence measured on the run's own cores (see :data:`NOISE_COLUMNS`); opening a version-2
database for writing adds the table and the missing columns, and the first ``lost`` run
rebuilds ``runs`` as ``pruned`` does. Later ``noise`` columns (``llc_cpu_list``,
``llc_others_share``; ``io_disks``, ``io_bytes``, ``io_own_bytes``, ``io_others_bytes``,
``io_others_share``, ``io_carried_bytes``, ``io_wait``; ``throttled``, ``stopped``) are
added the same way to any database opened for writing, without a new version: older runs
read NaN (or empty) there, and an older tunelab ignores them.

A change to the schema goes here: the table in :data:`SCHEMA` (and in the list above), a new
:data:`SCHEMA_VERSION` with its line in the history above, and, for databases written by an
older version, the step that brings them up to date in :func:`create_schema` (which runs on
every open for writing), or, like the ``pruned`` status, just before the first write that
needs it. The readers (:meth:`~tunelab.store.Store.runs_frame`) must still read a store of an
older version opened read-only, which no migration has touched.
"""

from __future__ import annotations

import sqlite3
from functools import cache

__all__ = [
    "DB_NAME",
    "NOISE_COLUMNS",
    "REQUIRED_TABLES",
    "SCHEMA",
    "SCHEMA_VERSION",
    "STATUSES",
    "create_schema",
    "foreign_problem",
    "rebuild_runs_table",
    "runs_table_lacks",
]

DB_NAME = "tunelab.db"
SCHEMA_VERSION = 3
STATUSES = ("ok", "failed", "timeout", "invalid", "pruned", "lost")
NOISE_COLUMNS: dict[str, str] = {
    "load_before": "REAL", "load_after": "REAL", "others_cpu": "REAL", "steal": "REAL",
    "mhz_before": "REAL", "mhz_after": "REAL",
    # schema 3: evidence on the run's own cores (tunelab.noise), where the run ran
    "cpus": "REAL", "others_share": "REAL", "own_share": "REAL", "psi_some": "REAL",
    "cpu_list": "TEXT", "shared_with": "TEXT", "evidence": "TEXT",
    # added to version-3 databases as they are opened for writing: the cores sharing the
    # run's last-level cache and what others took of them
    "llc_cpu_list": "TEXT", "llc_others_share": "REAL",
    # added the same way: others' disk I/O over the run (tunelab.diskio)
    "io_disks": "TEXT", "io_bytes": "REAL", "io_own_bytes": "REAL", "io_others_bytes": "REAL",
    "io_others_share": "REAL", "io_carried_bytes": "REAL", "io_wait": "REAL",
    # added the same way: the share of the run's cores a CPU quota held it back
    "throttled": "REAL",
    # added the same way: the share of readings in which a process of the run was stopped
    "stopped": "REAL",
    "disturbed": "INTEGER NOT NULL DEFAULT 0",
}
"""The ``noise`` table's columns (name -> SQL type), ``disturbed`` last. ``REAL`` columns are
numbers (NaN where unknown in the runs table), ``TEXT`` ones strings. A column added here is
added to older databases by :func:`create_schema`."""
REQUIRED_TABLES = frozenset({"meta", "points", "runs", "foms"})
"""The tables every version has: a database without them holds no tunelab results."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS points (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, params TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sysinfo (
    id INTEGER PRIMARY KEY, taken_at TEXT NOT NULL, snapshot TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    point_id INTEGER NOT NULL REFERENCES points(id),
    repeat INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('ok', 'failed', 'timeout', 'invalid', 'pruned',
                                           'lost')),
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
    {noise});
CREATE TABLE IF NOT EXISTS attempts (
    id INTEGER PRIMARY KEY,
    point_id INTEGER NOT NULL REFERENCES points(id),
    repeat INTEGER NOT NULL,
    job TEXT,
    state TEXT NOT NULL,
    node TEXT,
    reason TEXT NOT NULL,
    at TEXT NOT NULL);
""".replace("{noise}", ", ".join(f"{name} {kind}" for name, kind in NOISE_COLUMNS.items()))
"""Every table of the current version; ``IF NOT EXISTS``, so it also adds new tables to an
older database."""


def create_schema(conn: sqlite3.Connection) -> None:
    """Create the tables a database lacks and raise its ``schema_version`` to
    :data:`SCHEMA_VERSION` (never lower it: a newer tunelab may have written it)."""
    conn.executescript(SCHEMA)
    have = {row[1] for row in conn.execute("PRAGMA table_info(noise)")}
    with conn:
        for name, kind in NOISE_COLUMNS.items():
            if name not in have:  # an older database: the column is added, rows keep NULL
                conn.execute(f"ALTER TABLE noise ADD COLUMN {name} {kind.split()[0]}")
        conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
                     "ON CONFLICT (key) DO UPDATE SET value = excluded.value "
                     "WHERE CAST(meta.value AS INTEGER) < CAST(excluded.value AS INTEGER)",
                     (str(SCHEMA_VERSION),))


def runs_table_lacks(conn: sqlite3.Connection, status: str) -> bool:
    """Whether ``runs`` is an older table whose CHECK does not know ``status``."""
    row = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'runs'").fetchone()
    return not (row is None or f"'{status}'" in row[0])


def rebuild_runs_table(conn: sqlite3.Connection) -> None:
    """Rebuild ``runs`` with the current CHECK, rows and ids unchanged. Run it inside one
    transaction, with foreign keys off (``DROP TABLE runs`` would cascade to ``foms``)."""
    start = SCHEMA.index("CREATE TABLE IF NOT EXISTS runs (")
    create = SCHEMA[start:SCHEMA.index(";", start)].replace(
        "CREATE TABLE IF NOT EXISTS runs (", "CREATE TABLE runs_new (")
    conn.execute(create)
    conn.execute("INSERT INTO runs_new SELECT * FROM runs")
    conn.execute("DROP TABLE runs")
    conn.execute("ALTER TABLE runs_new RENAME TO runs")


@cache
def _columns() -> dict[str, tuple[str, ...]]:
    """Every table of :data:`SCHEMA` and its columns, those of older versions first."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(SCHEMA)
        tables = [row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY rowid")]
        return {t: tuple(row[1] for row in conn.execute(f"PRAGMA table_info({t})"))
                for t in tables}
    finally:
        conn.close()


def foreign_problem(conn: sqlite3.Connection, *, writing: bool) -> str | None:
    """Why the database is not one tunelab wrote, or None: it is, or it holds nothing yet
    (no table, or only some of tunelab's tables, empty: a writer killed while creating them).

    A tunelab database has every table of :data:`REQUIRED_TABLES`, and each of tunelab's
    tables it has is a table with (at least) the columns of its version (``noise`` gained
    columns in version 3). Opened ``writing``, a trigger is refused too: tunelab never makes
    one, and one would change rows that tunelab does not write."""
    objects = dict(conn.execute(
        "SELECT name, type FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' AND "
        "type IN ('table', 'view', 'trigger')").fetchall())
    expected = _columns()
    for name, kind in objects.items():
        if name not in expected:
            if kind == "trigger" and writing:
                return (f"it holds the trigger {name}, which tunelab never makes: it would "
                        "change rows behind tunelab's writes")
            continue
        if kind != "table":
            return f"its {name} is a {kind}, not a table"
        have = {row[1] for row in conn.execute(f"PRAGMA table_info({name})")}
        lacking = [c for c in expected[name] if c not in have and
                   not (name == "noise" and c in NOISE_COLUMNS)]
        if lacking:
            return f"its table {name} has no column {', '.join(lacking)}"
    missing = sorted(REQUIRED_TABLES - objects.keys())
    if not missing:
        return None
    others = sorted(n for n, kind in objects.items() if kind == "table" and n not in expected)
    if others:
        return f"it holds the tables {', '.join(others[:5])}, and no {', '.join(missing)}"
    if any(conn.execute(f"SELECT 1 FROM {name} LIMIT 1").fetchone() for name in objects
           if name in expected):
        return f"it has no table {', '.join(missing)}"
    return None
