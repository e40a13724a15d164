"""The results store: one SQLite database per study directory.

The tables are described, versioned and migrated in :mod:`tunelab.store.schema`.

A run is written in one transaction together with its figures of merit, only once it has
finished: a crash or ``kill -9`` loses at most the run in flight, never a finished one, and
never leaves half a run behind. The database runs in WAL mode; one ``tunelab run`` at a
time holds the study directory's lock (see :class:`StudyLock`).

Only ``tunelab run`` (and ``status`` collecting batch jobs) opens a store for writing
(``open_store(dir, create=True)`` or ``write=True``); every other command opens it read-only
(SQLite's ``mode=ro``, or ``immutable=1`` where even that cannot work, e.g. a WAL database on
a read-only file system), so a study on a read-only medium can still be read. A write that
fails (read-only, disk full, I/O error) rolls its transaction back and raises
:class:`~tunelab.errors.StoreError` naming the database: the store stays as it was, and the
study resumes once the cause is fixed.

Import from here; the modules behind it, lowest first: :mod:`~tunelab.store.schema` (tables,
versions, migrations), :mod:`~tunelab.store.values` (what each column must hold, checked on
every open), :mod:`~tunelab.store.lock` (:class:`StudyLock`), :mod:`~tunelab.store.recover`
(a hot rollback journal, rolled back for the read-only commands),
:mod:`~tunelab.store.frame` (the pandas runs table), :mod:`~tunelab.store.database`
(:class:`Store`, :class:`RunRecord`, :class:`StoredJob`), :mod:`~tunelab.store.connect`
(:func:`open_store`).
"""

from __future__ import annotations

from tunelab.store.connect import open_store
from tunelab.store.database import RunRecord, Store, StoredJob
from tunelab.store.lock import StudyLock
from tunelab.store.schema import DB_NAME
from tunelab.store.schema import NOISE_COLUMNS as NOISE_COLUMNS
from tunelab.store.schema import SCHEMA_VERSION as SCHEMA_VERSION
from tunelab.store.schema import STATUSES as STATUSES

__all__ = ["DB_NAME", "RunRecord", "Store", "StoredJob", "StudyLock", "open_store"]
