"""Job scripts for the best configuration, compared with stored expected files."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tunelab.errors import WorkloadError
from tunelab.workloads.qe import QEOptions, QEWorkload
from tunelab.workloads.qe.jobscript import (
    JobResources,
    format_walltime,
    render_for_workload,
    render_job_script,
    suggest_walltime,
)

DATA = Path(__file__).parent / "data"
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

EXPECTED = DATA / "jobscripts"


def test_pbs_script_in_the_style_of_the_seed() -> None:
    script = render_job_script(
        {"np": 40, "npool": 20, "ndiag": 4},
        scheduler="pbs",
        input_file="CeO2.in",
        resources=JobResources(walltime_s=600, mem="190GB", project="jx00",
                               job_name="QE-single", directives=("-l software=qe",)),
    )
    assert script == (EXPECTED / "ceo2_single.pbs").read_text()


def test_slurm_script_hybrid_multi_node() -> None:
    script = render_job_script(
        {"np": 600, "npool": 20, "ndiag": 16, "ntg": 2, "omp": 2},
        scheduler="slurm",
        input_file="CeO2.in",
        resources=JobResources(walltime_s=5400, mem="760GB", project="jx00", queue="normal",
                               job_name="QE-multi", modules=("intel-mpi", "qe/7.2"),
                               cores_per_node=48, directives=("--exclusive",)),
        env={"UCX_TLS": "rc,sm", "I_MPI_PIN_DOMAIN": "omp compact", "OMP_NUM_THREADS": "9"},
        launcher="srun",
        launcher_args=("--cpu-bind=cores",),
    )
    assert script == (EXPECTED / "ceo2_hybrid.slurm").read_text()


@pytest.mark.parametrize("scheduler", ["pbs", "slurm"])
def test_scripts_are_valid_bash(tmp_path: Path, scheduler: str) -> None:
    path = tmp_path / "job.sh"
    path.write_text(render_job_script({"np": 2, "npool": 2}, scheduler=scheduler,
                                      env={"A": "x y'z"}))
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0


def test_script_from_a_workload_uses_its_options() -> None:
    wl = QEWorkload(QEOptions(input="qe/si.in", mpirun="mpiexec", mpi_args=("-ppn", "48")),
                    EXAMPLES / "qe-si.yaml")
    script = render_for_workload(wl, {"np": 4, "npool": 2, "ndiag": 1}, scheduler="slurm")
    assert script.splitlines()[-1] == "mpiexec -np 4 -ppn 48 pw.x -npool 2 -ndiag 1 -inp si.in"
    assert "#SBATCH --ntasks=4" in script


def test_unknown_scheduler_and_bad_walltime() -> None:
    with pytest.raises(WorkloadError, match="unknown scheduler 'lsf'; choose one of: pbs, slurm"):
        render_job_script({"np": 1}, scheduler="lsf")
    with pytest.raises(WorkloadError, match="walltime"):
        format_walltime(0)


def test_walltime_helpers() -> None:
    assert format_walltime(59.2) == "00:01:00"
    assert format_walltime(3723) == "01:02:03"
    assert format_walltime(90000) == "25:00:00"
    assert suggest_walltime(1.0) == 600.0
    assert suggest_walltime(400.0) == 1200.0
