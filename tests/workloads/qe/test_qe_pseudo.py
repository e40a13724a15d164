"""The project's Ce pseudopotential: line re-wrapping and real generation with ld1.x."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tunelab.errors import WorkloadError
from tunelab.workloads.qe.pseudo import (
    CE_PSEUDO,
    ensure_pseudo,
    generate_pseudo,
    pseudo_cache_dir,
    rewrap_long_lines,
)

needs_ld1 = pytest.mark.skipif(shutil.which("ld1.x") is None, reason="ld1.x is needed")


def test_rewrap_splits_only_long_numeric_lines() -> None:
    numbers = [f"{i * 0.125:.16E}" for i in range(60)]
    long_line = "  ".join(numbers)
    assert len(long_line) > 1000
    long_text = "x" * 1200
    text = f"<PP_MULTIPOLES>\n{long_line}\n</PP_MULTIPOLES>\n{long_text}\n 1.0 2.0\n"
    out = rewrap_long_lines(text, per_line=4)
    lines = out.splitlines()
    assert max(len(ln) for ln in lines if not ln.startswith("x")) <= 1000
    assert lines[0] == "<PP_MULTIPOLES>" and lines[-1] == " 1.0 2.0"
    assert long_text in lines  # not numeric: left alone
    assert out.split()[1:61] == numbers  # same numbers, same order
    assert rewrap_long_lines(out) == out


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.setenv("TUNELAB_PSEUDO_DIR", str(tmp_path / "p"))
    assert pseudo_cache_dir() == tmp_path / "p"
    monkeypatch.delenv("TUNELAB_PSEUDO_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "c"))
    assert pseudo_cache_dir() == tmp_path / "c" / "tunelab" / "pseudo"


def test_unknown_pseudo_and_missing_ld1(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="no generator"):
        generate_pseudo("U.UPF", tmp_path)
    with pytest.raises(WorkloadError, match="quantum-espresso"):
        generate_pseudo(CE_PSEUDO, tmp_path, ld1="no-such-ld1.x")


@pytest.mark.slow
@needs_ld1
def test_generation_is_real_readable_and_idempotent(tmp_path: Path) -> None:
    path = ensure_pseudo(CE_PSEUDO, tmp_path)
    text = path.read_text()
    header = re.search(r"<PP_HEADER[^>]*>", text)
    assert header is not None
    assert 'element="Ce"' in header.group(0)
    assert 'is_paw="true"' in header.group(0)
    zval = re.search(r'z_valence="([^"]+)"', header.group(0))
    assert zval is not None and float(zval.group(1)) == 11.0  # 4f in the core
    assert max(len(line) for line in text.splitlines()) <= 1000
    assert "PP_PAW" in text
    mtime = path.stat().st_mtime_ns
    assert ensure_pseudo(CE_PSEUDO, tmp_path) == path
    assert path.stat().st_mtime_ns == mtime  # nothing regenerated
    # A stale file (a long line, as ld1.x writes it) is regenerated.
    path.write_text(text + "1.0 " * 400 + "\n")
    ensure_pseudo(CE_PSEUDO, tmp_path)
    assert max(len(line) for line in path.read_text().splitlines()) <= 1000


def test_the_set_up_command_runs_without_runpy_s_warning() -> None:
    """``make demo`` printed runpy's "'tunelab.workloads.qe.pseudo' found in sys.modules
    after import of package … may result in unpredictable behaviour" during set-up: the
    package imported the module before ``-m`` ran it."""
    run = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m",
                          "tunelab.workloads.qe.pseudo", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "RuntimeWarning" not in run.stderr, run.stderr


@pytest.mark.slow
@needs_ld1
def test_module_entry_point(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "tunelab.workloads.qe.pseudo", "--ensure", "--dir", str(tmp_path)]
    first = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert str(tmp_path / CE_PSEUDO) in first.stdout
    second = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert second.stdout.startswith(str(tmp_path / CE_PSEUDO))
