"""Fixtures and helpers of the hardening suite: the in-process CLI worker, study texts, and
the checks every hostile input must pass (one line, exit 1 or 2, bounded CPU and memory)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.hardening.worker import CliWorker

PY = sys.executable
CPU_LIMIT_S = 5.0
"""CPU seconds one hostile input may cost tunelab (its children are counted apart)."""
RSS_LIMIT_MB = 500.0
"""Peak resident memory of the process that handled the inputs (imports included)."""


@pytest.fixture(scope="module")
def cli() -> Iterator[CliWorker]:
    """A worker running ``tunelab`` in-process (started once per test module)."""
    worker = CliWorker()
    yield worker
    worker.close()


def command_study(argv: list[str], *, params: str = "x: [1]", extra: str = "",
                  options: str = "", name: str | None = "s") -> str:
    """A study of the ``command`` workload (``argv`` and ``options`` as YAML flow)."""
    head = f"name: {name}\n" if name else ""
    more = f", {options}" if options else ""
    return (f"{head}workload: {{name: command, options: {{argv: {json.dumps(argv)}{more}}}}}\n"
            f"parameters: {{{params}}}\nrepeats: 1\ntimeout: 60\n{extra}")


def printing(text: str) -> list[str]:
    """argv of a program that prints ``text`` (braces escaped for the argv template)."""
    code = f"import sys; sys.stdout.write({text!r})"
    return [PY, "-c", code.replace("{", "{{").replace("}", "}}")]


def assert_clean(answer: dict[str, Any], rc: int, *fragments: str) -> None:
    """Exit status ``rc``; for 2, exactly one line ``tunelab: error: …`` holding every
    fragment; never a traceback or an escaped exception; CPU and memory within the limits."""
    assert answer["escaped"] is None, answer["escaped"]
    err = answer["stderr"]
    assert answer["rc"] == rc, (answer["rc"], err[-2000:])
    assert "Traceback" not in err and "Traceback" not in answer["stdout"]
    if rc == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tunelab: error: "), err[-2000:]
        assert len(lines[0]) < 600, lines[0]
    for fragment in fragments:
        assert fragment in err, (fragment, err[-2000:])
    assert answer["cpu_s"] < CPU_LIMIT_S, answer["cpu_s"]
    assert answer["maxrss_mb"] < RSS_LIMIT_MB, answer["maxrss_mb"]


def finished_two_run_study(cli: CliWorker) -> Path:
    """The directory of a finished study of two runs (figure of merit ``v`` = 1.5), run
    through ``cli``, its WAL checkpointed into ``tunelab.db`` (a store as it rests)."""
    text = command_study(printing("v=1.5\n"), params="x: [1, 2]",
                         options="foms: {v: 'v=(?P<value>\\S+)'}",
                         extra="objective: {fom: v}\nbaseline: {x: 1}\n")
    answer = cli.run({"s.yaml": text}, ["run", "s.yaml", "-q"])
    assert_clean(answer, 0)
    conn = sqlite3.connect(Path(answer["dir"], "runs/s/tunelab.db"))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return Path(answer["dir"])


def store_rows(db: Path) -> list[tuple[str, int, str, str | None]]:
    """(point key, repeat, status, reason) of every stored run, after checking the database's
    integrity."""
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return [(k, int(r), s, why) for k, r, s, why in conn.execute(
            "SELECT p.key, r.repeat, r.status, r.reason FROM runs r "
            "JOIN points p ON p.id = r.point_id ORDER BY r.id")]
    finally:
        conn.close()


def root_can(*argv: str) -> bool:
    """Whether this process is root and ``argv`` (e.g. a mount) succeeds."""
    return os.geteuid() == 0 and subprocess.run(argv, capture_output=True).returncode == 0


@contextmanager
def read_only_view(directory: Path) -> Iterator[Path]:
    """``directory`` seen through a read-only bind mount (skips the test unless root)."""
    view = directory.with_name(directory.name + "-ro")
    view.mkdir()
    if not root_can("mount", "--bind", str(directory), str(view)):
        pytest.skip("needs root to bind-mount")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
        yield view
    finally:
        subprocess.run(["umount", str(view)], check=True)
