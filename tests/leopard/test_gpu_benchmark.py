"""The device check a GPU session runs for Leopard — ``scripts/gpu-check.sh leopard``, which
runs ``benchmarks/leopard_gpu.py`` — rehearsed at tiny sizes on a CPU: every part runs and
prints its figures beside the command that produced them, and what comes back fits the device
tool's limits. The script's bad invocations are one line and exit 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "scripts" / "gpu-check.sh"
PARTS = ("gemm", "flops", "data", "training", "profile", "prediction", "pr_auc", "recipe")


def probe_wheel(folder: Path) -> Path:
    """A wheel of nothing: the GPU check installs the carried wheels first, whatever they are."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "gpu_check_probe-0.0.0-py3-none-any.whl"
    info = "gpu_check_probe-0.0.0.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{info}/METADATA",
                   "Metadata-Version: 2.1\nName: gpu-check-probe\nVersion: 0.0.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: tunelab-tests\n"
                                    "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", f"{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
    return folder


def gpu_check(*args: str, env: dict[str, str] | None = None,
              timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``bash scripts/gpu-check.sh ARGS`` with this interpreter as the rehearsal's Python."""
    full = {k: v for k, v in os.environ.items() if k != "OUT"}
    full.update({"GPU_PYTHON": sys.executable, **(env or {})})
    return subprocess.run(["bash", str(CHECK), *args], capture_output=True, text=True,
                          timeout=timeout, env=full, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("args", "env", "says"), [
    (["leopard-typo"], {}, "usage: bash scripts/gpu-check.sh [--rehearse] leopard|ddp"),
    (["leopard"], {}, "OUT is unset"),
    (["--rehearse", "ddp"], {"GPU_WHEELS": "/nonexistent"},
     "no wheels in /nonexistent: run bash scripts/gpu-wheels.sh --python-version 3.11"),
])
def test_a_bad_invocation_is_one_line_and_exit_2(args: list[str], env: dict[str, str],
                                                 says: str) -> None:
    r = gpu_check(*args, env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stdout == ""


@pytest.mark.slow  # 20 s on a quiet 2-core machine, 150 s on a busy one
def test_the_leopard_gpu_check_runs_tiny_on_a_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = gpu_check("--rehearse", "leopard", timeout=900, env={
        "GPU_WHEELS": str(probe_wheel(tmp_path / "wheels")), "OUT": str(out),
        "SECONDS_TOTAL": "445", "SUITE": "0"})  # the benchmark's budget: ~400 s
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    figures = json.loads((out / "leopard_gpu.json").read_text())
    for part in PARTS:
        assert part in figures and "error" not in figures[part], (part, r.stdout[-3000:])
    text = r.stdout
    assert "!!" not in text  # no part failed
    assert re.search(r"### benchmarks/leopard_gpu.py --budget \d+", text), text[:2000]
    assert text.count("$ python -m tunelab.leopard train") >= 6
    assert "$ python -m tunelab.leopard predict" in text
    assert "of the bf16 GEMM rate" in text and "of the cpu fp32 GEMM rate" in text
    assert figures["recipe"]["finished"] and figures["recipe"]["steps_done"] == 8
    assert len(figures["pr_auc"]["cpu"]) == 3  # three seeds of the CPU path
    assert 0.0 <= figures["recipe"]["val_pr_auc"] <= 1.0
    profile = figures["profile"]  # the step's operators by time, the most expensive first
    assert profile["top"] and profile["busy_ms"] > 0
    assert [t["ms"] for t in profile["top"]] == sorted((t["ms"] for t in profile["top"]),
                                                       reverse=True)
    phases = figures["prediction"]["phases"]  # where the prediction's wall time went
    assert abs(sum(phases[k] for k in ("load_s", "runtime_s", "start_s", "run_s", "close_s"))
               - figures["prediction"]["wall_s"]) < 1e-3
    # what the device tool brings back: at most 8 plain files; the `-m cuda` tests collected
    back = sorted(p.name for p in out.iterdir())
    assert back == ["cuda_tests.txt", "leopard_gpu.json", "leopard_gpu.txt",
                    "leopard_gpu_logs.tgz", "machine.txt"], back
    assert "skipped" in (out / "cuda_tests.txt").read_text()  # no CUDA here, none failed
    assert "FAILED" not in text
