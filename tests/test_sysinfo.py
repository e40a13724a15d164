"""The machine snapshot's tool version probes: they leave the user's cwd as it was."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tunelab.sysinfo import snapshot


def test_a_probe_that_writes_files_leaves_the_cwd_clean(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe that reads stdin and drops files (as a bare pw.x does) writes them elsewhere."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    probe = [sys.executable, "-c",
             "import sys; data = sys.stdin.read(); open('CRASH', 'w').write('x'); "
             "print('probe 1.0', len(data))"]
    snap = snapshot({"probe": probe})
    assert snap["tools"]["probe"] == "probe 1.0 0"
    assert list(cwd.iterdir()) == []


@pytest.mark.skipif(shutil.which("pw.x") is None, reason="pw.x (quantum-espresso) is needed")
def test_the_pw_x_banner_probe_leaves_no_crash_file(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The qe workload's probe (pw.x with no input) writes CRASH and input_tmp.in where it runs."""
    monkeypatch.chdir(tmp_path)
    snap = snapshot({"pw.x": ["pw.x"]})
    assert "PWSCF" in snap["tools"]["pw.x"]
    assert list(tmp_path.iterdir()) == []
