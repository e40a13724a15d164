"""A store that an interrupted writer left needing recovery: a real writer ``kill -9``'d in
the middle of a transaction (``killed_writer.py``, which says when it is inside it), in WAL
mode as tunelab writes and in rollback mode (a hot ``tunelab.db-journal``), and a journal of
garbage. Every read-only command reads the committed rows, never half a transaction, and
says nothing of damage; where it cannot recover the store, it says so in one line.
"""

from __future__ import annotations

import csv
import io
import random
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.hardening.conftest import (
    PY,
    assert_clean,
    finished_two_run_study,
    read_only_view,
)
from tunelab.store import StudyLock
from tunelab.store.recover import wal_without_index

WRITER = Path(__file__).with_name("killed_writer.py")
READERS = [["status"], ["status", "--format", "json"], ["compare"], ["best"],
           ["export", "-o", "-"], ["export", "-f", "csv", "-o", "-"], ["report", "-o", "r.html"]]


@pytest.fixture(scope="module")
def finished(cli) -> Path:
    """A finished study of two runs (figure of merit ``v`` = 1.5), its WAL checkpointed."""
    return finished_two_run_study(cli) / "runs/s"


def left_by(finished: Path, tmp_path: Path, mode: str, *options: str) -> Path:
    """A copy of the study whose store a writer in ``mode`` left, killed inside its
    transaction (see ``killed_writer.py``); the copy's directory."""
    study = tmp_path / "d"
    shutil.copytree(finished, study)
    writer = subprocess.Popen([PY, str(WRITER), str(study / "tunelab.db"), mode, *options],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline() == "inside\n"
    finally:
        writer.kill()
        writer.communicate(timeout=30)
    return study


def foms(answer: dict) -> list[float]:
    """The ``fom.v`` column of ``export``'s CSV."""
    return [float(row["fom.v"]) for row in csv.DictReader(io.StringIO(answer["stdout"]))]


def assert_read(cli, study: Path, expected: list[float]) -> None:
    """Every read-only command reads ``study`` (figures ``expected``), saying nothing of
    damage; the store passes ``quick_check`` and holds no half transaction afterwards."""
    for command in READERS:
        answer = cli.run({}, [command[0], str(study), *command[1:]], cwd=str(study.parent))
        assert_clean(answer, 0)
        for word in ("damaged", "Restore", "error", "journal"):
            assert word not in answer["stderr"], answer["stderr"]
        if command[1:] == ["-f", "csv", "-o", "-"]:
            assert foms(answer) == expected
    assert not Path(f"{study}/tunelab.db-journal").exists()
    conn = sqlite3.connect(f"file:{study}/tunelab.db?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA quick_check").fetchall() == [("ok",)]
        assert conn.execute("SELECT value FROM meta WHERE key = 'study_name'").fetchone() \
            == ("s",)
        assert conn.execute("SELECT count(*) FROM sysinfo").fetchone() == (1,)
    finally:
        conn.close()


def test_a_writer_killed_inside_its_transaction_in_wal_mode_leaves_a_readable_store(
        cli, finished, tmp_path):
    study = left_by(finished, tmp_path, "wal")
    assert Path(f"{study}/tunelab.db-wal").stat().st_size > 0  # uncommitted frames
    assert_read(cli, study, [1.5, 1.5])


def test_a_stale_wal_and_index_are_read_with_what_was_committed(cli, finished, tmp_path):
    study = left_by(finished, tmp_path, "wal", "commit")
    assert Path(f"{study}/tunelab.db-shm").exists()
    assert_read(cli, study, [2.5, 2.5])


def test_a_hot_journal_of_a_killed_writer_is_rolled_back_by_the_read_commands(
        cli, finished, tmp_path):
    """The read-only commands called this store damaged ("attempt to write a readonly
    database") and told the user to restore it from a copy."""
    study = left_by(finished, tmp_path, "delete")
    assert Path(f"{study}/tunelab.db-journal").stat().st_size > 0
    assert_read(cli, study, [1.5, 1.5])


def test_a_journal_of_garbage_is_deleted_and_the_store_left_as_it_was(cli, finished,
                                                                      tmp_path):
    study = tmp_path / "d"
    shutil.copytree(finished, study)
    garbage = random.Random(7).randbytes(10_000)
    assert garbage[0] != 0  # SQLite takes a journal starting with 0 for no journal at all
    Path(f"{study}/tunelab.db-journal").write_bytes(garbage)
    before = (study / "tunelab.db").read_bytes()
    assert_read(cli, study, [1.5, 1.5])
    assert (study / "tunelab.db").read_bytes() == before


def _unchanged(study: Path) -> dict[str, bytes]:
    return {name: (study / name).read_bytes() for name in ("tunelab.db", "tunelab.db-journal")}


@pytest.mark.parametrize("garbage", [False, True])
def test_a_hot_journal_on_a_read_only_medium_is_said_in_one_line(cli, finished, tmp_path,
                                                                  garbage):
    study = left_by(finished, tmp_path, "delete")
    if garbage:
        Path(f"{study}/tunelab.db-journal").write_bytes(b"\xff" * 600)
    before = _unchanged(study)
    with read_only_view(study) as view:
        for command in READERS:
            answer = cli.run({}, [command[0], str(view), *command[1:]], cwd=str(tmp_path))
            what = "holds no transaction" if garbage else \
                "was interrupted before it committed"
            assert_clean(answer, 2, what, "nothing", "is lost", "read-only file system",
                         f"cp -r {view} COPY")
            assert "damaged" not in answer["stderr"]
    assert _unchanged(study) == before


def test_a_hot_journal_is_left_alone_while_another_tunelab_holds_the_lock(cli, finished,
                                                                          tmp_path):
    study = left_by(finished, tmp_path, "delete")
    before = _unchanged(study)
    with StudyLock(study).held():
        answer = cli.run({}, ["best", str(study)], cwd=str(tmp_path))
        assert_clean(answer, 2, "was interrupted before it committed", "nothing committed is "
                     "lost", "another tunelab process (pid", "Run this command again")
        assert _unchanged(study) == before
    assert_read(cli, study, [1.5, 1.5])


def test_another_program_s_hot_journal_is_never_rolled_back(cli, tmp_path):
    """foreign_problem is checked on the file as it stands before anything is written."""
    study = tmp_path / "d"
    (study / "runs").mkdir(parents=True)
    conn = sqlite3.connect(study / "tunelab.db")
    conn.executescript("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);"
                       "INSERT INTO users (name) VALUES ('alice');")
    conn.close()
    code = ("import sqlite3, sys\n"
            f"c = sqlite3.connect({str(study / 'tunelab.db')!r}, isolation_level=None)\n"
            "c.execute('PRAGMA cache_size=5'); c.execute('BEGIN')\n"
            "for _ in range(100): c.execute('INSERT INTO users (name) VALUES (?)', ('x' * 4000,))\n"
            "print('inside', flush=True); sys.stdin.read()\n")
    writer = subprocess.Popen([PY, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "inside\n"
    finally:
        writer.kill()
        writer.communicate(timeout=30)
    before = _unchanged(study)
    answer = cli.run({}, ["status", str(study)], cwd=str(tmp_path))
    assert_clean(answer, 2, "was interrupted before it committed",
                 "does not look like tunelab's", "sqlite3 ")
    assert _unchanged(study) == before


@pytest.mark.parametrize("index", [True, False])
def test_a_wal_holding_commits_on_a_read_only_medium_is_read_or_said_in_one_line(
        cli, finished, tmp_path, index):
    """A WAL beside its index is read as it stands. Without its index (``-shm``, e.g. not
    copied) SQLite cannot read the WAL on a read-only medium: the commands called the store
    damaged; reading the file alone would lose the commits that only the WAL holds."""
    study = left_by(finished, tmp_path, "wal", "commit")
    if not index:
        Path(f"{study}/tunelab.db-shm").unlink()
    with read_only_view(study) as view:
        for command in READERS:
            answer = cli.run({}, [command[0], str(view), *command[1:]], cwd=str(tmp_path))
            if index:
                assert_clean(answer, 0)
                if command[1:] == ["-f", "csv", "-o", "-"]:
                    assert foms(answer) == [2.5, 2.5]
                continue
            assert_clean(answer, 2, "tunelab.db-wal", "tunelab.db-shm", "nothing", "is lost",
                         "read-only file system", f"cp -r {view} COPY")
            assert "damaged" not in answer["stderr"]


def test_a_wal_without_its_index_is_named_only_where_it_holds_frames(tmp_path):
    """Off a read-only medium the advice is to run once as a user who can write."""
    db = tmp_path / "tunelab.db"
    db.write_bytes(b"")
    assert wal_without_index(db) is None  # no log
    Path(f"{db}-wal").write_bytes(b"")
    assert wal_without_index(db) is None  # an empty log holds nothing
    Path(f"{db}-wal").write_bytes(b"\x37\x7f\x06\x82" + bytes(28))
    problem = wal_without_index(db)
    assert problem is not None
    assert "tunelab.db-shm is missing" in str(problem)
    assert f"tunelab status {tmp_path}" in str(problem)
    Path(f"{db}-shm").write_bytes(b"")
    assert wal_without_index(db) is None  # the index is there
