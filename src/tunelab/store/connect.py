"""Opening a study's store: read-only for every command, for writing for ``tunelab run``.

Only ``tunelab run`` (and ``status`` collecting batch jobs) opens a store for writing
(``open_store(dir, create=True)`` or ``write=True``): WAL mode, the schema created or brought
up to date (:func:`~tunelab.store.schema.create_schema`). Every other command opens it
read-only (SQLite's ``mode=ro``, or ``immutable=1`` where even that cannot work, e.g. a WAL
database on a read-only file system), so a study on a read-only medium can still be read
(not one whose write-ahead log lies there without its index: that is said in one line).

Every open checks the database first (SQLite's ``quick_check``, then every value against
what tunelab writes there: :func:`~tunelab.store.values.check_values`): a damaged file is
refused in one line by every command, never read in part or written to; so is a database
truncated to 0 bytes beside the files of earlier runs, which SQLite would take for a new one,
and a database of another program (:func:`~tunelab.store.schema.foreign_problem`), which
``run`` would otherwise fill with tunelab's tables. A store that an interrupted writer left
with a hot rollback journal is not damaged: a read-only open rolls the journal back first
(:mod:`tunelab.store.recover`), or says in one line why it cannot and what recovers it.
"""

from __future__ import annotations

import errno
import sqlite3
import stat
from pathlib import Path

from tunelab.errors import StoreError
from tunelab.store.database import GuardedConnection, Store
from tunelab.store.recover import (
    HotJournal,
    cannot_write,
    file_uri,
    needs_rollback,
    roll_back_journal,
    wal_without_index,
)
from tunelab.store.schema import (
    DB_NAME,
    REQUIRED_TABLES,
    SCHEMA_VERSION,
    create_schema,
    foreign_problem,
)
from tunelab.store.values import check_values

RUNS_DIR = "runs"
"""Where a study's runs leave their files (``runs/<point>/r<repeat>``)."""
BUSY_TIMEOUT_S = 30.0
"""How long opening a store waits for another process's lock on the database."""

__all__ = ["open_store"]


def open_store(study_dir: str | Path, *, create: bool = False, write: bool = False) -> Store:
    """Open the store of ``study_dir``: read-only; with ``write`` for writing an existing
    store; with ``create`` for writing, making the directory and the schema as needed."""
    study_dir = Path(study_dir)
    path = study_dir / DB_NAME
    try:
        found = path.stat()
    except OSError as exc:
        found = None
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):  # too long, closed, a loop
            name = str(study_dir)
            shown = name if len(name) <= 200 else f"{name[:100]}…{name[-60:]}"
            raise StoreError(f"{shown}: {exc.strerror or exc}") from None
    if found is not None and not stat.S_ISREG(found.st_mode):  # a FIFO, a device, a directory
        raise StoreError(f"{study_dir}: {DB_NAME} is not a regular file")
    if not create or write:
        if found is None:
            what = ("no such directory" if not study_dir.exists()
                    else "a file, not a study directory" if not study_dir.is_dir()
                    else f"not a tunelab study directory (no {DB_NAME})")
            raise StoreError(f"{study_dir}: {what}")
        if not write:
            return Store(_connect_readonly(path), path)
    try:
        study_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create {study_dir}: {exc.strerror or exc}") from None
    _refuse_truncated(path)
    try:
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, factory=GuardedConnection)
        if path.stat().st_size:
            _check_intact(conn, path)
            _check_tunelab(conn, path, writing=True)
            check_values(conn, path)
            _check_version(conn, path)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        create_schema(conn)
    except sqlite3.Error as exc:
        if _is_locked(exc):
            raise _locked(path) from None
        raise StoreError(f"{path}: cannot open the results database for writing: {exc}") \
            from None
    except StoreError:
        conn.close()
        raise
    return Store(conn, path)


def _refuse_truncated(path: Path) -> None:
    """Refuse a database emptied to 0 bytes while the runs it recorded left their
    directories: SQLite would take it for a new database and the study would start over."""
    try:
        empty = path.stat().st_size == 0
        runs = path.parent / RUNS_DIR
        leftovers = empty and runs.is_dir() and next(runs.iterdir(), None) is not None
    except OSError:
        return  # a missing file is a new study; other faults surface when it is opened
    if leftovers:
        raise StoreError(f"{path}: is empty (0 bytes), but {runs} holds the files of earlier "
                         "runs: the results database was truncated. Restore it from a copy, "
                         "or remove it and runs/ to start the study over")


