"""The ``ddp`` workload: registration, the command a point becomes, the parser."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tunelab.errors import ParseError, WorkloadError
from tunelab.workload import RunContext
from tunelab.workloads import get_workload
from tunelab.workloads.ddp import DDPOptions, DDPWorkload


def ctx(tmp_path: Path, **values: object) -> RunContext:
    return RunContext(values=values, env={}, run_dir=tmp_path, study_dir=tmp_path,
                      study_file=None, cores=2)


def test_registered_through_the_entry_point() -> None:
    assert get_workload("ddp") is DDPWorkload
    w = DDPWorkload(DDPOptions())
    assert (w.objective.fom, w.objective.direction) == ("throughput", "maximize")
    assert ("workers % nodes == 0", "every node runs the same number of workers") in w.rules()


def test_point_values_and_derived_values_override_options(tmp_path: Path) -> None:
    w = DDPWorkload(DDPOptions(model="resnet50", compute="emulate:0.17", placement="vnodes",
                               link_gbit=10))
    cmd = w.command(ctx(tmp_path, workers=8, nodes=2, batch_size=512))
    argv = list(cmd.argv)
    assert argv[:3] == [sys.executable, "-m", "tunelab.bench.ddp"]

    def flag(name: str) -> str:
        return argv[argv.index(name) + 1]

    assert (flag("--workers"), flag("--nodes"), flag("--batch-size")) == ("8", "2", "512")
    assert (flag("--compute"), flag("--placement"), flag("--link-gbit")) == (
        "emulate:0.17", "vnodes", "10.0")
    assert "--threads" not in argv  # None: the benchmark shares the cores itself


def test_invalid_point_is_a_workload_error(tmp_path: Path) -> None:
    w = DDPWorkload(DDPOptions())
    with pytest.raises(WorkloadError, match="invalid point"):
        w.command(ctx(tmp_path, workers=0))


LINE = {"benchmark": "ddp", "model": "resnet18", "compute_emulated": True, "gpu": False,
        "throughput": 123.5, "images_per_s": 123.5, "step_s": 0.5, "grad_bytes": 46758048,
        "workers": 2, "nodes": 1, "unit": "images", "device": "cpu"}


def test_parse_reads_the_last_ddp_line(tmp_path: Path) -> None:
    w = DDPWorkload(DDPOptions())
    stdout = "DDP training benchmark\n{\"other\": 1}\n" + json.dumps(LINE) + "\n"
    foms = w.parse(stdout, "", tmp_path)
    assert foms["throughput"] == 123.5 and foms["grad_bytes"] == 46758048
    assert foms["compute_emulated"] == 1.0 and foms["gpu"] == 0.0
    assert "unit" not in foms and "device" not in foms  # text is not a figure of merit


def test_parse_failure_carries_the_benchmark_reason(tmp_path: Path) -> None:
    w = DDPWorkload(DDPOptions())
    stderr = ("noise\nddp: worker 1 (node 0, pid 7) in phase timed at step 1 died: killed by "
              "SIGKILL\n")
    with pytest.raises(ParseError, match=r"no ddp result line in the output \(ddp: worker 1"):
        w.parse("", stderr, tmp_path)


def test_input_pipeline_options_become_flags_and_relative_datasets_follow_the_study(
        tmp_path: Path) -> None:
    (tmp_path / "data" / "img").mkdir(parents=True)
    study = tmp_path / "study.yaml"
    w = DDPWorkload(DDPOptions(loader_workers=4, cache="warm", read_limit="200MB/s",
                               decode="off", compute="emulate:resnet50/a100/b400"),
                    study_file=study)
    argv = list(w.command(ctx(tmp_path, data="files:data/img", workers=2,
                              batch_size=800)).argv)

    def flag(name: str) -> str:
        return argv[argv.index(name) + 1]

    assert flag("--data") == f"files:{tmp_path / 'data' / 'img'}"
    assert (flag("--loader-workers"), flag("--cache"), flag("--read-limit"),
            flag("--decode")) == ("4", "warm", "200MB/s", "off")
    assert w.needs({"workers": 8, "nodes": 2}).ranks_per_node == 4


def test_in_an_allocation_nodes_start_one_torchrun_each_through_srun(tmp_path: Path) -> None:
    from dataclasses import replace

    from tunelab.cluster.mpi import Placement

    w = DDPWorkload(DDPOptions(placement="vnodes", compute="emulate:0.1"))
    job = replace(ctx(tmp_path, workers=4, nodes=2, batch_size=8),
                  placement=Placement("job", "srun", 2, 2))
    argv = list(w.command(job).argv)
    assert argv[:4] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1"]
    assert "tunelab.cluster.nodeenv" in argv
    assert argv[argv.index("--nproc_per_node") + 1] == "2"
    assert argv[argv.index("--placement") + 1] == "local"  # the scheduler placed the nodes
    one = list(w.command(replace(job, values={"workers": 2, "nodes": 1,
                                              "batch_size": 4})).argv)
    assert one[1:3] == ["-m", "tunelab.bench.ddp"] and "srun" not in one
    limited = DDPWorkload(DDPOptions(data=f"files:{tmp_path}", read_limit="10MB/s"))
    with pytest.raises(WorkloadError, match="--read-limit needs the benchmark's own launcher"):
        limited.command(replace(job, values={"workers": 2, "nodes": 2, "batch_size": 4}))


def test_parse_reads_the_input_pipeline_figures(tmp_path: Path) -> None:
    line = {**LINE, "au": 0.93, "read_MBps": 120.5, "input_bound": True, "bound": "input-bound",
            "corrupt_samples": 2, "cache": "cold", "device_share": None}
    foms = DDPWorkload(DDPOptions()).parse(json.dumps(line) + "\n", "", tmp_path)
    assert (foms["au"], foms["read_MBps"], foms["input_bound"], foms["corrupt_samples"]) == (
        0.93, 120.5, 1.0, 2.0)
    assert "device_share" not in foms and "cache" not in foms


def test_parse_records_an_oversubscribed_run(tmp_path: Path) -> None:
    line = {**LINE, "workers": 8, "cpu_demand": 4.0, "oversubscribed": True}
    foms = DDPWorkload(DDPOptions()).parse(json.dumps(line) + "\n", "", tmp_path)
    assert (foms["oversubscribed"], foms["cpu_demand"]) == (1.0, 4.0)


def test_training_flops_are_judged_per_gpu_and_per_host() -> None:
    """The GEMM bound is one GPU's (or one host's cores); the run's throughput is every
    worker's together: 8 GPUs at 0.5 of their peak each read as 4.0 of the bound. The work
    is now per GPU, per host on CPUs, with the threads the workers used on that host."""
    gpu = {"throughput": 8000.0, "flops_per_sample": 1e10, "gpu": 1.0, "amp": 1.0,
           "workers": 8.0, "hosts": 2.0}
    (w,) = DDPWorkload.work({}, {}, gpu)
    assert w.rate == pytest.approx(1e13) and w.variant == {"precision": "fp16",
                                                           "device": "cuda"}
    assert w.what == "training FLOP/s per GPU"
    cpu = {"throughput": 100.0, "flops_per_sample": 1e9, "gpu": 0.0, "workers": 4.0,
           "hosts": 2.0, "threads": 2.0, "host_cores": 4.0}
    (c,) = DDPWorkload.work({}, {}, cpu)
    assert c.rate == pytest.approx(5e10) and c.variant["threads"] == 4
    assert c.what == "training FLOP/s per host"
    # 8 workers of virtual nodes, one thread each, on one host of 2 cores: all its cores
    vnodes = {**cpu, "workers": 8.0, "hosts": 1.0, "threads": 1.0, "host_cores": 2.0}
    (v,) = DDPWorkload.work({}, {}, vnodes)
    assert v.rate == pytest.approx(1e11) and v.variant["threads"] == 2
    assert DDPWorkload.work({}, {}, {**cpu, "compute_emulated": 1.0}) == []


def test_the_scaling_example_is_the_short_study_and_names_the_full_one() -> None:
    """Field test: examples/scaling-resnet50.yaml, the docs' first study, took about an hour
    (24 runs of up to 16 workers) and said nothing of it; now it is the 5-minute version and
    the hour is examples/scaling-resnet50-full.yaml, each header saying so."""
    from tunelab.execute.study import prepare_study
    from tunelab.spec import load_study

    root = Path(__file__).resolve().parents[2] / "examples"
    short = prepare_study(load_study(root / "scaling-resnet50.yaml"), dry_run=True)
    assert short.planned_runs <= 10
    assert max(int(p["workers"]) for p in short.points) <= 4
    text = (root / "scaling-resnet50.yaml").read_text()
    assert "about 5 minutes" in text and "tunelab run examples/scaling-resnet50-full.yaml" in text
    full = prepare_study(load_study(root / "scaling-resnet50-full.yaml"), dry_run=True)
    assert full.planned_runs == 24 and full.spec.name != short.spec.name
    assert "About an hour" in (root / "scaling-resnet50-full.yaml").read_text()
