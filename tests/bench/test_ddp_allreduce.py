"""AU as MLPerf Storage defines it (compute / step time, the all-reduce beside it) and the
all-reduce of an emulated accelerator at its fabric's speed (issue 28): the ring formula,
DDP's overlap with the backward pass, no all-reduce with one worker; real short runs that pin
a known compute share and the refusals of bad ``--allreduce``/``--fabric`` values."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tunelab.bench.ddp.config import DDPConfig
from tunelab.bench.ddp.fabric import (
    BACKWARD_SHARE,
    Link,
    find_fabric,
    load_fabrics,
    plan_allreduce,
    ring_allreduce_s,
)
from tunelab.bench.ddp.metrics import RankRecord, StepRecord, summarize
from tunelab.errors import WorkloadError

NVLINK = Link("test link", 100e9, 5e-6)


def test_ring_allreduce_time_is_the_ring_formula() -> None:
    s = 102_228_128  # ResNet-50's gradient bytes
    for n in (2, 4, 8):
        expect = 2 * (n - 1) / n * s / 100e9 + 2 * (n - 1) * 5e-6
        assert ring_allreduce_s(s, n, NVLINK) == pytest.approx(expect, rel=1e-12)
    assert ring_allreduce_s(s, 1, NVLINK) == 0.0


def test_emulated_allreduce_of_one_bucket_after_the_backward_pass_is_exposed_whole() -> None:
    # one bucket: ready when the backward pass ends, so the whole ring time is on the path
    s, n, c = 100_000_000, 4, 0.05
    plan = plan_allreduce([s], n, NVLINK, c)
    ring = 2 * (n - 1) / n * s / 100e9 + 2 * (n - 1) * 5e-6
    assert plan.fabric_s == pytest.approx(ring)
    assert plan.first == pytest.approx(c) and plan.exposed == pytest.approx(ring)
    assert plan.window == pytest.approx(ring) and plan.bytes == s and plan.buckets == 1


def test_buckets_overlap_the_backward_pass_only_the_rest_is_exposed() -> None:
    buckets = [1 << 20] + [25 << 20] * 3 + [10 << 20]
    total = sum(buckets)
    n, c = 8, 0.2
    plan = plan_allreduce(buckets, n, NVLINK, c)
    # the fabric's busy time: the ring formula per bucket (latency paid per bucket)
    assert plan.fabric_s == pytest.approx(sum(ring_allreduce_s(b, n, NVLINK) for b in buckets))
    # the first bucket leaves once its share of the backward pass is done
    forward = c * (1 - BACKWARD_SHARE)
    assert plan.first == pytest.approx(forward + c * BACKWARD_SHARE * buckets[0] / total)
    # the last bucket is ready at the end of the step; only its own ring time sticks out
    assert plan.exposed == pytest.approx(ring_allreduce_s(buckets[-1], n, NVLINK))
    # a slow link: the all-reduce outlasts the backward pass, the rest is exposed
    slow = Link("slow", 1e9, 10e-6)
    p = plan_allreduce(buckets, n, slow, c)
    assert p.exposed == pytest.approx(p.done - c) and p.exposed > p.fabric_s - c * BACKWARD_SHARE
    assert p.done >= forward + p.fabric_s


def test_one_worker_does_no_allreduce() -> None:
    plan = plan_allreduce([25 << 20] * 4, 1, NVLINK, 0.1)
    assert (plan.fabric_s, plan.exposed, plan.window, plan.bytes) == (0.0, 0.0, 0.0, 0)


def test_fabrics_ship_with_sources_and_an_unknown_one_lists_the_known() -> None:
    fabrics = load_fabrics()
    assert {"v100", "a100", "h100", "b200"} <= set(fabrics)
    h100 = fabrics["h100"]
    assert h100.node.bandwidth == 450e9 and h100.network.bandwidth == 50e9
    assert "NVLink" in h100.node.name and "InfiniBand" in h100.network.name
    assert h100.link(1) is h100.node and h100.link(2) is h100.network
    assert all(f.source for f in fabrics.values())
    with pytest.raises(WorkloadError, match="--fabric: unknown value 'tpu'; choose one of "
                                            "auto, a100, b200, h100, v100"):
        find_fabric("tpu", fabrics)


def test_allreduce_mode_defaults_and_refusals() -> None:
    emulated = DDPConfig(compute="emulate:0.05").validate()
    assert emulated.allreduce_mode == "emulate" and emulated.fabric_spec.accelerator == "h100"
    a100 = DDPConfig(compute="emulate:resnet50/a100/b400", batch_size=800, workers=2).validate()
    assert a100.fabric_spec.accelerator == "a100"
    assert DDPConfig().validate().allreduce_mode == "real"
    assert DDPConfig(compute="emulate:0.05", allreduce="real").validate().allreduce_mode == "real"
    with pytest.raises(WorkloadError, match="--allreduce emulate needs --compute emulate"):
        DDPConfig(allreduce="emulate").validate()
    with pytest.raises(WorkloadError, match="--allreduce: unknown value 'fast'"):
        DDPConfig(allreduce="fast").validate()
    with pytest.raises(WorkloadError, match="--fabric: unknown value 'tpu'"):
        DDPConfig(compute="emulate:0.05", fabric="tpu").validate()
    with pytest.raises(WorkloadError, match="--fabric a100 applies to --allreduce emulate"):
        DDPConfig(compute="emulate:0.05", allreduce="real", fabric="a100").validate()


def _step(step: float, compute: float, exposed: float, data: float = 0.0,
          other: float = 0.0) -> StepRecord:
    return StepRecord(step_s=step, compute_s=compute, allreduce_s=exposed, exposed_s=exposed,
                      other_s=other, bytes=8, data_s=data, samples=4)


def test_au_is_compute_over_step_time_with_the_allreduce_beside_it() -> None:
    # 50 ms of compute in a 100 ms step: 30 ms exposed all-reduce, 15 ms data, 5 ms harness
    rec = RankRecord(0, 0, 1.0, (_step(0.100, 0.050, 0.030, 0.015),) * 4)
    s = summarize([rec], 4)
    assert s.au == pytest.approx(0.50)
    assert s.comm_frac == pytest.approx(0.30)
    assert s.wait_frac == pytest.approx(0.15) and s.overhead_frac == pytest.approx(0.05)
    assert s.au + s.comm_frac + s.wait_frac + s.overhead_frac == pytest.approx(1.0)
    # real compute: the optimizer is the accelerator's work too
    real = summarize([RankRecord(0, 0, 1.0, (_step(0.1, 0.06, 0.0, other=0.02),) * 2)], 4)
    assert real.au == pytest.approx(0.8)


class _Peers:
    """Stands in for ``dist.all_reduce`` (max) of the workers' compute end times: the other
    workers' compute ends ``late`` seconds after this one's."""

    def __init__(self, late: float) -> None:
        self.late = late
        self.calls = 0

    def __call__(self, tensor: object, op: object = None, async_op: bool = False) -> object:
        self.calls += 1
        tensor += self.late  # type: ignore[operator]
        return self

    def wait(self) -> bool:
        return True


def test_the_wait_for_a_late_worker_is_told_apart_from_the_emulated_allreduce(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer still waiting for its data holds the others up beyond the modelled all-reduce.
    That wait stays inside ``exposed_s`` (as a real all-reduce would show it) and is
    returned apart as ``peer_s``, so the storage analysis does not blame the fabric for it
    (field test: 20 % of the step "all-reduce" on an emulated NVLink whose ring takes
    0.3 ms)."""
    import torch.distributed as dist

    from tunelab.bench.ddp.step import emulated_step

    late = 0.2
    monkeypatch.setattr(dist, "all_reduce", _Peers(late))
    sizes = [4_000_000, 4_000_000]
    plan = plan_allreduce(sizes, 2, NVLINK, 0.02)
    step = emulated_step(0.02, "emulate", 2, bucket_bytes=sizes, link=NVLINK)
    compute, window, exposed, other, nbytes, peer, busy = step(None, None)
    assert (window, nbytes, other, busy) == (plan.window, plan.bytes, 0.0, plan.fabric_s)
    assert late / 2 <= peer <= exposed and exposed >= peer + plan.exposed - 1e-6
    # with no late peer nothing is counted as waiting for one
    monkeypatch.setattr(dist, "all_reduce", _Peers(0.0))
    assert emulated_step(0.02, "emulate", 2, bucket_bytes=sizes, link=NVLINK)(None, None)[5] \
        == pytest.approx(0.0, abs=0.01)


