"""The host memory a CPU run needs, refused up front when this machine does not have it."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import env_with_pythonpath
from tunelab.bench.ddp.config import DDPConfig
from tunelab.bench.ddp.memory import check_memory, worker_bytes
from tunelab.errors import WorkloadError

pytest.importorskip("torch")


def test_the_estimate_counts_batch_model_and_saved_activations() -> None:
    leopard = DDPConfig(model="leopard", batch_size=64).validate()
    # measured on the CPU: 0.42 GB more RSS after two steps of 64 windows of 2,048 bp
    assert 0.3e9 < worker_bytes(leopard) < 0.8e9
    double = DDPConfig(model="leopard", batch_size=128).validate()
    assert worker_bytes(double) > 1.8 * worker_bytes(leopard) - 0.1e9
    # an emulated accelerator holds its batch (and real gradient buffers to all-reduce)
    emulated = DDPConfig(model="resnet50", batch_size=64, compute="emulate:0.1").validate()
    assert worker_bytes(emulated) == 64 * 3 * 224 * 224 * 4 * 2
    real_ar = DDPConfig(model="resnet50", batch_size=128, workers=2, compute="emulate:0.1",
                        allreduce="real").validate()
    assert worker_bytes(real_ar) == worker_bytes(emulated) + 4 * 25_557_032


def test_a_run_larger_than_the_memory_is_refused_naming_the_need() -> None:
    cfg = DDPConfig(model="leopard", batch_size=64, workers=2).validate()
    need = 2 * worker_bytes(cfg)
    check_memory(cfg, need)  # fits exactly
    with pytest.raises(WorkloadError, match=r"--model leopard --batch-size 64 on 2 worker\(s\) "
                                            r"needs about .* GB of memory .* use a smaller "
                                            r"--batch-size or --window"):
        check_memory(cfg, need - 1)


def test_the_cli_refuses_a_batch_beyond_the_memory_before_starting() -> None:
    # field test: 65,536 images of 1,024 px were tried in the worker, which failed in its
    # setup phase on a 206 GB allocation (exit 4); a size the allocator grants would have
    # taken the shared machine's memory instead
    env = env_with_pythonpath(Path(__file__).resolve().parents[2] / "src")
    proc = subprocess.run(
        [sys.executable, "-m", "tunelab.bench.ddp", "--model", "resnet18", "--image-size",
         "1024", "-b", "65536", "--steps", "1", "--warmup", "0", "--device", "cpu"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tempfile.gettempdir())
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "ddp: error: --model resnet18 --batch-size 65536 on 1 worker(s) needs about "), lines
