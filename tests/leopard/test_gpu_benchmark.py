"""``benchmarks/leopard_gpu.py``, the one script a GPU session runs, at tiny sizes on a CPU:
every part runs and prints its figures beside the command that produced them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "leopard_gpu.py"
PARTS = ("gemm", "flops", "data", "training", "prediction", "pr_auc", "recipe")


@pytest.mark.slow  # 16 s on a quiet 2-core machine, 150 s on a busy one
def test_the_gpu_benchmark_runs_tiny_on_a_cpu(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--device", "cpu", "--budget",
                        "400", "--json", str(tmp_path / "figures.json")],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(SCRIPT.parents[1] / "src")})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    figures = json.loads((tmp_path / "figures.json").read_text())
    for part in PARTS:
        assert part in figures and "error" not in figures[part], (part, r.stdout[-3000:])
    out = r.stdout
    assert "!!" not in out  # no part failed
    assert out.count("$ python -m tunelab.leopard train") >= 6
    assert "$ python -m tunelab.leopard predict" in out
    assert "of the bf16 GEMM rate" in out and "of the cpu fp32 GEMM rate" in out
    assert figures["recipe"]["finished"] and figures["recipe"]["steps_done"] == 8
    assert len(figures["pr_auc"]["cpu"]) == 3  # three seeds of the CPU path
    assert 0.0 <= figures["recipe"]["val_pr_auc"] <= 1.0
