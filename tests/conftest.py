"""Shared test helpers: write study files, run the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

PY = sys.executable


def env_with_pythonpath(*first: str | Path) -> dict[str, str]:
    """This process's environment with ``first`` put before its ``PYTHONPATH``, never in place
    of it: where packages reach Python through PYTHONPATH (the GPU machine's carried wheels in
    /tmp/site), a child process must still find them."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, first),
                                         *filter(None, [env.get("PYTHONPATH")])])
    return env


@pytest.fixture
def write_study(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write a study file (dedented YAML) into tmp_path and return its path."""

    def write(text: str, name: str = "study.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip())
        return path

    return write


def tunelab(*args: str | Path, cwd: Path | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the real ``tunelab`` command line."""
    return subprocess.run([PY, "-m", "tunelab", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout)


pytest_plugins = ["tests.cluster_fixtures"]
