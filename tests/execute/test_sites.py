"""Site profiles: the scripts each renders are what its scheduler accepts (PBS flavours
against their directive grammar, Slurm sites against a real ``sbatch --test-only``), MPI
starts the site's way, the virtual cluster's tuning stays in its own profile, and a bad
site is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import tunelab
from tests.execute.pbs_grammar import pbs_problems
from tunelab.cluster.mpi import mpi_launch_argv
from tunelab.execute.launchers import LauncherConfig, make_launcher
from tunelab.execute.launchers._batch import first_line
from tunelab.execute.launchers.base import Job, RunRequest
from tunelab.execute.launchers.script import render
from tunelab.workload import Needs


def _script(tmp_path: Path, nodes: int = 2, per_node: int = 2, **launcher) -> str:
    cfg = LauncherConfig.model_validate({"cores_per_node": 4, "account": "proj1", **launcher})
    run = RunRequest('{"x": 1}', 0, tmp_path / "r0", ("true",), {}, tmp_path,
                     60.0, Needs(nodes * per_node, nodes, 1))
    return render(make_launcher(cfg).job_script(Job("0123456789ab", (run,), tmp_path)))


@pytest.mark.parametrize("site", ["pbspro", "openpbs", "gadi", "torque"])
@pytest.mark.parametrize("nodes", [1, 2])
def test_every_pbs_site_writes_what_its_flavour_accepts(tmp_path, site, nodes):
    script = _script(tmp_path, nodes, type="pbs", site=site)
    assert pbs_problems(script, site, cores_per_node=4) == []
    assert "set -euo pipefail" in script


def test_pbs_pro_spreads_multi_node_points_and_asks_for_whole_nodes(tmp_path):
    lines = _script(tmp_path, 2, type="pbs").splitlines()  # pbspro is the PBS default
    assert "#PBS -l select=2:ncpus=2:mpiprocs=2:ompthreads=1" in lines
    assert "#PBS -l place=scatter:excl" in lines
    assert 'cd "${PBS_O_WORKDIR:-$PWD}"' in lines and "#PBS -l wd" not in lines
    shared = _script(tmp_path, 1, type="pbs", isolation="shared").splitlines()
    assert not any(line.startswith("#PBS -l place") for line in shared)


def test_gadi_keeps_its_own_directives(tmp_path):
    lines = _script(tmp_path, 2, type="pbs", site="gadi").splitlines()
    assert "#PBS -l wd" in lines and "#PBS -l ncpus=8" in lines  # 2 whole nodes of 4
    assert pbs_problems("\n".join(lines), "pbspro") != []  # what PBS Pro would refuse


def test_the_checker_refuses_what_the_old_scripts_had(tmp_path):
    old = "#!/bin/bash\n#PBS -l ncpus=8\n#PBS -l wd\n#PBS -N j\n\nexec step job.json\n"
    problems = pbs_problems(old, "pbspro")
    assert "-l wd is not a pbspro resource" in problems and "no select chunk" in problems
    assert "the job never leaves the home directory it starts in" in problems


@pytest.mark.parametrize("site, flag", [("slurm", "--mpi=pmix"), ("slurm-pmi2", "--mpi=pmi2"),
                                        ("slurm-none", "--mpi=none"), ("virtual", "--mpi=pmix")])
def test_srun_starts_ranks_the_sites_way(tmp_path, site, flag):
    launcher = make_launcher(LauncherConfig(type="slurm", site=site))
    argv = mpi_launch_argv(4, launcher.placement(Needs(4, 2, 1), tmp_path))
    assert argv[:2] == ["srun", flag]


def test_the_virtual_clusters_tuning_stays_in_its_profile(tmp_path):
    virtual = _script(tmp_path, type="slurm", site="virtual")
    assert "export OMPI_MCA_mpi_yield_when_idle=1" in virtual.splitlines()
    for site in ("slurm", "slurm-pmi2"):
        assert "OMPI_MCA_mpi_yield_when_idle" not in _script(tmp_path, type="slurm", site=site)
    assert "#SBATCH --exclusive" in virtual.splitlines()
    assert "--exclusive" not in _script(tmp_path, type="slurm", isolation="shared")


def test_a_bad_site_is_one_line_naming_file_line_and_the_choices(write_study, tmp_path):
    path = write_study("""
        name: sites
        workload:
          name: command
          options: {argv: ["true"]}
        parameters: {x: [1]}
        launcher:
          type: pbs
          site: slurm-pmi2
        """)
    res = tunelab("space", path)
    assert res.returncode == 2
    (line,) = res.stderr.strip().splitlines()
    assert f"{path}:8" in line and "site for slurm, not pbs" in line
    assert "pbspro, openpbs, gadi, torque" in line


def test_a_schedulers_refusal_is_quoted_on_one_line():
    text = "qsub: Job rejected by all possible destinations (check syntax, queue resources …)\n'\n"
    assert first_line(text) == ("qsub: Job rejected by all possible destinations (check syntax, "
                                "queue resources …)")
    assert first_line("\n-----\n'\n") == "no message"


@pytest.mark.slow
@pytest.mark.parametrize("site", ["slurm", "slurm-pmi2", "slurm-none", "virtual"])
def test_every_slurm_sites_script_passes_sbatch_test_only(slurm_env, tmp_path, site):
    import subprocess

    path = tmp_path / "job.sh"
    path.write_text(_script(tmp_path, 2, 1, type="slurm", site=site))
    res = subprocess.run(["sbatch", "--test-only", str(path)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr


@pytest.mark.slow
def test_a_job_that_cannot_load_its_modules_says_so_in_one_line(write_study, slurm_env, tmp_path):
    path = write_study("""
        name: modules
        workload:
          name: command
          options: {argv: ["true"]}
        parameters: {x: [1, 2]}
        repeats: 1
        launcher: {type: slurm, site: virtual, modules: [qe/7.2], retries: 0,
                   poll_interval: 0.5s}
        """)
    d = tmp_path / "d"
    res = tunelab("run", path, "--dir", d, "-q")
    assert res.returncode == 1
    from tests.execute.test_slurm_launcher import runs

    done = runs(d)
    assert len(done) == 2 and all(r["status"] == "lost" for r in done)
    assert all("'module' is not available in this job's shell" in r["reason"] and "qe/7.2"
               in r["reason"] for r in done)
    assert "2 lost" in res.stderr
