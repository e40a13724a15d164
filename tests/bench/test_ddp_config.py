"""The DDP benchmark without training: options and their errors, the gradient bytes per
step (= 4 x parameters for fp32), DDP's bucket layout, device selection, FOM formulas."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tunelab.bench.ddp.comm import FIRST_BUCKET_BYTES, bucket_sizes
from tunelab.bench.ddp.config import DDPConfig, parse_compute, parse_fault
from tunelab.bench.ddp.metrics import RankRecord, StepRecord, ring_factor, summarize
from tunelab.bench.ddp.worker import select_runtime
from tunelab.errors import WorkloadError

torch = pytest.importorskip("torch")

PARAMS = {"resnet18": 11_689_512, "resnet50": 25_557_032, "leopard": 474_017}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunelab.bench.ddp", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"workers": 3, "batch_size": 64}, "--workers 3 does not divide the global --batch-size 64"),
    ({"model": "vgg16"}, "--model: unknown value 'vgg16'"),
    ({"workers": 4, "nodes": 3, "batch_size": 12}, "--nodes 3 does not divide --workers 4"),
    ({"workers": 0}, "--workers must lie in 1..1024, got 0"),
    ({"batch_size": 10**9}, "--batch-size must lie in 1..65536"),
    ({"compute": "emulate:-1"}, "emulated seconds must lie in (0, 3600]"),
    ({"link_gbit": 10.0}, "--link-gbit needs --placement vnodes"),
    ({"model": "leopard", "window": 1000}, "--window must be a multiple of 32"),
    ({"data": "tape:/x"}, "--data: unknown value 'tape:/x'"),
    ({"data": "files:"}, "--data files: needs the dataset directory"),
    ({"read_limit": "200MB/s"}, "--read-limit applies to --data files:DIR"),
    ({"data": "files:/x", "read_limit": "fast"}, "--read-limit: expected a rate"),
    ({"data": "files:/x", "read_limit": "1B/s"}, "--read-limit must lie in 1kB/s..10TB/s"),
    ({"data": "files:/x", "cache": "lukewarm"}, "--cache: unknown value 'lukewarm'"),
    ({"loader_workers": 65}, "--loader-workers must lie in 0..64"),
    ({"model": "unet3d", "patch": 100}, "--patch must be a multiple of 32"),
    ({"model": "leopard", "data": "files:/x"}, "the leopard model reads its own data"),
    ({"compute": "emulate:resnet50/a100/b400"},
     "is a step of 400 samples per accelerator, but each worker trains on 64"),
    ({"model": "resnet18", "compute": "emulate:resnet50/a100/b400", "batch_size": 400},
     "emulates resnet50, but --model is resnet18"),
    ({"compute": "emulate:resnet50/tpu9/b64"}, "unknown accelerator profile; known: "),
    ({"data": "synthetic", "fault": parse_fault("rank=0,step=1,action=kill-loader")},
     "action=kill-loader needs data-loader processes"),
    ({"workers": 2, "nodes": 2, "batch_size": 2, "fault": parse_fault("node=0,action=absent")},
     "node 0 must lie in 1..1"),
])
def test_bad_options_are_one_line_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(WorkloadError) as exc:
        DDPConfig(**kwargs).validate()  # type: ignore[arg-type]
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


def test_cli_bad_input_exits_2_with_one_line() -> None:
    proc = cli("--workers", "3", "--batch-size", "64")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "ddp: error: --workers 3 does not divide the global --batch-size 64: each worker "
        "trains on an equal share (try --batch-size 63)"]
    assert "Traceback" not in proc.stderr


def test_compute_and_fault_parsing() -> None:
    assert not parse_compute("real").emulated
    c = parse_compute("emulate:0.17")
    assert c.emulated and c.seconds == pytest.approx(0.17) and str(c) == "emulate:0.17"
    with pytest.raises(WorkloadError, match="expected 'real', 'emulate:SECONDS' or"):
        parse_compute("fast")
    f = parse_fault("rank=1,step=2,action=kill")
    assert f is not None and (f.rank, f.step, f.action) == (1, 2, "kill")
    with pytest.raises(WorkloadError, match="unknown field"):
        parse_fault("who=1")


def test_layout_numbering() -> None:
    cfg = DDPConfig(workers=8, nodes=4, batch_size=64).validate()
    assert cfg.workers_per_node == 2 and cfg.local_batch == 8
    assert [cfg.node_of(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert list(cfg.ranks_of(3)) == [6, 7]
    assert DDPConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "leopard"])
def test_gradient_bytes_per_step_are_4_bytes_per_parameter(name: str) -> None:
    from tunelab.bench.ddp.models import build_model, parameter_count

    model, spec = build_model(name, device="meta")  # shapes only, nothing allocated
    assert parameter_count(model) == PARAMS[name]
    numels = [p.numel() for p in model.parameters() if p.requires_grad]
    sizes = bucket_sizes(numels, 4, 25.0)
    assert sum(sizes) * 4 == 4 * PARAMS[name]
    assert sizes[0] * 4 >= FIRST_BUCKET_BYTES or len(sizes) == 1
    assert all(s * 4 <= 25 * (1 << 20) + max(numels) * 4 for s in sizes)


def test_buckets_match_ddp() -> None:
    """The emulated all-reduce uses the buckets DDP itself builds (after its first step)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from tunelab.bench.ddp.models import build_model

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model, _ = build_model("resnet18", image_size=32)
        ddp = DDP(model)
        seen: list[int] = []

        def hook(state, bucket):  # type: ignore[no-untyped-def]
            seen.append(bucket.buffer().numel())
            fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        ddp.register_comm_hook(None, hook)
        for _ in range(2):
            seen.clear()
            ddp(torch.randn(2, 3, 32, 32)).sum().backward()
        assert seen == bucket_sizes([p.numel() for p in model.parameters()], 4, 25.0)
    finally:
        dist.destroy_process_group()


