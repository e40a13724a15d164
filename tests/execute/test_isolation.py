"""Measurement isolation: jobs ask for whole nodes unless a study says ``isolation: shared``,
and every batch run records its cores and the other jobs on its nodes — a run that shared
its node is flagged ``disturbed`` with the evidence."""

from __future__ import annotations

import json

import pytest

from tests.conftest import tunelab
from tests.execute.test_slurm_launcher import rows
from tunelab.execute.launchers.neighbours import cpu_list, other_jobs, placement_evidence


def test_cpu_lists_in_the_kernels_notation():
    assert cpu_list([0, 1, 2, 5]) == "0-2,5"
    assert cpu_list([3]) == "3" and cpu_list([]) == ""
    assert cpu_list([7, 6, 1, 0, 0]) == "0-1,6-7"


def test_outside_a_slurm_job_nobody_is_asked_and_nothing_is_flagged(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert other_jobs(["node1"], "7") == set()
    evidence = placement_evidence(["node1"], "7", set())
    assert evidence["disturbed"] == 0.0 and evidence["shared_with"] == ""
    assert evidence["cpus"] >= 1 and evidence["cpu_list"]
    flagged = placement_evidence(["node1"], "7", {"9"})
    assert flagged["disturbed"] == 1.0 and "9" in str(flagged["evidence"])


@pytest.mark.slow
@pytest.mark.parametrize("isolation", ["shared", "exclusive"])
def test_jobs_sharing_a_node_are_flagged_and_exclusive_ones_never_share(
        write_study, slurm_env, tmp_path, isolation):
    path = write_study(f"""
        name: isolation
        workload:
          name: command
          options:
            argv: [sh, -c, "sleep 4; echo value={{x}}"]
            foms: {{value: 'value=(?P<value>[0-9.]+)'}}
        parameters: {{x: [1, 2]}}
        repeats: 1
        timeout: 60
        launcher: {{type: slurm, isolation: {isolation}, max_queued: 2, poll_interval: 0.5s,
                   directives: ["--nodelist=node1"]}}
        """)
    d = tmp_path / "d"
    res = tunelab("run", path, "--dir", d, "-q")
    assert res.returncode == 0, res.stderr
    noise = rows(d, "SELECT n.* FROM noise n JOIN runs r ON r.id = n.run_id")
    assert len(noise) == 2 and all(n["cpu_list"] for n in noise)
    if isolation == "shared":  # both jobs ran side by side on node1
        assert all(n["disturbed"] == 1 and n["shared_with"] for n in noise), \
            [dict(n) for n in noise]
        assert all("other jobs ran on node(s) node1" in n["evidence"] for n in noise)
    else:  # whole nodes: the second job waited for the first
        assert all(n["disturbed"] == 0 and not n["shared_with"] for n in noise)
    script = next((d / "jobs").glob("*.sh")).read_text()
    assert ("#SBATCH --exclusive" in script.splitlines()) == (isolation == "exclusive")
    assert json.loads(rows(d, "SELECT value FROM meta WHERE key = 'spec'")[0]["value"])
