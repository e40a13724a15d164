"""A store left with a hot rollback journal: rolled back for the read-only commands, or one
line saying why it cannot be, that nothing is lost, and what recovers it.

A write transaction in SQLite's rollback-journal mode first copies every page it is about
to change into ``tunelab.db-journal``. A writer killed before its COMMIT leaves that journal
"hot" and the database file holding part of the transaction; SQLite rolls the journal back
(restoring the last committed state) the next time a connection that may write reads the
database, and refuses a read-only one (``SQLITE_READONLY_ROLLBACK``, "attempt to write a
readonly database"), which could otherwise read half a transaction. A journal whose header
is not a journal's (garbage) holds no transaction: the connection that may write deletes it
and changes nothing else. (tunelab itself writes in WAL mode, where a killed writer leaves a
write-ahead log that every reader recovers on its own; a hot journal comes from a program
that wrote the store in rollback mode, or from garbage put there.)

:func:`roll_back_journal` does that for a read-only command, never while another tunelab
process holds the study's lock (:class:`~tunelab.store.StudyLock`), and only to a file that,
read as it stands, is tunelab's (:func:`~tunelab.store.schema.foreign_problem`, checked
before the rollback writes anything; the command checks it again afterwards).

A WAL store copied without its index (``tunelab.db-shm``) to a medium that cannot be written
cannot be read either: SQLite rebuilds the index before it reads the write-ahead log, and
the file alone would lack the commits that only the log holds. :func:`wal_without_index`
says so in one line, and what recovers it.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from tunelab.errors import StoreError
from tunelab.store.lock import StudyLock
from tunelab.store.schema import foreign_problem

__all__ = ["HotJournal", "file_uri", "needs_rollback", "roll_back_journal", "wal_without_index"]

JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")
"""The first 8 bytes of a valid rollback journal (SQLite's file format)."""


class HotJournal(StoreError):
    """The database has a hot journal that this process cannot roll back: one line saying
    what happened, that nothing is lost, ``reason`` and ``advice`` (what recovers it)."""

    def __init__(self, path: Path, reason: str, advice: str) -> None:
        journal = journal_path(path)
        if _is_journal(journal):
            what = (f"{path}: a write to it was interrupted before it committed (its process "
                    f"was killed) and left the rollback journal {journal.name}, which must be "
                    "rolled back before the database is read; nothing committed is lost")
        else:
            what = (f"{path}: beside it lies {journal.name}, which holds no transaction (its "
                    "header is not a rollback journal's) but must be deleted before SQLite "
                    "reads the database; nothing is lost")
        super().__init__(f"{what}, but {reason}. {advice}")


def file_uri(path: Path, options: str) -> str:
    """SQLite's ``file:`` URI of the database ``path`` with the query ``options``."""
    return f"file:{quote(str(path.resolve()))}?{options}"


def wal_without_index(path: Path) -> StoreError | None:
    """The error of a read-only open of ``path`` that SQLite could not open because its
    write-ahead log lies there without the log's index and the directory cannot be written
    (None when that is not why): nothing is lost, and what recovers it."""
    wal, index = (path.with_name(path.name + suffix) for suffix in ("-wal", "-shm"))
    try:
        if wal.stat().st_size == 0 or index.exists():
            return None
        read_only = bool(os.statvfs(path.parent).f_flag & os.ST_RDONLY)
    except OSError:
        return None
    what = (f"{path}: its write-ahead log {wal.name} may hold results committed after the "
            f"database file was last written, but the log's index {index.name} is missing "
            "(it was not copied, or was deleted) and")
    if read_only:
        return StoreError(f"{what} {path.parent} is on a read-only file system, where SQLite "
                          "cannot rebuild the index to read the log; nothing is lost. Copy the "
                          "study directory somewhere writable and read the copy: "
                          f"cp -r {path.parent} COPY")
    return StoreError(f"{what} this process cannot write {path.parent} to rebuild it; nothing "
                      f"is lost. Run once, as a user who can: tunelab status {path.parent}")


def journal_path(path: Path) -> Path:
    """The rollback journal of the database ``path``."""
    return path.with_name(path.name + "-journal")


def needs_rollback(exc: sqlite3.Error) -> bool:
    """Whether SQLite refused a read-only connection because of a hot journal."""
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_READONLY_ROLLBACK


def cannot_write(path: Path, why: str) -> HotJournal:
    """The :class:`HotJournal` of a process that cannot write ``path``'s directory."""
    directory = path.parent
    if why == "read-only file system":
        return HotJournal(path, f"{directory} is on a read-only file system",
                          f"Copy the study directory somewhere writable and read the copy: "
                          f"cp -r {directory} COPY")
    done = "rolls it back" if _is_journal(journal_path(path)) else "deletes it"
    return HotJournal(path, f"this process cannot write {directory} ({why})",
                      f"Run once, as a user who can: tunelab status {directory} ({done})")


def roll_back_journal(path: Path, *, timeout: float) -> None:
    """Roll back (or, holding no transaction, delete) the hot journal of ``path`` under the
    study's lock, for a read-only command; raise :class:`HotJournal` where it cannot be. A
    foreign lock on the database comes back as SQLite's busy error after ``timeout``."""
    problem = _foreign_as_it_stands(path)
    if problem is not None:
        raise HotJournal(path, f"as the file stands it does not look like tunelab's ({problem}), "
                         "so tunelab leaves it alone",
                         f"Roll it back with SQLite, then read it again: "
                         f"sqlite3 {path} 'PRAGMA quick_check'")
    lock = StudyLock(path.parent)
    try:
        holder = lock.try_acquire()
    except OSError as exc:
        why = "read-only file system" if exc.errno == errno.EROFS else \
            (exc.strerror or str(exc)).lower()
        raise cannot_write(path, why) from None
    if holder is not None:
        raise HotJournal(path, f"another tunelab process (pid {holder}) holds the study "
                         "directory's lock", "Run this command again once it has finished.")
    try:
        conn = sqlite3.connect(file_uri(path, "mode=rw"), uri=True, timeout=timeout)
        try:  # the first read of a connection that may write rolls the journal back
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY,
                                                       sqlite3.SQLITE_LOCKED):
            raise
        raise cannot_write(path, f"{path.name} is read-only for it" if needs_rollback(exc)
                           else str(exc)) from None
    finally:
        lock.release()


def _foreign_as_it_stands(path: Path) -> str | None:
    """:func:`foreign_problem` of the file as it stands, its journal not applied (SQLite's
    ``immutable`` view: no lock, no journal): checked before the rollback writes to it."""
    try:
        conn = sqlite3.connect(file_uri(path, "mode=ro&immutable=1"), uri=True)
    except sqlite3.Error as exc:
        return f"it cannot be read: {exc}"
    try:
        return foreign_problem(conn, writing=False)
    except sqlite3.DatabaseError as exc:
        return f"it cannot be read: {exc}"
    finally:
        conn.close()


def _is_journal(journal: Path) -> bool:
    """Whether ``journal`` starts as a rollback journal does (unknown: taken as one)."""
    try:
        with journal.open("rb") as f:
            return f.read(len(JOURNAL_MAGIC)) == JOURNAL_MAGIC
    except OSError:
        return True