def test_device_selection() -> None:
    cpu = select_runtime("auto", "auto", "auto", 0, cuda_devices=0)
    assert (cpu.device, cpu.backend, cpu.amp) == ("cpu", "gloo", False)
    gpu = select_runtime("auto", "auto", "auto", 3, cuda_devices=2)
    assert (gpu.device, gpu.backend, gpu.amp) == ("cuda:1", "nccl", True)
    assert select_runtime("cpu", "auto", "auto", 0, cuda_devices=2).device == "cpu"
    assert not select_runtime("cuda", "gloo", "off", 0, cuda_devices=1).amp
    with pytest.raises(WorkloadError, match="no CUDA device"):
        select_runtime("cuda", "auto", "auto", 0, cuda_devices=0)
    with pytest.raises(WorkloadError, match="nccl needs a CUDA device"):
        select_runtime("auto", "nccl", "auto", 0, cuda_devices=0)
    with pytest.raises(WorkloadError, match="--amp on needs a CUDA device"):
        select_runtime("cpu", "auto", "on", 0, cuda_devices=0)


def test_summary_formulas() -> None:
    step = StepRecord(step_s=0.5, compute_s=0.2, allreduce_s=0.25, exposed_s=0.25,
                      other_s=0.05, bytes=100, comm_busy_s=0.25)
    slow = StepRecord(step_s=0.6, compute_s=0.2, allreduce_s=0.35, exposed_s=0.35,
                      other_s=0.05, bytes=100, comm_busy_s=0.35)
    ranks = [RankRecord(0, 0, 1.0, (step, step)), RankRecord(1, 0, 1.2, (slow, step))]
    s = summarize(ranks, samples_per_step=64)
    assert s.throughput == pytest.approx(64 * 2 / 1.2)   # slowest worker's elapsed time
    assert s.throughput_per_worker == pytest.approx(s.throughput / 2)
    assert s.step_s == pytest.approx((0.6 + 0.5) / 2)     # each step: its slowest worker
    assert s.allreduce_s == pytest.approx((0.25 * 3 + 0.35) / 4)
    assert s.algbw == pytest.approx(100 / s.allreduce_busy_s)
    assert s.busbw == pytest.approx(s.algbw * ring_factor(2))
    assert ring_factor(8) == pytest.approx(1.75)


def test_torchvision_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from tunelab.bench.ddp import models

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torchvision" else real(name, *a))
    with pytest.raises(WorkloadError, match=r"need torchvision: pip install 'tunelab\[ddp\]'"):
        models.build_model("resnet18", device="meta")


def test_warmup_covers_the_loaders_read_ahead() -> None:
    """Field test: on a disk throttled to 150 MB/s, 4 emulated A100s reading with 4 loader
    processes x prefetch 2 (the storage example's settings: 6 timed steps after 2 warm-up)
    reported AU 99.7 % and 425 MB/s: the timed steps ran on the batches the loaders had read
    during the start-up. The warm-up now covers the loaders' read-ahead (24 timed steps gave
    AU 38 % and 161 MB/s)."""
    cfg = DDPConfig(data="files:/x", loader_workers=4, prefetch=2, warmup=2,
                    compute="emulate:0.435")
    assert (cfg.read_ahead, cfg.warmup_steps) == (8, 8)
    assert DDPConfig(data="files:/x", loader_workers=1, prefetch=2, warmup=5).warmup_steps == 5
    assert DDPConfig(data="files:/x", loader_workers=0, warmup=1).warmup_steps == 1
    assert DDPConfig(data="synthetic", loader_workers=4, warmup=0).warmup_steps == 0


