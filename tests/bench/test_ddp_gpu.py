"""The benchmark on GPUs (issue 27), tested here on the CPU where it can be and on a CUDA
machine with ``-m cuda``: calibrate and the workers run one training step; more workers on a
node than GPUs, ``--decode gpu`` without a GPU decoder and NCCL failures are one line; NVML
energy is absent without NVML, never a failure; ``benchmarks/ddp_gpu.py`` runs tiny on the
CPU so it never breaks between GPU sessions."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.bench.test_ddp_run import bench, fom
from tests.conftest import env_with_pythonpath
from tunelab.bench.ddp.config import DDPConfig
from tunelab.bench.ddp.energy import Energy, EnergyMeter, integrate, open_meter
from tunelab.bench.ddp.worker import check_gpu_layout, error_line
from tunelab.errors import WorkloadError

torch = pytest.importorskip("torch")
if importlib.util.find_spec("torchvision") is None:
    pytest.skip("torchvision is not installed", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_calibrate_and_the_benchmark_run_one_training_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both build their step through step.training_step with the same settings, so the
    profile calibrate writes is the benchmark's own step (and says how it ran)."""
    from tunelab.bench.ddp import step as step_module
    from tunelab.bench.ddp.calibrate import calibrate_device
    from tunelab.bench.ddp.worker import StatusFile, _Phase, _train

    built: list[tuple[str, Any]] = []
    real = step_module.training_step

    def recording(model: Any, spec: Any, device: Any, amp: bool, **kw: Any) -> Any:
        train = real(model, spec, device, amp, **kw)
        built.append((f"{type(model).__name__} {spec} {device} amp={amp} ddp={kw['ddp']}",
                      train.setup))
        return train

    monkeypatch.setattr(step_module, "training_step", recording)
    profile, _ = calibrate_device(model="resnet18", batch=2, steps=1, warmup=0, image_size=32,
                                  device="cpu", output=tmp_path / "acc.yaml")
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(k, v)
    cfg = DDPConfig(model="resnet18", image_size=32, batch_size=2, steps=1, warmup=0,
                    device="cpu").validate()
    result = _train(cfg, 0, 1, 0, StatusFile(None, 0, 0), _Phase())
    (calib, calib_setup), (worker, worker_setup) = built
    assert calib == worker  # the same model, input, device, precision, no DDP for one worker
    assert calib_setup == worker_setup and not worker_setup.ddp
    assert result["setup"]["precision"] == profile.precision == "fp32"
    assert result["setup"]["memory_format"] == profile.memory_format == "contiguous"
    assert result["setup"]["optimizer"] == "SGD" and "SGD" in profile.note


def test_more_workers_on_a_node_than_gpus_is_refused_naming_both_counts() -> None:
    with pytest.raises(WorkloadError) as exc:
        check_gpu_layout(2, 1, "nccl")
    assert str(exc.value) == (
        "2 workers per node need 2 GPUs with NCCL, but this node has 1 visible: use at most 1 "
        "worker(s) per node (--workers), more nodes (--nodes), or --backend gloo to share a GPU")
    check_gpu_layout(2, 1, "gloo")  # gloo may share a GPU
    check_gpu_layout(4, 8, "nccl")


def test_cuda_options_without_a_gpu_are_one_line_exit_2(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = bench("--model", "resnet18", "--device", "cuda", "-n", "2", "-b", "2")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "ddp: error: --device cuda: no CUDA device is available here"]
    from tunelab.bench.ddp.makedata import MakeDataConfig, make_dataset

    make_dataset(MakeDataConfig(str(tmp_path / "img"), "imagenet", 8, classes=2, scale=0.05,
                                jobs=1))
    proc = bench("--model", "resnet18", "--compute", "emulate:0.01", "-b", "2", "--decode",
                 "gpu", "--data", f"files:{tmp_path / 'img'}", "--device", "auto")
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("ddp: error: --decode gpu: no CUDA device is visible"), line
    with pytest.raises(WorkloadError, match="--decode gpu needs --device cuda"):
        DDPConfig(decode="gpu", device="cpu", data="files:/x").validate()
    with pytest.raises(WorkloadError, match="decodes JPEG images read from files"):
        DDPConfig(decode="gpu", data="memory").validate()


