"""A writer to be killed in the middle of a transaction: ``killed_writer.py DB MODE [commit]``.

Opens ``DB`` as tunelab does (``sqlite3.connect``, ``journal_mode`` MODE: ``wal`` as tunelab,
``delete`` as a program writing in rollback mode); with ``commit``, first commits every
figure of merit set to 2.5. Then it begins a transaction that adds 1000 to every figure of
merit, renames the study ``HALF`` and writes enough (with a tiny page cache) that its pages
reach the database file (rollback mode) or the write-ahead log (WAL) before any COMMIT;
prints ``inside`` and waits, inside the transaction, for the SIGKILL that never lets it
commit.
"""

from __future__ import annotations

import sqlite3
import sys

db, mode = sys.argv[1], sys.argv[2]
conn = sqlite3.connect(db, timeout=30, isolation_level=None)
conn.execute(f"PRAGMA journal_mode={mode}")
conn.execute("PRAGMA synchronous=NORMAL")
if sys.argv[3:] == ["commit"]:
    conn.execute("UPDATE foms SET value = 2.5 WHERE name = 'v'")
conn.execute("PRAGMA cache_size=5")  # pages spill to the file before the COMMIT
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE foms SET value = value + 1000")
conn.execute("UPDATE meta SET value = 'HALF' WHERE key = 'study_name'")
for _ in range(100):
    conn.execute("INSERT INTO sysinfo (taken_at, snapshot) VALUES ('now', ?)", ("x" * 4000,))
print("inside", flush=True)
sys.stdin.read()  # until killed
