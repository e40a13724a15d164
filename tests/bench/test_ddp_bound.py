"""The ddp workload's in-run bound: a run of real compute counts its training FLOPs, times
the GEMM rate of its precision with ``tunelab bounds``' own measurement and records
``bound_fraction``, which the table's throughput line and a study's ``best`` show; emulated
compute records none. (On a GPU: ``tests/bench/test_ddp_gpu.py -m cuda``.)"""

from __future__ import annotations

import json
import socket
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from tunelab.bench.ddp.config import DDPConfig
from tunelab.bench.ddp.metrics import RankRecord, StepRecord, summarize
from tunelab.bench.ddp.report import fom_record, render_table

torch = pytest.importorskip("torch")

SHAPE = {"image_size": 224, "window": 512, "patch": 128}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _train_in_process(monkeypatch: pytest.MonkeyPatch, **options: Any) -> dict[str, Any]:
    """One worker's ``_train`` in this process (a one-rank gloo group): a tiny Leopard run."""
    from tunelab.bench.ddp.worker import StatusFile, _Phase, _train

    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(k, v)
    cfg = DDPConfig(model="leopard", window=512, batch_size=2, steps=2, warmup=0,
                    device="cpu", threads=torch.get_num_threads(), **options).validate()
    return dict(_train(cfg, 0, 1, 0, StatusFile(None, 0, 0), _Phase()))


def test_a_real_run_records_its_fraction_of_the_gemm_bound_measured_in_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # before, a ddp run recorded no bound_fraction: a study's best said "no bounds measured"
    from tunelab.bench.ddp.models import flops_per_sample

    result = _train_in_process(monkeypatch)
    b = result["bound"]
    per_sample = flops_per_sample("leopard", batch=1, **SHAPE)  # counted at batch >= 2
    assert b["flops_per_sample"] == result["flops_per_sample"] == pytest.approx(per_sample)
    assert b["flops_per_step"] == pytest.approx(per_sample * 2)  # one worker, batch 2
    throughput = result["summary"]["throughput"]
    assert b["achieved_flops_per_s"] == pytest.approx(throughput * per_sample)
    assert b["bound_fraction"] == pytest.approx(b["achieved_flops_per_s"] / b["gemm_flops_per_s"])
    assert b["gemm_flops_per_s"] > 0 and b["bound_s"] > 0
    # timed before the warm-up and after the steps; the higher counts
    assert b["gemm_measurements"] >= 2 and b["gemm_before_flops_per_s"] > 0
    assert b["gemm_flops_per_s"] == max(b["gemm_before_flops_per_s"],
                                        b["gemm_after_flops_per_s"])
    assert b["gemm_under_load"] == (b["bound_fraction"] > 1)
    assert b["gemm_precision"] == "fp32"
    assert b["bound_method"].startswith("torch.matmul 2048^3 fp32")


def test_emulated_compute_records_no_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _train_in_process(monkeypatch, compute="emulate:0.001")
    assert result["bound"] == {} and result["emulated"]


