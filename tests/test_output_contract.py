"""The output contract of every command (issue 21, item 3): each ``--format`` is what it
says (``status`` and ``space`` in CSV and Markdown too), a reader that leaves early ends
tunelab quietly with exit status 0, ``space`` takes a study directory like every other
command. Real studies, real processes, real pipes."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PY, tunelab
from tests.test_cli import study
from tunelab.store import STATUSES

COMMANDS_WITH_FORMAT = ("compare", "best", "status", "space", "workloads")


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished study with a baseline and one failing point."""
    tmp = tmp_path_factory.mktemp("contract")
    path = study(tmp, modes="[ok, crash]", xs="[1, 3]", repeats=2,
                 extra="baseline: {mode: ok, x: 3}\n")
    res = tunelab("run", path, "--dir", tmp / "d", "-q", cwd=tmp)
    assert res.returncode == 1, res.stderr  # the crash points failed
    return tmp / "d"


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished study whose runs all succeeded."""
    tmp = tmp_path_factory.mktemp("clean")
    res = tunelab("run", study(tmp, repeats=2), "--dir", tmp / "d", "-q", cwd=tmp)
    assert res.returncode == 0, res.stderr
    return tmp / "d"


def _argv(command: str, directory: Path) -> list[str]:
    return [] if command == "workloads" else [str(directory)]


# --- CSV: a header and rows, never an empty line -----------------------------------------


@pytest.mark.parametrize("command", COMMANDS_WITH_FORMAT)
@pytest.mark.parametrize("which", ["finished", "clean"])
def test_csv_of_every_command_is_a_table(command, which, request):
    directory = request.getfixturevalue(which)
    res = tunelab(command, *_argv(command, directory), "--format", "csv")
    assert res.returncode in (0, 1), res.stderr
    assert res.stdout.strip(), f"{command}: empty CSV"
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert rows and all(len(row) > 1 for row in rows), res.stdout
    assert not res.stdout.startswith("\n")


def test_status_csv_is_one_row_of_progress_with_every_status(finished, clean):
    for directory, failed in ((finished, 4), (clean, 0)):
        [row] = list(csv.DictReader(io.StringIO(tunelab("status", directory, "--format",
                                                        "csv").stdout)))
        assert row["study"] == "s" and row["planned"] == row["done"]
        assert set(STATUSES) <= set(row) and int(row["failed"]) == failed
        assert sum(int(row[s]) for s in STATUSES) == int(row["done"])


# --- Markdown: tables and lists, no plain lines mixed in ---------------------------------


def _plain_lines(markdown: str) -> list[str]:
    """Lines of ``markdown`` that are neither a table row, a list item, a bold title nor
    blank."""
    return [line for line in markdown.splitlines()
            if line.strip() and not line.startswith(("|", "- ", "**"))]


@pytest.mark.parametrize("command", COMMANDS_WITH_FORMAT)
def test_markdown_of_every_command_is_tables_and_lists(command, finished):
    res = tunelab(command, *_argv(command, finished), "--format", "markdown")
    assert res.returncode in (0, 1), res.stderr
    assert "\n|---" in res.stdout or res.stdout.startswith("- "), res.stdout
    # a single sentence after a table is a paragraph (notes); never a run of plain lines
    plain = _plain_lines(res.stdout)
    blocks = [b for b in re.split(r"\n\s*\n", res.stdout) if b.strip()]
    for block in blocks:
        lines = block.splitlines()
        if len(lines) > 1 and not lines[0].startswith(("|", "- ", "**")):
            assert all(ln.startswith(("- ", "|")) for ln in lines[1:]), (command, block)
    assert len(plain) <= len(blocks), (command, plain)


def test_status_markdown_is_a_table_of_progress(finished):
    md = tunelab("status", finished, "--format", "markdown").stdout
    header = next(line for line in md.splitlines() if line.startswith("| study"))
    assert "| done |" in header and "| failed |" in header
    assert "| 8 | 8 | 4 | 4 | 0 |" in md, md


def test_space_markdown_lists_the_workload_facts(tmp_path):
    path = study(tmp_path)
    md = tunelab("space", path, "--format", "markdown").stdout
    assert _plain_lines(md) == ["will run 3 points x 3 repeats = 9 runs"], md
    assert "| combinations | valid | parameters |" in md


# --- a reader that leaves early ------------------------------------------------------------


def _closed_pipe_run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run tunelab with a standard output whose reader is already gone (``| head -c 0``,
    decided before it starts: the first write fails with EPIPE)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([PY, "-m", "tunelab", *argv], stdout=write,
                              stderr=subprocess.PIPE, text=True, cwd=cwd, timeout=300)
    finally:
        os.close(write)


def _every_writer(d: Path, spec: Path) -> list[list[str]]:
    return [
        ["compare", str(d)], ["compare", str(d), "--format", "json"], ["best", str(d)],
        ["status", str(d)], ["status", str(d), "--format", "csv"], ["space", str(spec)],
        ["space", str(d)], ["workloads"], ["export", str(d), "-f", "parquet", "-o", "-"],
        ["export", str(d), "-f", "csv"], ["export", str(d), "-f", "json", "-o", "-"],
        ["script", str(d), "-s", "slurm"], ["report", str(d), "-o", str(d.parent / "r.html")],
        ["run", str(spec), "--dry-run"], ["run", str(spec), "--dir", str(d)],
        ["--help"], ["--version"], ["run", "--help"], ["bench", "ddp", "--help"],
        ["compare", str(d), str(d)],
    ]


def test_every_command_ends_quietly_when_its_reader_leaves(clean):
    spec = clean.parent / "s.yaml"
    for argv in _every_writer(clean, spec):
        res = _closed_pipe_run(argv, clean.parent)
        assert res.returncode == 0, (argv, res.returncode, res.stderr)
        assert "Broken pipe" not in res.stderr and "error" not in res.stderr, (argv, res.stderr)
        assert "Traceback" not in res.stderr and "Exception ignored" not in res.stderr


def test_export_parquet_into_head_ends_with_status_0(clean):
    proc = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {PY} -m tunelab export {clean} -f parquet -o - "
                       "| head -c 100 > /dev/null; echo ${PIPESTATUS[0]}"],
        capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "0", proc.stdout + proc.stderr
    assert "Broken pipe" not in proc.stderr and "error" not in proc.stderr


# --- space takes a study directory -----------------------------------------------------------


def test_space_reads_a_study_directory_s_stored_study(clean):
    from_dir = tunelab("space", clean, "--format", "json")
    assert from_dir.returncode == 0, from_dir.stderr
    from_file = tunelab("space", clean.parent / "s.yaml", "--format", "json")
    assert json.loads(from_dir.stdout) == json.loads(from_file.stdout)


def test_space_of_a_directory_that_is_no_study_names_both_kinds(tmp_path):
    res = tunelab("space", tmp_path)
    assert res.returncode == 2
    assert "is a directory" in res.stderr and "tunelab.db" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
