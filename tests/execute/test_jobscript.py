"""The job-script renderer: stored expected scripts in the seed's style, valid bash, and
``tunelab script`` for every workload through the same renderer."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tunelab.errors import LaunchError
from tunelab.execute.launchers.script import (
    JobScript,
    format_walltime,
    render,
    suggest_walltime,
)

EXPECTED = Path(__file__).parent / "data" / "jobscripts"

SEED_PBS = JobScript(
    scheduler="pbs", name="QE-single", walltime_s=600,
    body=("mpirun -np 40 pw.x -npool 20 -ndiag 4 -inp CeO2.in",), nodes=1, tasks_per_node=40,
    memory="190GB", account="jx00", modules=("qe",), directives=("-l software=qe",),
    env={"OMP_NUM_THREADS": "1"})


def test_pbs_script_in_the_style_of_the_seed() -> None:
    assert render(SEED_PBS) == (EXPECTED / "ceo2_single.pbs").read_text()


def test_gadi_multi_node_pbs_asks_for_whole_nodes_in_ncpus() -> None:
    job = JobScript(
        scheduler="pbs", name="QE-multi", walltime_s=5400, nodes=25, tasks_per_node=24,
        cpus_per_task=2, memory="760GB", account="jx00", partition="normal",
        modules=("intel-mpi", "qe/7.2"), env={"OMP_NUM_THREADS": "2"},
        body=("mpirun -np 600 --bind-to none pw.x -npool 20 -ndiag 16 -ntg 2 -inp CeO2.in",))
    assert render(job) == (EXPECTED / "ceo2_multi_gadi.pbs").read_text()


@pytest.mark.parametrize("style, line", [
    ("select", "#PBS -l select=2:ncpus=4:mpiprocs=2:ompthreads=2"),
    ("nodes", "#PBS -l nodes=2:ppn=4"),
    ("ncpus", "#PBS -l ncpus=8"),
])
def test_pbs_resource_styles(style, line) -> None:
    job = JobScript(scheduler="pbs", name="j", walltime_s=60, body=("true",), nodes=2,
                    tasks_per_node=2, cpus_per_task=2, pbs_resources=style)
    assert line in render(job).splitlines()


def test_slurm_script_hybrid_multi_node() -> None:
    job = JobScript(
        scheduler="slurm", name="QE-multi", walltime_s=5400, nodes=25, tasks_per_node=24,
        cpus_per_task=2, memory="760GB", account="jx00", partition="normal",
        modules=("intel-mpi", "qe/7.2"), directives=("--exclusive",),
        env={"OMP_NUM_THREADS": "2", "UCX_TLS": "rc,sm", "I_MPI_PIN_DOMAIN": "omp compact"},
        body=("srun --mpi=pmix --nodes=25 --ntasks=600 --cpus-per-task=2 --cpu-bind=cores "
              "pw.x -npool 20 -ndiag 16 -ntg 2 -inp CeO2.in",))
    assert render(job) == (EXPECTED / "ceo2_hybrid.slurm").read_text()


@pytest.mark.parametrize("scheduler", ["pbs", "slurm"])
def test_scripts_are_valid_bash(tmp_path: Path, scheduler: str) -> None:
    path = tmp_path / "job.sh"
    path.write_text(render(JobScript(scheduler=scheduler, name="j", walltime_s=61,
                                     body=("echo hi",), env={"A": "x y'z"},
                                     modules=("a b",), workdir="/tmp/x y")))
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
    assert "export A='x y'\"'\"'z'" in path.read_text()


def test_unknown_scheduler_bad_walltime_and_multi_line_values() -> None:
    with pytest.raises(LaunchError, match="unknown scheduler 'lsf'; choose one of: slurm, pbs"):
        render(JobScript(scheduler="lsf", name="j", walltime_s=60, body=()))
    with pytest.raises(LaunchError, match="walltime"):
        format_walltime(0)
    with pytest.raises(LaunchError, match="spans lines"):
        render(JobScript(scheduler="slurm", name="j", walltime_s=60, body=(),
                         directives=("--x\n#SBATCH --y",)))


def test_walltime_helpers() -> None:
    assert format_walltime(59.2) == "00:01:00"
    assert format_walltime(3723) == "01:02:03"
    assert format_walltime(90000) == "25:00:00"
    assert suggest_walltime(1.0) == 600.0
    assert suggest_walltime(400.0) == 1200.0


def test_tunelab_script_renders_any_workload_through_the_launcher_section(write_study,
                                                                          tmp_path) -> None:
    from tests.conftest import tunelab

    path = write_study("""
        name: anything
        workload:
          name: command
          options: {argv: [/bin/echo, "{np}"], env: {FIXED: "1"}}
        parameters: {np: [1, 4], nodes: [1]}
        repeats: 2
        launcher: {type: local, account: proj1, partition: debug, modules: [gcc],
                   memory: 4GB, pbs_resources: select}
        """)
    d = tmp_path / "d"
    assert tunelab("run", path, "--dir", d, "-q").returncode == 0
    slurm = tunelab("script", d, "-s", "slurm", "--walltime", "5m")
    assert slurm.returncode == 0, slurm.stderr
    lines = slurm.stdout.splitlines()
    for expected in ("#SBATCH --time=00:05:00", "#SBATCH --account=proj1",
                     "#SBATCH --partition=debug", "#SBATCH --mem=4G", "export FIXED=1",
                     "#SBATCH --exclusive", "set -euo pipefail"):
        assert expected in lines
    assert any(line.startswith("module load gcc || ") for line in lines)
    assert lines[-1] in ("echo 1", "echo 4")
    np_best = lines[-1].split()[1]
    assert f"#SBATCH --ntasks-per-node={np_best}" in lines
    pbs = tunelab("script", d, "-s", "pbs", "--queue", "normal")
    assert f"#PBS -l select=1:ncpus={np_best}:mpiprocs={np_best}:ompthreads=1" in \
        pbs.stdout.splitlines()
    assert "#PBS -q normal" in pbs.stdout and "#PBS -P proj1" in pbs.stdout
    bad = tunelab("script", d, "-s", "lsf")
    assert bad.returncode == 2 and "unknown scheduler 'lsf'" in bad.stderr