def test_nccl_errors_become_one_line_with_nccls_own_message() -> None:
    text = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, "
            "invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.27.5\n"
            "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
            "Last error:\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000")
    exc = torch.distributed.DistBackendError(text)
    assert error_line(exc) == ("DistBackendError: NCCL: Duplicate GPU detected : rank 1 and "
                               "rank 0 both on CUDA device 1a000")
    assert error_line(RuntimeError("NCCL communicator was aborted\n on rank 3")) == \
        "RuntimeError (NCCL): NCCL communicator was aborted on rank 3"
    assert error_line(ValueError("x" * 500)) == "ValueError: " + "x" * 300


class _NoCounterNVML:
    """NVML of a GPU without the energy counter: it reports power draw only (NVML itself
    does not run on this machine; on a GPU the cuda tests use the real one)."""

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return 250_000  # mW


def test_energy_is_absent_without_nvml_and_integrates_power_samples() -> None:
    if importlib.util.find_spec("pynvml") is None or not torch.cuda.is_available():
        assert open_meter(0) is None  # no NVML, no GPU: absent, never an error
    # power samples held until the next one: 100 W for 1 s, then 300 W for 2 s
    e = integrate([(10.0, 100.0), (11.0, 300.0)], 10.0, 13.0)
    assert e == Energy(700.0, 3.0, "sampled") and e.watts == pytest.approx(700 / 3)
    assert integrate([], 0.0, 1.0) is None
    meter = EnergyMeter(_NoCounterNVML(), None)
    assert meter.readable()
    meter.start()
    import time

    time.sleep(0.2)
    got = meter.stop()
    assert got is not None and got.method == "sampled"
    assert got.watts == pytest.approx(250.0, rel=0.35)  # the first sample starts the count


@pytest.mark.slow
def test_the_gpu_script_runs_tiny_on_the_cpu(tmp_path: Path) -> None:
    """benchmarks/ddp_gpu.py end to end at tiny sizes on the CPU: every section prints."""
    env = env_with_pythonpath(ROOT / "src")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ddp_gpu.py"), "--tiny",
                           "--device", "cpu", "--dir", str(tmp_path), "--budget", "240"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for heading in ("device:", "calibrate vs bench", "storage from JPEG files",
                    "profile measured here vs MLPerf Storage's"):
        assert heading in out, out
    assert "decode gpu" in out and "refused" in out  # the CPU: said, not failed
    record = json.loads(out.strip().splitlines()[-1])
    assert record["benchmark"] == "ddp_gpu" and record["rows"]


# --------------------------------------------------------------------------- CUDA


@pytest.mark.cuda
@pytest.mark.slow
def test_cuda_nccl_ddp_one_worker_amp_channels_last_and_energy() -> None:
    r = fom(bench("--model", "resnet18", "--image-size", "64", "-b", "32", "--steps", "5",
                  "--warmup", "2", "--device", "cuda"))
    assert r["gpu"] and r["backend"] == "nccl" and r["amp"] is True
    assert (r["precision"], r["memory_format"]) == ("fp16-amp", "channels_last")
    assert r["allreduce_s"] == 0.0  # one worker
    # the in-run bound: the GPU's GEMM in the step's autocast precision, timed in the run
    assert r["gemm_precision"] == "fp16" and r["bound_method"].startswith("torch.matmul 4096^3")
    assert r["gemm_flops_per_s"] > 1e12 and 0 < r["bound_fraction"] < 1
    # timed before the warm-up and after the steps, the higher counting
    assert r["gemm_measurements"] >= 2 and r["gemm_before_flops_per_s"] > 1e12
    assert r["gemm_flops_per_s"] == max(r["gemm_before_flops_per_s"],
                                        r["gemm_after_flops_per_s"])
    assert r["bound_fraction"] == pytest.approx(r["achieved_flops_per_s"] / r["gemm_flops_per_s"])
    if importlib.util.find_spec("pynvml") is not None:
        assert r["energy_J"] > 0 and r["power_W"] > 0 and r["energy_J_per_sample"] > 0


