"""What the built-in workloads declare a run did (the Work hook): the merge's exchange, a
Leopard run's training arithmetic, a command workload's expressions."""

from __future__ import annotations

import pytest

from tunelab.errors import TunelabError
from tunelab.workloads.command import CommandOptions, CommandWorkload
from tunelab.workloads.ddp import DDPOptions, DDPWorkload
from tunelab.workloads.leopard import LeopardOptions, LeopardWorkload
from tunelab.workloads.merge import MergeOptions, MergeWorkload, link_stack


def test_merge_exchange_is_judged_as_an_all_to_all_of_one_column_message():
    options = MergeOptions().model_dump()
    (w,) = MergeWorkload.work(options, {"chunk_size": 1_000_000, "mpi_pml": "ob1"},
                              {"bandwidth": 8e8, "bytes_sent": 3.2e7, "workers": 2})
    assert w.kind == "link" and w.rate == 8e8 and w.amount == 3.2e7
    assert w.variant == {"stack": "mpi-ob1", "pattern": "alltoall", "ranks": 2, "nodes": 1,
                         "message_bytes": 4_000_000.0}
    (u,) = MergeWorkload.work(options, {"workers": 4}, {"bandwidth": 1.0})
    assert u.variant["stack"] == "mpi-ucx" and u.variant["message_bytes"] == 200_000
    assert MergeWorkload.work(options, {"transport": "ucxx"}, {"bandwidth": 1.0}) == []
    assert MergeWorkload.work(options, {}, {"throughput": 1.0}) == []
    assert (link_stack("tcp", "ob1"), link_stack("dask", "ob1", "ucxx")) == ("tcp", None)


def test_leopard_training_is_windows_per_second_times_flops_per_window():
    options = LeopardOptions().model_dump()
    foms = {"windows_per_s": 100.0, "flops_per_window": 3e9, "cuda": 0.0, "amp": 0.0}
    (w,) = LeopardWorkload.work(options, {"threads": 2}, foms)
    assert w.kind == "gemm" and w.rate == 3e11
    assert w.variant == {"precision": "fp32", "device": "cpu", "threads": 2}
    (g,) = LeopardWorkload.work(options, {}, {**foms, "cuda": 1.0, "amp": 1.0, "amp_bf16": 1.0})
    assert g.variant == {"precision": "bf16", "device": "cuda"}
    (t,) = LeopardWorkload.work(options, {}, {**foms, "cuda": 1.0})
    assert t.variant["precision"] == "tf32"
    assert LeopardWorkload.work(options, {}, {"windows_per_s": 1.0}) == []  # an older run


def test_ddp_training_arithmetic_and_dataset_reads():
    options = DDPOptions().model_dump()
    foms = {"throughput": 50.0, "flops_per_sample": 2.4e10, "compute_emulated": 0.0,
            "gpu": 0.0, "amp": 0.0}
    (w,) = DDPWorkload.work(options, {}, foms)
    assert w.kind == "gemm" and w.rate == 1.2e12 and w.variant == {"precision": "fp32",
                                                                    "device": "cpu"}
    (g,) = DDPWorkload.work(options, {}, {**foms, "gpu": 1.0, "amp": 1.0})
    assert g.variant == {"precision": "fp16", "device": "cuda"}
    emulated = {**foms, "compute_emulated": 1.0, "read_Bps": 8e8, "read_bytes": 4e9}
    (r,) = DDPWorkload.work({**options, "data": "files:/data/imagenet", "cache": "warm"}, {},
                            emulated)  # emulated compute does no arithmetic: reads only
    assert r.kind == "storage" and r.rate == 8e8 and r.amount == 4e9
    assert r.variant == {"directory": "/data/imagenet", "cache": "warm"}


@pytest.mark.slow
def test_resnet50_costs_about_24_gflop_per_training_image():
    from tunelab.bench.ddp.models import flops_per_sample

    assert flops_per_sample("resnet50") == pytest.approx(24.3e9, rel=0.02)


def test_leopard_counts_about_one_gflop_forward_per_10240_bp_window():
    pytest.importorskip("torch")
    from tunelab.leopard.model import Architecture, flops_per_window

    forward = flops_per_window(Architecture(), 10240, train=False)
    assert forward == pytest.approx(1.0056e9, rel=0.01)
    assert flops_per_window(Architecture(), 10240) == pytest.approx(3 * forward, rel=0.01)
    assert flops_per_window(Architecture(), 2048, train=False) == pytest.approx(forward / 5,
                                                                                rel=0.01)


def command_options(**work: object) -> dict:
    return CommandOptions(argv=["prog"], work=work).model_dump()


def test_command_work_evaluates_its_expressions_over_parameters_and_foms():
    options = command_options(flops="2 * n**3", bytes_moved="12 * n**2", seconds="kernel_s",
                              precision="bf16", threads="t")
    works = CommandWorkload.work(options, {"n": 1000, "t": 2}, {"kernel_s": 0.5, "wall_s": 9})
    assert [(w.kind, w.rate, w.amount) for w in works] == [("gemm", 4e9, 2e9),
                                                           ("memory", 2.4e7, 1.2e7)]
    assert works[0].variant == {"precision": "bf16", "threads": 2}
    (x,) = CommandWorkload.work(
        command_options(bytes_exchanged="size * (np - 1)", stack="mpi-ucx", ranks="np",
                        message_bytes="size"), {"np": 4, "size": 1000}, {"wall_s": 2.0})
    assert x.kind == "link" and x.rate == 1500.0
    assert x.variant == {"stack": "mpi-ucx", "pattern": "alltoall", "ranks": 4,
                         "message_bytes": 1000.0}
    (r,) = CommandWorkload.work(command_options(bytes_read="mb * 1e6", directory="/data"),
                                {"mb": 5}, {"wall_s": 0.5})
    assert r.kind == "storage" and r.variant == {"cache": "cold", "directory": "/data"}


def test_command_work_leaves_out_what_the_run_cannot_tell():
    options = command_options(flops="2 * n**3", seconds="kernel_s")
    assert CommandWorkload.work(options, {"n": 10}, {"wall_s": 1.0}) == []  # no kernel_s
    assert CommandWorkload.work(options, {}, {"kernel_s": 1.0}) == []  # no n
    assert CommandWorkload.work(command_options(flops="1"), {}, {"wall_s": 0.0}) == []
    assert CommandWorkload.work(CommandOptions(argv=["p"]).model_dump(), {}, {}) == []


@pytest.mark.parametrize("work, needle", [
    ({"flops": "import os"}, "invalid syntax"),
    ({"flops": "x.y"}, "not allowed"),
    ({"precision": "fp8"}, "precision"),
    ({"flop": "1"}, "flop"),
])
def test_command_work_is_checked_when_the_study_is_read(write_study, work, needle):
    from tunelab.spec import load_study

    lines = "".join(f"\n              {k}: '{v}'" for k, v in work.items())
    path = write_study(f"""
        name: w
        workload:
          name: command
          options:
            argv: ["true"]
            work:{lines}
        parameters: {{x: [1]}}
        """)
    from tunelab.execute.study import prepare_study

    with pytest.raises(TunelabError, match=needle) as info:
        prepare_study(load_study(path))
    assert "\n" not in str(info.value)