def _check_intact(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a damaged database before anything reads or writes it: SQLite's
    ``quick_check`` (every page and b-tree, without the slower index cross-checks)."""
    try:
        row = conn.execute("PRAGMA quick_check(1)").fetchone()
        problem = None if row is not None and row[0] == "ok" else str(row[0] if row else "?")
    except sqlite3.DatabaseError as exc:
        if _is_locked(exc):
            raise _locked(path) from None
        if needs_rollback(exc):  # a hot journal that this connection may not roll back
            raise cannot_write(path, f"{path.name} is opened read-only") from None
        unindexed = wal_without_index(path)
        if unindexed is not None and _error_code(exc) == sqlite3.SQLITE_CANTOPEN:
            raise unindexed from None  # immutable=1 would read the file without the log
        problem = str(exc)
    if problem is not None:
        if problem.startswith(("CHECK constraint failed", "NULL value in")):
            check_values(conn, path)  # a value broke a rule: name it, if it knows the rule
        detail = next((line for line in problem.splitlines() if not line.startswith("***")),
                      problem)
        raise StoreError(f"{path}: the results database is damaged ({detail}); "
                         "nothing was read or changed. Restore it from a copy, or save what "
                         f"SQLite can still read with: sqlite3 {path} .recover")


def _error_code(exc: sqlite3.Error) -> int | None:
    """SQLite's primary result code of ``exc`` (None where it gives none)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def _is_locked(exc: sqlite3.Error) -> bool:
    """Whether SQLite gave up waiting for another connection's lock (not a damaged file)."""
    return _error_code(exc) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _locked(path: Path) -> StoreError:
    return StoreError(f"{path}: another process holds the results database locked (waited "
                      f"{BUSY_TIMEOUT_S:g} s): another tunelab run, or a program such as sqlite3 "
                      "in the middle of a transaction; nothing was read or changed. Wait for it "
                      f"to finish, or find it with: fuser -v {path}")


def _check_tunelab(conn: sqlite3.Connection, path: Path, *, writing: bool) -> None:
    """Refuse a database that another program wrote, before anything reads or writes it."""
    problem = foreign_problem(conn, writing=writing)
    if problem is not None:
        raise StoreError(f"{path}: is not a tunelab results database ({problem}); nothing "
                         "was read or changed. Move it away, or use another study directory")


def _check_version(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a database that a newer tunelab wrote: its tables may mean what this one does
    not know (a column, a status, a table), so it is neither read in part nor written to."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.OperationalError:  # no meta table yet: a store being created
        return
    if row is not None and str(row[0]).isdigit() and int(row[0]) > SCHEMA_VERSION:
        raise StoreError(f"{path}: was written by a newer tunelab (results schema {row[0]}; "
                         f"this tunelab knows schemas up to {SCHEMA_VERSION}); nothing was "
                         "read or changed. Use the tunelab that wrote it, or a newer one")


def _connect_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection (:func:`_open_readonly`); a hot journal that an interrupted
    writer left is rolled back first (:func:`~tunelab.store.recover.roll_back_journal`)."""
    try:
        return _open_readonly(path)
    except HotJournal:
        try:
            roll_back_journal(path, timeout=BUSY_TIMEOUT_S)
        except sqlite3.Error:  # roll_back_journal lets only a foreign lock through
            raise _locked(path) from None
    return _open_readonly(path)


def _open_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection: ``mode=ro``, or ``immutable=1`` when the directory or the
    medium cannot be written at all (then SQLite takes no locks and reads the file as is;
    never beside a hot journal, whose transaction it would read in part)."""
    problem: sqlite3.Error | None = None
    for options in ("mode=ro", "mode=ro&immutable=1"):
        try:
            conn = sqlite3.connect(file_uri(path, options), uri=True, timeout=BUSY_TIMEOUT_S)
        except sqlite3.Error as exc:
            problem = exc
            continue
        try:
            _check_intact(conn, path)
            _check_tunelab(conn, path, writing=False)
            tables = {row[0] for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not tables >= REQUIRED_TABLES:
                conn.close()
                if not tables and path.stat().st_size == 0:
                    raise StoreError(f"{path}: is empty (0 bytes): no run was recorded, or "
                                     "the results database was truncated")
                raise StoreError(f"{path}: holds no tunelab results yet (the run that "
                                 "created it was stopped before it had made its tables)")
            check_values(conn, path)
            _check_version(conn, path)
            return conn
        except StoreError:
            conn.close()
            raise
        except sqlite3.DatabaseError as exc:
            conn.close()
            if _is_locked(exc):
                raise _locked(path) from None
            if needs_rollback(exc):  # a journal left since quick_check: never immutable=1
                raise cannot_write(path, f"{path.name} is opened read-only") from None
            problem = exc
            if "not a database" in str(exc) or "malformed" in str(exc):
                break
    raise StoreError(f"{path}: cannot read the results database: {problem}")
