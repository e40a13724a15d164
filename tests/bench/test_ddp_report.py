"""The DDP benchmark's table: what it tells a user about the run it measured."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tunelab.bench.ddp.config import DDPConfig
from tunelab.bench.ddp.metrics import RankRecord, StepRecord, summarize
from tunelab.bench.ddp.report import fom_record, render_table


def _result(workers: int, allreduce: str) -> dict[str, Any]:
    step = StepRecord(step_s=0.2, compute_s=0.17, allreduce_s=0.01, exposed_s=0.01,
                      other_s=0.0, bytes=100)
    ranks = [RankRecord(r, 0, 1.0, (step,)) for r in range(workers)]
    return {"summary": asdict(summarize(ranks, 64 * workers)), "unit": "images",
            "params": 25, "backend": "gloo", "threads": 1, "allreduce": allreduce,
            "setup": {}, "device": "cpu", "emulated": False, "amp": False,
            "host_cores": 2, "hosts": 1}


def _layout_row(cfg: DDPConfig, allreduce: str) -> str:
    table = render_table(cfg, _result(cfg.workers, allreduce))
    return next(line for line in table.splitlines() if line.startswith("Workers"))


def test_a_link_limit_that_carries_no_gradients_says_so() -> None:
    # the docs' first command: emulated compute on virtual nodes with 10 Gbit/s links; the
    # all-reduce defaults to the emulated fabric, so the links carry no gradient at all
    cfg = DDPConfig(model="resnet50", workers=8, nodes=2, batch_size=512,
                    compute="emulate:0.17", placement="vnodes", link_gbit=10).validate()
    row = _layout_row(cfg, cfg.allreduce_mode)
    assert "link 10 Gbit/s (carries no gradients: the all-reduce is emulate;" in row
    assert "--allreduce real" in row
    real = DDPConfig(model="resnet50", workers=8, nodes=2, batch_size=512,
                     compute="emulate:0.17", placement="vnodes", link_gbit=10,
                     allreduce="real").validate()
    assert "carries no gradients" not in _layout_row(real, "real")


def _row(cfg: DDPConfig, name: str) -> str:
    table = render_table(cfg, {**_result(cfg.workers, "real"), "threads": 1})
    return next(line for line in table.splitlines() if line.startswith(name))


def test_more_workers_than_cores_is_flagged_oversubscribed() -> None:
    # 8 workers on the 2 cores of the field test ran, with 41 % of the step "all-reduce"
    # that was mostly the workers waiting for a core; nothing said so
    eight = DDPConfig(model="leopard", workers=8, batch_size=64).validate()
    assert "OVERSUBSCRIBED: 4 threads per core (8 workers on 2 cores)" in _row(eight, "Backend")
    rec = fom_record(eight, {**_result(8, "real"), "threads": 1})
    assert rec["oversubscribed"] is True and rec["cpu_demand"] == 4.0
    two = DDPConfig(model="leopard", workers=2, batch_size=64).validate()
    assert "OVERSUBSCRIBED" not in _row(two, "Backend")
    rec = fom_record(two, {**_result(2, "real"), "threads": 1})
    assert rec["oversubscribed"] is False and rec["cpu_demand"] == 1.0
    assert "so compute and all-reduce times include waiting" in _row(eight, "Backend")
    # emulated workers sleep instead of computing: only their all-reduce waits for a core
    # (field test: the docs' first command said compute times included waiting too)
    emulated = DDPConfig(model="resnet50", workers=8, batch_size=512,
                         compute="emulate:0.17").validate()
    assert "so all-reduce times include waiting for a core" in _row(emulated, "Backend")
    # two threads each make two workers oversubscribed too
    assert fom_record(two, {**_result(2, "real"), "threads": 2})["oversubscribed"] is True


def test_synthetic_data_is_recorded_so_the_storage_analysis_leaves_it_out() -> None:
    # compare printed a Storage table (read 0.0 MB/s) for a scaling study on synthetic data
    from tunelab.workloads.ddp import DDPOptions, DDPWorkload

    synthetic = DDPConfig(model="leopard", workers=1, batch_size=8).validate()
    memory = DDPConfig(model="leopard", workers=1, batch_size=8, data="memory").validate()
    result = _result(1, "real")
    assert fom_record(synthetic, result)["synthetic_data"] is True
    assert fom_record(memory, result)["synthetic_data"] is False
    line = json.dumps({**fom_record(synthetic, result), "throughput": 10.0})
    foms = DDPWorkload(DDPOptions()).parse(line, "", Path("."))
    assert foms["synthetic_data"] == 1.0
