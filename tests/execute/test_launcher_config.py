"""The launcher section, what points need, launch lines and scheduler reasons (no scheduler
needed: these are pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunelab.cluster.mpi import Placement, mpi_launch_argv, portable_argv
from tunelab.errors import StudyError, WorkloadError
from tunelab.execute.jobends import scheduler_reason
from tunelab.execute.launchers import LocalLauncher, SlurmLauncher, launcher_config
from tunelab.execute.launchers.base import Job, JobStatus, RunRequest, read_exit_status
from tunelab.execute.study import prepare_study
from tunelab.spec import load_study
from tunelab.workload import Needs

STUDY = """\
name: s
workload:
  name: command
  options: {argv: [/bin/true]}
parameters: {x: [1]}
launcher:
  type: slurm
"""


def _spec(write_study, launcher_lines: str):
    return load_study(write_study(STUDY + launcher_lines))


@pytest.mark.parametrize("lines, message", [
    ("  mode: batch\n", "study.yaml:8: launcher 'mode': Input should be 'per-run' or 'pack'"),
    ("  walltime: soon\n", "study.yaml:8: launcher 'walltime': must be a duration"),
    ("  queue: two words\n", "study.yaml:8: launcher 'queue': must be one word"),
    ("  max_queued: 0\n", "study.yaml:8: launcher 'max_queued': Input should be greater than"),
    ("  directives: [\"--a\\n#SBATCH --b\"]\n", "launcher 'directives': each entry must be"),
    ("  memory: lots\n", "study.yaml:8: launcher 'memory': must be a size"),
    ("  partitoin: debug\n", "study.yaml:8: unknown launcher field 'partitoin'; valid:"),
    ("  env: {1BAD: x}\n", "launcher 'env': '1BAD' is not an environment variable name"),
])
def test_bad_launcher_fields_are_one_line_errors(write_study, lines, message):
    with pytest.raises(StudyError) as info:
        launcher_config(_spec(write_study, lines))
    text = str(info.value)
    assert message in text and "\n" not in text
    assert text.startswith(str(Path(write_study(STUDY)).parent))


def test_aliases_defaults_and_identity(write_study):
    spec = _spec(write_study, "  project: jx00\n  queue: normal\n  walltime: 90m\n")
    cfg = launcher_config(spec)
    assert (cfg.account, cfg.partition, cfg.walltime_s, cfg.mode) == ("jx00", "normal", 5400.0,
                                                                       "per-run")
    assert cfg.starter_for("slurm") == "srun" and cfg.starter_for("pbs") == "mpirun"
    local = load_study(write_study(STUDY.replace("  type: slurm\n", "  type: local\n"), "b.yaml"))
    assert local.identity_hash() == spec.identity_hash()  # where runs execute is not identity


def test_cluster_cores_come_from_the_nodes_not_this_machine(write_study):
    spec = load_study(write_study(STUDY.replace("parameters: {x: [1]}",
                                                "parameters: {np: [1, 8, 96], nodes: [1, 2]}")
                                  + "  cores_per_node: 48\n"))
    study = prepare_study(spec)
    assert study.space.constants["cores"] == 96 and study.space.constants["cores_per_node"] == 48


@pytest.mark.parametrize("values, needs", [
    ({}, Needs(1, 1, 1)),
    ({"np": 4, "omp": 2}, Needs(4, 1, 2)),
    ({"nodes": 2, "ppn": 3}, Needs(6, 2, 1)),
    ({"np": 6, "ppn": 4}, Needs(6, 2, 1)),
    ({"np": 4, "nodes": 2}, Needs(4, 2, 1)),
])
def test_needs_from_point_values(values, needs):
    assert Needs.from_values(values) == needs


def test_needs_refuse_impossible_shapes():
    with pytest.raises(WorkloadError, match="cannot span 3 nodes"):
        Needs(2, 3)
    with pytest.raises(WorkloadError, match="whole number"):
        Needs.from_values({"np": 2.5})
    with pytest.raises(WorkloadError, match="from 1 to"):
        Needs(10**9)
    assert Needs(5, 2).ranks_per_node == 3


def test_launch_lines_per_placement(tmp_path):
    job = Placement("job", "mpirun", 2, 2, tmp_path / "hostfile")
    argv = mpi_launch_argv(4, job, threads=1)
    assert argv[:3] == ["mpirun", "-np", "4"] and argv[-2:] == ["--bind-to", "none"]
    assert ["--hostfile", str(tmp_path / "hostfile")] == argv[argv.index("--hostfile"):][:2]
    srun = mpi_launch_argv(4, Placement("job", "srun", 2), threads=2)
    assert srun == ["srun", "--mpi=pmix", "--nodes=2", "--ntasks=4", "--cpus-per-task=2"]
    script = mpi_launch_argv(40, Placement("script", "mpirun", 1))
    assert script == ["mpirun", "-np", "40", "--bind-to", "none"]
    hydra = mpi_launch_argv(8, job, mpirun="mpiexec.hydra", extra_args=["-ppn", "4"])
    assert hydra == ["mpiexec.hydra", "-np", "8", "-ppn", "4"]
    assert portable_argv(["/bin/sh", "/no/such/tool", "x"]) == ["sh", "/no/such/tool", "x"]


def test_local_launcher_places_here_and_batch_in_the_job(tmp_path):
    from tunelab.execute.launchers.config import LauncherConfig

    assert LocalLauncher().placement(Needs(2), tmp_path) == Placement()
    slurm = SlurmLauncher(LauncherConfig(type="slurm", cores_per_node=4))
    assert slurm.placement(Needs(4, 2), tmp_path) == Placement("job", "srun", 2, 4,
                                                                tmp_path / "hostfile")


def test_pack_job_is_sized_for_its_largest_run(tmp_path):
    def run(needs: Needs) -> RunRequest:
        return RunRequest("{}", 0, tmp_path, ("true",), {}, tmp_path, 10.0, needs)

    job = Job("t", (run(Needs(1)), run(Needs(4, 2, 1)), run(Needs(2, 1, 3))), tmp_path)
    assert job.needs() == Needs(4, 2, 3)
    assert RunRequest.from_json(run(Needs(4, 2)).to_json()) == run(Needs(4, 2))


def test_scheduler_reasons(tmp_path):
    out = tmp_path / "job.out"
    assert scheduler_reason(JobStatus("ended", "TIMEOUT"), None) == "TIMEOUT"
    out.write_text("slurmstepd: error: *** JOB 7 ON node1 CANCELLED AT 2026-01-01 DUE TO "
                   "TIME LIMIT ***\n")
    assert scheduler_reason(JobStatus("unknown"), out) == "TIMEOUT"
    out.write_text("=>> PBS: job killed: walltime 610 exceeded limit 600\n")
    assert scheduler_reason(JobStatus("ended", "F"), out) == "TIMEOUT"
    out.write_text("slurmstepd: error: *** JOB 8 ON node1 CANCELLED AT 2026-01-01 ***\n")
    assert scheduler_reason(JobStatus("ended", "C"), out) == "CANCELLED"
    assert scheduler_reason(JobStatus("unknown"), tmp_path / "none") == "UNKNOWN"


def test_exit_status_files(tmp_path):
    assert read_exit_status(tmp_path) is None
    (tmp_path / "exit.json").write_text('{"status": "ok", "rc": 0, "wal')
    broken = read_exit_status(tmp_path)
    assert broken is not None and broken.status == "failed"
    assert broken.reason is not None and "unreadable exit-status file" in broken.reason


def test_the_cluster_example_packs_its_points():
    spec = load_study(Path(__file__).resolve().parents[2] / "examples" / "qe-si-slurm.yaml")
    study = prepare_study(spec)
    assert (study.launcher.type, study.launcher.mode) == ("slurm", "pack")
    needs = [study.workload.needs(study.space.values(p)) for p in study.points]
    assert max(n.nodes for n in needs) == 2 and Needs(4, 2) in needs


def test_local_cores_are_those_this_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``taskset -c 0`` (or a batch job's cgroup) a local run is sized by the cores it
    may use: before, ``os.cpu_count()`` made the leopard workload run 2 threads on 1 core."""
    import os

    from tunelab.execute.launchers.config import LauncherConfig
    from tunelab.space import Space

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert LocalLauncher().cores_per_node == 1
    assert Space([("x", (1, 2))]).constants["cores"] == 1
    assert SlurmLauncher(LauncherConfig(type="slurm")).cores_per_node == 8  # a node's guess
