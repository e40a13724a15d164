"""Run the real merge benchmark as a program (``python -m tunelab.bench.merge``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import env_with_pythonpath

SRC = Path(__file__).resolve().parents[2] / "src"


def run_bench(*args: str, python: str | None = None, env: dict[str, str] | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the benchmark CLI in a fresh process; stdout/stderr captured as text."""
    full_env = {**env_with_pythonpath(SRC), **(env or {})}
    return subprocess.run([python or sys.executable, "-m", "tunelab.bench.merge", *args],
                          capture_output=True, text=True, env=full_env, timeout=timeout)


def result_line(stdout: str) -> dict[str, Any]:
    """The final JSON line of a run."""
    last = stdout.strip().splitlines()[-1]
    record = json.loads(last)
    assert record["benchmark"] == "merge"
    return record
