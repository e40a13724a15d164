"""Shared helpers of the qe workload tests (imported by name: tests/ has no packages)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"

needs_pw = pytest.mark.skipif(
    shutil.which("pw.x") is None or shutil.which("mpirun") is None,
    reason="pw.x (quantum-espresso) and mpirun (openmpi-bin) are needed",
)

