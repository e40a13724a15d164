"""The host memory a CPU run needs, refused up front when this machine does not have it."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import env_with_pythonpath
from tunelab.bench.ddp.config import DDPConfig
from tunelab.bench.ddp.dataset import DatasetIndex, Entry
from tunelab.bench.ddp.memory import (
    AGENT_FACTOR,
    LOADER_BATCH_FACTOR,
    LOADER_RUNTIME,
    RUNTIME_FACTOR,
    Runtime,
    check_loader_memory,
    check_memory,
    job_bytes,
    loader_bytes,
    worker_bytes,
)
from tunelab.errors import WorkloadError

pytest.importorskip("torch")

NO_RUNTIME = Runtime(0, 0)
#: a launcher's, measured (import torch, a meta ResNet-50): RssAnon 235 MB, RssFile 91 MB
MEASURED = Runtime(int(0.235e9), int(0.091e9))


def test_the_estimate_counts_batch_model_and_saved_activations() -> None:
    leopard = DDPConfig(model="leopard", batch_size=64).validate()
    # measured on the CPU: 0.42 GB more RSS after two steps of 64 windows of 2,048 bp
    assert 0.3e9 < worker_bytes(leopard, NO_RUNTIME) < 0.8e9
    double = DDPConfig(model="leopard", batch_size=128).validate()
    assert worker_bytes(double, NO_RUNTIME) > 1.8 * worker_bytes(leopard, NO_RUNTIME) - 0.1e9
    # an emulated accelerator holds its batch (and real gradient buffers to all-reduce): the
    # synthetic source's float batch, made once
    emulated = DDPConfig(model="resnet50", batch_size=64, compute="emulate:0.1").validate()
    assert worker_bytes(emulated, NO_RUNTIME) == 64 * 3 * 224 * 224 * 4
    real_ar = DDPConfig(model="resnet50", batch_size=128, workers=2, compute="emulate:0.1",
                        allreduce="real").validate()
    assert worker_bytes(real_ar, NO_RUNTIME) == worker_bytes(emulated, NO_RUNTIME) + 4 * 25_557_032


def test_the_estimate_stays_within_1_3x_above_the_measured_peak() -> None:
    """Field test: ResNet-18 at 112 px was estimated 2.4x its peak RSS at batch 128 (the
    weights each layer saves for the backward pass, i.e. the parameters, counted once per
    sample: 23 of the 29 MB per sample), and Leopard 512 bp b16 0.11x (no runtime)."""
    def est(model: str, size: int, batch: int, rt: Runtime | None = NO_RUNTIME) -> int:
        kw = {"image_size": size} if model.startswith("resnet") else {"window": size}
        return worker_bytes(DDPConfig(model=model, batch_size=batch, **kw).validate(), rt)

    # peak RSS of a real worker, b8 -> b128: +1.028 GB, 8.6 MB per sample (2-core EPYC)
    per_sample = (est("resnet18", 112, 128) - est("resnet18", 112, 8)) / 120
    assert 1.0 * 8.6e6 <= per_sample <= 1.3 * 8.6e6
    # the runtime's private part (torch, gloo: a worker's 0.25-0.27 GB measured) is counted:
    # this process's anonymous memory x 1.3
    assert est("leopard", 512, 16, None) - est("leopard", 512, 16) > 0.25e9
    # a worker's peak RSS holds its private bytes and the shared libraries' pages it maps
    for model, size, batch, peak in (("resnet18", 112, 8, 0.582e9), ("resnet18", 112, 128,
                                     1.610e9), ("resnet50", 224, 4, 1.128e9),
                                     ("leopard", 512, 16, 0.384e9)):
        ratio = (est(model, size, batch, MEASURED) + MEASURED.shared) / peak
        assert 1.0 <= ratio <= 1.3, (model, batch)


def test_the_shared_libraries_count_once_per_job_not_once_per_worker() -> None:
    """Field test: the runtime was the launcher's RSS x 1.3 per worker, file-backed pages
    (torch's libraries, ~90 MB, held once by the kernel) included, so 64 emulated ResNet-50
    workers were estimated at 28.4 GB and refused on a 24 GB machine with 23 GB available,
    for a job that peaks at 15.8 GB (docs/workloads/ddp.md, "Memory")."""
    rt = Runtime(private=200_000_000, shared=90_000_000)

    def job(workers: int, nodes: int = 1) -> int:
        return job_bytes(DDPConfig(model="resnet50", workers=workers, nodes=nodes,
                                   batch_size=4 * workers, compute="emulate:0.2").validate(), rt)

    one = worker_bytes(DDPConfig(model="resnet50", batch_size=4,
                                 compute="emulate:0.2").validate(), rt)
    assert one == int(200_000_000 * RUNTIME_FACTOR) + 4 * 3 * 224 * 224 * 4
    agent = int(200_000_000 * AGENT_FACTOR)  # one torchrun per node
    assert job(1) == one + agent + 90_000_000
    assert job(64) == 64 * one + agent + 90_000_000  # the shared pages once
    assert job(64) - job(63) == one  # a worker more adds its private bytes only
    assert job(64, nodes=4) == job(64) + 3 * agent
    # the field case, with the runtime measured in a launcher: 64 workers peaked at 15.8 GB
    field = DDPConfig(model="resnet50", workers=64, batch_size=256,
                      compute="emulate:0.2").validate()
    assert 15.8e9 <= job_bytes(field, MEASURED) <= 1.3 * 15.8e9
    check_memory(field, int(23e9), MEASURED)  # 23 GB available: runs


IMAGE = 3 * 224 * 224  # a decoded image as a loader delivers it: uint8


def _files(**kw: object) -> DDPConfig:
    return DDPConfig(model="resnet18", data="files:/data", compute="emulate:0.5",
                     **kw).validate()  # type: ignore[arg-type]


def test_the_loader_processes_and_their_read_ahead_are_counted() -> None:
    """Field test: 1 emulated worker, files of ~112 KiB JPEGs, 128 images of 224 px a batch,
    8 loaders x prefetch 2: the loaders held 0.60 GB of private memory and the read-ahead
    0.33 GB of /dev/shm (batches no process maps until the worker takes one), none of it
    counted: the job was estimated at 0.73 GB and peaked at 1.11 GB (docs/workloads/ddp.md,
    "Memory")."""
    eight = _files(batch_size=128, loader_workers=8, prefetch=2)
    batch = 128 * (IMAGE + 8)
    assert loader_bytes(eight) == 8 * (LOADER_RUNTIME + LOADER_BATCH_FACTOR * batch) + 16 * batch
    assert 1.0 <= loader_bytes(eight) / (0.596e9 + 0.328e9) <= 1.3
    four = _files(batch_size=128, loader_workers=4, prefetch=4)  # 0.338 + 0.328 GB measured
    assert 1.0 <= loader_bytes(four) / (0.338e9 + 0.328e9) <= 1.3
    # the job counts them once per worker; an emulated worker holds its batch as delivered
    two = _files(batch_size=256, workers=2, loader_workers=8, prefetch=2)
    assert job_bytes(two, NO_RUNTIME) == 2 * (loader_bytes(eight) + batch)
    # --data memory: the worker also holds its pool of made-up samples, two batches
    memory = DDPConfig(model="resnet18", data="memory", compute="emulate:0.5", batch_size=128,
                       loader_workers=2).validate()
    assert worker_bytes(memory, NO_RUNTIME) == (128 + 256) * (IMAGE + 8)
    # no loader processes, or a source without them: nothing
    assert loader_bytes(_files(batch_size=128, loader_workers=0)) == 0
    synthetic = DDPConfig(model="resnet18", batch_size=128, loader_workers=8).validate()
    assert loader_bytes(synthetic) == 0
    # --decode off delivers a shape, not a batch: the loaders' own memory only
    assert loader_bytes(_files(batch_size=128, loader_workers=8, decode="off")) == (
        8 * LOADER_RUNTIME)
    # --decode gpu sends the files' bytes; a unet3d loader reads a whole volume to crop it
    index = DatasetIndex("/data", "jpeg-folder", (Entry("a.jpg", 100_000), Entry("b.jpg", 1)))
    gpu = _files(batch_size=128, loader_workers=2, prefetch=2, decode="gpu")
    assert loader_bytes(gpu, index) == (2 * (LOADER_RUNTIME + LOADER_BATCH_FACTOR * 128 * 100_000)
                                        + 4 * 128 * 100_000)
    volumes = DatasetIndex("/v", "npz-volumes", (Entry("a.npz", 140_000_000),))
    unet = DDPConfig(model="unet3d", data="files:/v", compute="emulate:0.5", batch_size=2,
                     loader_workers=1, prefetch=1).validate()
    sample = 4 * 128 ** 3 + 128 ** 3
    assert loader_bytes(unet, volumes) == (LOADER_RUNTIME + LOADER_BATCH_FACTOR * 2 * sample
                                           + 140_000_000 + 2 * sample)


def test_a_job_whose_loaders_do_not_fit_is_refused_naming_them() -> None:
    cfg = _files(batch_size=256, workers=2, loader_workers=64, prefetch=64)
    with pytest.raises(WorkloadError, match=r"needs about [\d,.]+ GB of memory \([\d,.]+ GB per "
                       r"worker: .*, of which [\d,.]+ GB its 64 loader process\(es\) and their "
                       r"read-ahead of 4096 batch\(es\); .* use fewer --loader-workers, a "
                       r"smaller --prefetch or a smaller --batch-size$"):
        check_memory(cfg, int(20e9), MEASURED)


def test_a_gpu_run_checks_its_loaders_against_the_host_memory() -> None:
    """A GPU run's model lives on its GPUs, so only the loaders are the host's: 8 workers x
    64 loaders x prefetch 64 of 256 images of 224 px would ask the host for ~1.3 TB."""
    cfg = _files(batch_size=8 * 256, workers=8, loader_workers=64, prefetch=64)
    need = 8 * loader_bytes(cfg)
    check_loader_memory(cfg, need)  # fits exactly
    with pytest.raises(WorkloadError, match=r"^--loader-workers 64 --prefetch 64 of --batch-size "
                       r"2048 on 8 worker\(s\) need about [\d,.]+ GB of host memory \([\d,.]+ GB "
                       r"per worker: its loader processes and their read-ahead of 4096 "
                       r"batch\(es\)\), but [\d,.]+ GB is available here: use fewer "
                       r"--loader-workers, a smaller --prefetch or a smaller --batch-size$"):
        check_loader_memory(cfg, need - 1)
    check_loader_memory(DDPConfig(model="resnet50", batch_size=256).validate(), 0)  # synthetic


def test_a_run_larger_than_the_memory_is_refused_naming_the_need() -> None:
    cfg = DDPConfig(model="leopard", batch_size=64, workers=2).validate()
    need = job_bytes(cfg, MEASURED)
    check_memory(cfg, need, MEASURED)  # fits exactly
    with pytest.raises(WorkloadError, match=r"--model leopard --batch-size 64 on 2 worker\(s\) "
                                            r"needs about .* GB of memory .* use a smaller "
                                            r"--batch-size or --window"):
        check_memory(cfg, need - 1, MEASURED)


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


def test_the_cli_refuses_loaders_beyond_the_memory_before_reading(tmp_path: Path) -> None:
    from tunelab.bench.ddp.makedata import MakeDataConfig, make_dataset

    make_dataset(MakeDataConfig(str(tmp_path / "d"), "imagenet", 8, classes=2, scale=0.01))
    env = env_with_pythonpath(Path(__file__).resolve().parents[2] / "src")
    proc = subprocess.run(
        [sys.executable, "-m", "tunelab.bench.ddp", "--model", "resnet18", "--image-size",
         "1024", "-b", "8", "--data", f"files:{tmp_path / 'd'}", "--loader-workers", "64",
         "--prefetch", "64", "--compute", "emulate:0.1", "--cache", "keep"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "its 64 loader process(es) and their read-ahead of 4096" in lines[0]
    assert lines[0].endswith("use fewer --loader-workers, a smaller --prefetch or a smaller "
                             "--batch-size"), lines