def test_the_loop_times_only_the_steps_after_the_raised_warmup(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    from tunelab.bench.ddp.worker import StatusFile, _loop

    class _Source:
        drop_s = 0.0
        asked = 0

        def next_batch(self) -> tuple[None, None, dict[str, int]]:
            self.asked += 1
            return None, None, {"samples": 4}

    barriers: list[int] = []
    source = _Source()
    monkeypatch.setattr(dist, "barrier", lambda: barriers.append(source.asked))
    cfg = DDPConfig(data="memory", loader_workers=3, prefetch=2, warmup=1, steps=4,
                    compute="emulate:0.01")
    marks, parts, start, warm, end = _loop(
        cfg, 0, source, lambda x, y: (0.0, 0.0, 0.0, 0.0, 0, 0.0, 0.0),
        StatusFile(None, 0, 0), True)
    assert source.asked == len(parts) == 6 + 4
    # one barrier before any batch (its code paged in), the other after the 6 read ahead
    assert barriers == [0, 6] and (warm, end) == (6, "fixed")


def test_the_warmup_goes_on_until_the_read_ahead_has_drained() -> None:
    """Field test: 1 emulated A100, 4 loaders x prefetch 2 (8 batches read ahead), a disk
    throttled to 95 MB/s (about 90 % of what the steps ask for): after the fixed warm-up of
    8 steps, 4 and 16 timed steps both ran on the read-ahead (AU 99.5 / 99.2 %, 'read
    105-106 MB/s' above the limit). The warm-up now ends once a step waited for its batch."""
    from tunelab.bench.ddp.warmup import max_warmup, warmup_end

    step = 0.435
    # the steps ask every 0.435 s; the loaders fall behind by 0.15 s a step: a batch is ready
    # 2.0 s ahead at step 8, 0.05 s ahead at step 21, 0.1 s late at step 22
    asked = [10 + step * i for i in range(24)]
    ready = [a - (2.0 - 0.15 * (i - 8) if i >= 1 else -2.0) for i, a in enumerate(asked)]
    kw = {"min_steps": 8, "max_steps": max_warmup(8, 8), "read_ahead": 8}
    verdicts = [warmup_end(asked[:n], ready[:n], **kw) for n in range(1, 24)]
    assert verdicts.index("drained") + 1 == 23 and set(verdicts[:22]) == {None}
    assert max_warmup(8, 8) == 88 and max_warmup(2, 0) == 2


def test_the_warmup_ends_when_the_loaders_keep_pace() -> None:
    """Compute-bound (fast storage): the read-ahead stays full, no step waits; the warm-up
    ends once the loaders' pace is measured past their start-up (2 x read-ahead batches,
    then read-ahead batches more), not at its limit."""
    from tunelab.bench.ddp.warmup import warmup_end

    asked = [10 + 0.435 * i for i in range(60)]
    ready = [asked[0] + 1.0] + [a - 2.5 for a in asked[1:]]
    kw = {"min_steps": 4, "max_steps": 44, "read_ahead": 4}
    ends = [(n, warmup_end(asked[:n], ready[:n], **kw)) for n in range(1, 60)]
    assert next(n for n, e in ends if e) == 13 and dict(ends)[13] == "steady"
    # a slower loader pace (20 % behind) is not steady; the limit ends it, and says so
    slow = [asked[0] + 1.0] + [a - 2.5 + 0.2 * 0.435 * i for i, a in enumerate(asked)][1:]
    got = [warmup_end(asked[:n], slow[:n], **kw) for n in range(1, 45)]
    assert got[-1] in ("drained", "limit") and "steady" not in got
    assert warmup_end(asked[:44], [None] * 44, **kw) == "limit"
    assert warmup_end(asked[:4], [None] * 4, **kw) == "fixed"  # a source that does not say
    assert warmup_end(asked[:2], ready[:2], min_steps=2, max_steps=2, read_ahead=0) == "fixed"


def test_the_bandwidth_divides_by_the_all_reduce_s_own_time_not_its_window() -> None:
    """Field test (2 Leopard workers, gloo): the buckets took 1.5 and 3.8 ms, but the window
    from the first launch to the last done spanned 37 ms of backward pass between them, and
    the bandwidth was bytes / window: 0.08 GiB/s where the same bytes all-reduced alone took
    3.6 ms (0.5 GB/s)."""
    from tunelab.bench.ddp.comm import busy_time

    # two buckets: launched at 0 and 30 ms, done at 1.5 and 33.8 ms
    assert busy_time([0.0, 0.030], [0.0015, 0.0338]) == pytest.approx(0.0053)
    # overlapping (queued) buckets count once; completions paired in launch order
    assert busy_time([0.0, 0.001], [0.004, 0.002]) == pytest.approx(0.004)
    step = StepRecord(step_s=0.2, compute_s=0.16, allreduce_s=0.0338, exposed_s=0.004,
                      other_s=0.01, bytes=1_896_068, comm_busy_s=0.0053)
    s = summarize([RankRecord(0, 0, 0.2, (step,)), RankRecord(1, 0, 0.2, (step,))], 32)
    assert s.allreduce_s == pytest.approx(0.0338)  # the window is still reported as such
    assert s.allreduce_busy_s == pytest.approx(0.0053)
    assert s.algbw == pytest.approx(1_896_068 / 0.0053)