@pytest.mark.cuda
@pytest.mark.slow
def test_cuda_calibrate_records_the_benchmarks_step(tmp_path: Path) -> None:
    from tunelab.bench.ddp.calibrate import calibrate_device

    torch.backends.cudnn.benchmark = False
    profile, _ = calibrate_device(model="resnet18", batch=32, steps=3, warmup=2,
                                  image_size=64, device="cuda", output=tmp_path / "a.yaml")
    assert (profile.precision, profile.memory_format) == ("fp16-amp", "channels_last")
    assert torch.backends.cudnn.benchmark  # cuDNN's kernels chosen by timing them


@pytest.mark.cuda
@pytest.mark.slow
def test_cuda_more_workers_than_gpus_is_one_line_exit_2() -> None:
    n = torch.cuda.device_count() + 1
    proc = bench("--model", "resnet18", "--device", "cuda", "-n", str(n), "-b", str(n))
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert f"{n} workers per node need {n} GPUs with NCCL, but this node has {n - 1}" in line


@pytest.mark.cuda
@pytest.mark.slow
def test_cuda_gpu_decode_trains_from_jpeg_files(tmp_path: Path) -> None:
    from tests.bench.test_ddp_gpudecode import resize_each
    from tunelab.bench.ddp.gpudecode import (
        UndecodableImages,
        crop_boxes,
        decode_batch,
        gpu_decode_unavailable,
        resize_crops,
    )
    from tunelab.bench.ddp.handover import to_device
    from tunelab.bench.ddp.makedata import MakeDataConfig, make_dataset
    from tunelab.bench.ddp.samples import Encoded

    why = gpu_decode_unavailable()
    if why:
        pytest.skip(why)
    from torchvision.io import decode_jpeg

    make_dataset(MakeDataConfig(str(tmp_path / "img"), "imagenet", 16, classes=2, scale=0.2,
                                jobs=2))
    files = [torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8)
             for p in sorted((tmp_path / "img").rglob("*.JPEG"))[:6]]
    cuda = torch.device("cuda")
    x = decode_batch(Encoded.join(files), 64, cuda)
    assert x.shape == (6, 3, 64, 64) and x.dtype == torch.uint8 and x.is_cuda
    # a file nvJPEG refuses is found in its batch, and the decoder goes on working after it
    broken = files[:2] + [files[2][:300]] + files[3:]
    with pytest.raises(UndecodableImages) as bad:
        decode_batch(Encoded.join(broken), 64, cuda)
    assert [i for i, _ in bad.value.bad] == [2]
    assert decode_batch(Encoded.join(files), 64, cuda).shape == (6, 3, 64, 64)
    # the batched crop-resize on the GPU computes what interpolate does image by image there
    images = decode_jpeg(files, device=cuda)
    gen = torch.Generator().manual_seed(0)
    boxes = crop_boxes(torch.tensor([img.shape[1:] for img in images]), gen)
    flips = torch.tensor([True, False] * 3)
    got, want = resize_crops(images, boxes, flips, 64), resize_each(images, boxes, flips, 64)
    assert (got.int() - want.int()).abs().max() <= 1
    # a blank batch reaches the GPU as zeros of its shape, from a pinned batch made once
    blank = torch.zeros((3, 8, 8), dtype=torch.uint8).expand(5, 3, 8, 8)
    on_gpu = to_device(blank, cuda)
    assert on_gpu.shape == (5, 3, 8, 8) and on_gpu.is_cuda and not on_gpu.any()
    r = fom(bench("--model", "resnet18", "--image-size", "64", "-b", "8", "--steps", "3",
                  "--warmup", "1", "--device", "cuda", "--decode", "gpu",
                  "--data", f"files:{tmp_path / 'img'}", "--loader-workers", "1"))
    assert r["decode"] == "gpu" and r["samples"] == 24 and r["read_bytes"] > 0
