"""The PBS launcher through Slurm's PBS-compatible qsub/qstat/qdel (Debian
``slurm-wlm-torque``) on the virtual cluster: the qe study with a point split over two
nodes, started with ``mpirun`` and the allocation's hostfile."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import tunelab
from tests.execute.test_slurm_launcher import SI, jobs, runs

pytestmark = pytest.mark.slow


def test_qe_study_runs_through_the_qsub_wrappers(write_study, slurm_env, tmp_path):
    if shutil.which("qsub") is None:
        pytest.skip("the PBS wrappers (Debian slurm-wlm-torque) are not installed")
    path = write_study(f"""
        name: qe-pbs
        workload:
          name: qe
          options: {{input: {SI}, energy_tolerance: 1.0e-5}}
        parameters:
          np: [1, 2]
          nodes: [1, 2]
        constraints: ["nodes <= np"]
        repeats: 1
        timeout: 300
        objective: {{fom: pwscf_wall_s}}
        launcher: {{type: pbs, mode: pack, pbs_resources: select, cores_per_node: 2,
                   poll_interval: 0.5s, env: {{OMPI_MCA_mpi_yield_when_idle: 1}}}}
        """)
    d = tmp_path / "d"
    res = tunelab("run", path, "--dir", d, "-q")
    assert res.returncode == 0, res.stderr
    done = runs(d)
    assert len(done) == 3 and all(r["status"] == "ok" for r in done)
    (job,) = jobs(d)
    script = (d / "jobs" / f"{job['token']}.sh").read_text()
    assert "#PBS -l select=2:ncpus=2:mpiprocs=2:ompthreads=1" in script
    split = next(r for r in done if json.loads(r["params"]) == {"np": 2, "nodes": 2})
    out = " ".join((d / split["run_dir"] / "stdout.txt").read_text().split())
    assert "MPI processes distributed on 2 nodes" in out
    command = json.loads(split["command"])
    assert command[0] == "mpirun" and "--hostfile" in command and "--bind-to" in command