def test_a_peer_late_by_less_than_the_backward_part_holds_the_others_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """DDP reduces its last bucket only once every worker has computed it, so a worker late
    by its data holds the others up until its backward pass ends. The emulated step met at
    a barrier launched when the backward part began: a peer up to two thirds of a step late
    held nobody up, and AU read high (field test, 4 emulated A100s from cold files: AU
    92.5 % where compute x steps / (elapsed - cache drops) was 89.3 %). Now the step ends
    after the last worker's compute."""
    import torch.distributed as dist

    from tunelab.bench.ddp.step import emulated_step

    seconds, late = 0.3, 0.12  # late by less than the backward part (0.2 s)
    peers = _Peers(late)
    monkeypatch.setattr(dist, "all_reduce", peers)
    step = emulated_step(seconds, "emulate", 4, bucket_bytes=[1_000_000], link=NVLINK)
    compute, _, exposed, _, _, peer, _ = step(None, None)
    assert peers.calls == 1 and compute >= seconds
    assert late / 2 <= peer <= exposed


def _has_torchvision() -> bool:
    return importlib.util.find_spec("torchvision") is not None


@pytest.mark.slow
@pytest.mark.skipif(not _has_torchvision(), reason="torchvision is not installed")
def test_a_run_whose_compute_share_is_known_gives_that_au(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two emulated workers, 60 ms steps from memory, ResNet-50's gradients on a fabric of
    1 GB/s (a user's fabric table) so the all-reduce sticks out of the backward pass by a
    known amount: AU is the compute's share of the step, the all-reduce beside it."""
    from tests.bench.test_ddp_run import bench, fom

    table = tmp_path / "acc.yaml"
    table.write_text("fabrics:\n  - {accelerator: slow, kind: derived, source: test,\n"
                     "     node: {name: slow, GBps: 1.0, latency_us: 0},\n"
                     "     network: {name: slow, GBps: 1.0, latency_us: 0}}\n")
    monkeypatch.setenv("TUNELAB_ACCELERATORS", str(table))
    r = fom(bench("--model", "resnet50", "--compute", "emulate:0.06", "--fabric", "slow",
                  "--workers", "2", "-b", "4", "--steps", "12", "--warmup", "2",
                  "--data", "memory", "--decode", "off", "--loader-workers", "0"))
    sizes = [4 * n for n in _resnet50_buckets()]
    plan = plan_allreduce(sizes, 2, Link("slow", 1e9, 0.0), 0.06)
    assert r["allreduce"] == "emulate" and r["allreduce_fabric"] == "slow"
    assert r["allreduce_s"] == pytest.approx(plan.window, rel=1e-6)
    assert r["exposed_s"] == pytest.approx(plan.exposed, abs=0.01)  # plus the meeting point
    # AU = 60 ms / (60 ms + exposed + the harness's own): the compute's share of the step
    assert r["au"] == pytest.approx(r["compute_s"] / r["step_s"], rel=0.05)
    expect = 0.06 / (0.06 + plan.exposed)
    assert expect - 0.06 < r["au"] <= expect + 0.01, (r["au"], expect)
    assert r["comm_frac"] == pytest.approx(r["exposed_s"] / r["step_s"], rel=0.05)
    assert json.dumps(r)  # the line is plain JSON


def _resnet50_buckets() -> list[int]:
    from tunelab.bench.ddp.comm import bucket_sizes
    from tunelab.bench.ddp.models import build_model

    model, _ = build_model("resnet50", device="meta")
    return bucket_sizes([p.numel() for p in model.parameters() if p.requires_grad], 4, 25.0)


@pytest.mark.slow
@pytest.mark.skipif(not _has_torchvision(), reason="torchvision is not installed")
def test_one_worker_does_no_allreduce_in_a_real_run() -> None:
    from tests.bench.test_ddp_run import bench, fom

    for mode in ("emulate", "real"):
        r = fom(bench("--model", "resnet50", "--compute", "emulate:0.02", "--allreduce", mode,
                      "-b", "2", "--steps", "3", "--warmup", "1"))
        assert (r["allreduce_s"], r["exposed_s"], r["grad_bytes"]) == (0.0, 0.0, 0), mode
        assert r["allreduce"] == "none" and r["allreduce_fabric"] is None