def test_the_gemm_rate_is_tunelab_bounds_own_measurement(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One shared function (``tunelab.bounds.compute.gemm_rates``) times the GEMM, at the
    quick profile's size of the device, in the step's precision."""
    from tunelab.bench.ddp import bound
    from tunelab.bounds import compute

    calls: list[tuple[str, int, str, bool]] = []

    def fake(precision: str, *, n: int, device: str = "cpu", repeats: int = 5,
             seconds: float = 10.0, numpy_too: bool = True, **_: Any) -> compute.Rates:
        calls.append((precision, n, device, numpy_too))
        return compute.Rates((5.0, 7.0), "fake")

    monkeypatch.setattr(compute, "gemm_rates", fake)
    found = bound.probe_gemm("before", "fp32", "cpu")
    assert (found.when, found.flops_per_s, found.method) == ("before", 7.0, "fake")
    assert bound.probe_gemm("after", "fp16", "cuda").flops_per_s == 7.0
    assert calls == [("fp32", 2048, "cpu", False), ("fp16", 4096, "cuda", False)]


def _probes(rates: list[float]) -> tuple[Any, list[str]]:
    """A measuring seam that returns ``rates`` in turn (FLOP/s), and the calls it got."""
    from tunelab.bench.ddp.bound import GemmProbe

    calls: list[str] = []
    left = iter(rates)

    def probe(when: str, precision: str, device: str) -> GemmProbe:
        calls.append(when)
        return GemmProbe(when, next(left), "fake", 0.25)
    return probe, calls


def test_the_bound_is_the_highest_gemm_rate_of_before_the_warm_up_and_after_the_steps() -> None:
    """ResNet-18 on a shared 2-core machine recorded 2.40 of its bound: others took the
    cores while the GEMM ran after the steps, not while the steps ran. The rate measured
    before the warm-up counts too: the higher (the less disturbed) is the bound."""
    from tunelab.bench.ddp import bound
    from tunelab.bench.ddp.models import flops_per_sample

    per_sample = flops_per_sample("leopard", batch=4, **SHAPE)
    reached = 10.0 * per_sample  # the run's FLOP/s at 10 samples/s
    before = bound.GemmProbe("before", 2.5 * reached, "fake", 0.5)
    probe, calls = _probes([reached / 2.40])  # after the steps, under others' load
    found = bound.measure_inrun_bound("leopard", SHAPE, 4, 10.0, "fp32", "cpu",
                                      before=before, probe=probe)
    assert calls == ["after"]  # the bound held: measured once after the steps
    record = found.record(10.0)
    assert record["bound_fraction"] == pytest.approx(0.4)
    assert record["gemm_flops_per_s"] == record["gemm_before_flops_per_s"] == 2.5 * reached
    assert record["gemm_after_flops_per_s"] == pytest.approx(reached / 2.40)
    assert (record["gemm_measurements"], record["gemm_chosen"]) == (2, "before")
    assert record["gemm_under_load"] is False
    assert record["bound_s"] >= 0.5 + 0.25  # both measurements are its cost


def test_a_rate_still_under_the_run_is_measured_once_more_then_said_as_under_load() -> None:
    from tunelab.bench.ddp import bound
    from tunelab.bench.ddp.models import flops_per_sample

    per_sample = flops_per_sample("leopard", batch=4, **SHAPE)
    reached = 10.0 * per_sample
    before = bound.GemmProbe("before", reached / 2, "fake", 0.5)
    probe, calls = _probes([reached / 3, reached / 1.5, 9 * reached])
    found = bound.measure_inrun_bound("leopard", SHAPE, 4, 10.0, "fp32", "cpu",
                                      before=before, probe=probe)
    assert calls == ["after"] * bound.AFTER_TRIES == ["after", "after"]
    record = found.record(10.0)
    assert record["bound_fraction"] == pytest.approx(1.5)  # still above: said, not hidden
    assert (record["gemm_under_load"], record["gemm_measurements"],
            record["gemm_chosen"]) == (True, 3, "after")
    # without a rate from before the warm-up (it could not be measured): the tries after
    probe, calls = _probes([reached / 3, 2 * reached])
    found = bound.measure_inrun_bound("leopard", SHAPE, 4, 10.0, "fp32", "cpu", probe=probe)
    assert calls == ["after", "after"] and found.record(10.0)["bound_fraction"] == 0.5
    assert found.record(10.0)["gemm_before_flops_per_s"] is None


def test_a_gemm_that_cannot_run_before_the_warm_up_never_fails_the_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tunelab.bench.ddp import bound
    from tunelab.bounds import compute

    def out_of_memory(*_: Any, **__: Any) -> compute.Rates:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(compute, "gemm_rates", out_of_memory)
    cfg = DDPConfig(model="leopard", batch_size=16).validate()
    assert bound.gemm_before(cfg, "cpu", False) is None


def test_the_gemm_precision_is_the_steps() -> None:
    from tunelab.bench.ddp.step import AMP_PRECISION, gemm_precision

    assert gemm_precision("cpu", False) == "fp32"
    assert gemm_precision("cuda", True) == AMP_PRECISION == "fp16"  # the step's autocast
    before = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        assert gemm_precision("cuda", False) == "tf32"  # cuDNN's convolutions
        torch.backends.cudnn.allow_tf32 = False
        assert gemm_precision("cuda", False) == "fp32"
    finally:
        torch.backends.cudnn.allow_tf32 = before


def _result(bound: dict[str, Any], emulated: bool = False) -> dict[str, Any]:
    step = StepRecord(step_s=0.2, compute_s=0.19, allreduce_s=0.0, exposed_s=0.0,
                      other_s=0.0, bytes=0)
    summary = summarize([RankRecord(0, 0, 1.0, (step,) * 5)], 16)
    return {"summary": asdict(summary), "unit": "windows", "params": 25, "backend": "gloo",
            "threads": 2, "allreduce": "none", "setup": {}, "device": "cpu",
            "emulated": emulated, "amp": False, "host_cores": 2, "hosts": 1, "bound": bound,
            "flops_per_sample": bound.get("flops_per_sample")}


BOUND = {"flops_per_sample": 6.0e8, "flops_per_step": 9.6e9, "achieved_flops_per_s": 4.8e10,
         "gemm_flops_per_s": 1.2e11, "gemm_before_flops_per_s": 1.2e11,
         "gemm_after_flops_per_s": 9.0e10, "gemm_measurements": 2, "gemm_chosen": "before",
         "bound_fraction": 0.4, "gemm_under_load": False, "gemm_precision": "fp32",
         "bound_method": "torch.matmul 2048^3 fp32, 2 threads", "bound_s": 0.6}


def test_the_throughput_line_shows_the_fraction_and_the_json_line_records_it() -> None:
    cfg = DDPConfig(model="leopard", batch_size=16).validate()
    table = render_table(cfg, _result(BOUND))
    line = next(ln for ln in table.splitlines() if ln.startswith("Throughput"))
    assert line.endswith("per worker; 0.40 of bound")
    detail = next(ln for ln in table.splitlines() if ln.startswith("  of bound"))
    assert detail.endswith(
        "0.40 = 48.0 GFLOP/s training (0.600 GFLOP per window, forward and backward, counted)"
        " / 120.0 GFLOP/s fp32 GEMM (torch.matmul 2048^3 fp32, 2 threads; the highest of 2 "
        "measured in the run: 120.0 GFLOP/s before the warm-up, 90.0 GFLOP/s after the timed "
        "steps; 0.60 s)")
    above = {**BOUND, "bound_fraction": 1.2, "gemm_flops_per_s": 4.0e10,
             "gemm_before_flops_per_s": 4.0e10, "gemm_measurements": 3}
    table = render_table(cfg, _result(above))
    assert table.count(
        "above 1: no bound: the steps outran the GEMM every time it was measured (others' "
        "load slowed the GEMM more than the steps, or the model's kernels, e.g. oneDNN's "
        "convolutions, beat torch.matmul), so this is no fraction of the machine's rate (a "
        "study's best and report leave it out)") == 1
    assert next(ln for ln in table.splitlines() if ln.startswith("Throughput")).endswith(
        "1.20 of bound (no bound: see below)")
    record = fom_record(cfg, _result(BOUND))
    assert {k: record[k] for k in BOUND} == BOUND
    emulated = render_table(DDPConfig(model="leopard", batch_size=16,
                                      compute="emulate:0.1").validate(), _result({}, True))
    assert "none: emulated compute does no arithmetic" in emulated
    assert "of bound" not in next(ln for ln in emulated.splitlines()
                                  if ln.startswith("Throughput"))


def test_a_study_of_ddp_runs_shows_the_in_run_fraction_in_best(tmp_path: Path) -> None:
    """The workload parses the figures; report/inrun.py (unchanged) shows them."""
    import pandas as pd

    from tunelab.report.inrun import inrun_bounds, inrun_point_lines
    from tunelab.workloads.ddp import DDPOptions, DDPWorkload

    cfg = DDPConfig(model="leopard", batch_size=16).validate()
    line = json.dumps(fom_record(cfg, _result(BOUND)))
    foms = DDPWorkload(DDPOptions()).parse(f"table\n{line}\n", "", tmp_path)
    for name in ("bound_fraction", "gemm_flops_per_s", "achieved_flops_per_s",
                 "flops_per_step", "bound_s", "gemm_before_flops_per_s",
                 "gemm_after_flops_per_s", "gemm_measurements"):
        assert foms[name] == pytest.approx(BOUND[name])
    runs = pd.DataFrame([{"status": "ok", "point": '{"workers": 1}', "param.workers": 1,
                          **{f"fom.{k}": v for k, v in foms.items()}}])
    assert inrun_point_lines(inrun_bounds(runs)) == [
        "In-run fraction of bound by point (mean, lowest-highest run; measured in the run: each "
        "run's rate / the limit it timed itself while it ran (figure of merit bound_fraction)): "
        "workers=1: 0.40 (1 run)."]


def test_a_bound_that_cannot_be_measured_never_fails_the_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tunelab.bench.ddp import models
    from tunelab.bench.ddp.bound import inrun_record

    def untraceable(*_: Any, **__: Any) -> float:
        raise RuntimeError("the counter cannot trace\nthis model")

    monkeypatch.setattr(models, "flops_per_sample", untraceable)
    cfg = DDPConfig(model="leopard", batch_size=16).validate()
    record = inrun_record(cfg, 10.0, "cpu", False)
    assert record == {"bound_error": "RuntimeError: the counter cannot trace this model"}
    table = render_table(cfg, _result(record))
    assert ("  of bound      | not measured (RuntimeError: the counter cannot trace this model)"
            in table.splitlines())
    assert "bound_fraction" not in fom_record(cfg, _result(record))
