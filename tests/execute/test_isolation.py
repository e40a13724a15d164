"""Measurement isolation: jobs ask for whole nodes unless a study says ``isolation: shared``,
and every batch run records its cores and the other jobs on its nodes — a run that shared
its node is flagged ``disturbed`` with the evidence."""

from __future__ import annotations

import json

import pytest

from tests.conftest import tunelab
from tests.execute.test_slurm_launcher import rows
from tunelab.execute.launchers.neighbours import other_jobs, with_neighbours


def test_outside_a_slurm_job_nobody_is_asked_and_nothing_is_flagged(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert other_jobs(["node1"], "7") == set()
    evidence = with_neighbours(None, ["node1"], "7", set())
    assert evidence["disturbed"] == 0.0 and evidence["shared_with"] == ""
    assert evidence["cpus"] >= 1 and evidence["cpu_list"]
    flagged = with_neighbours(None, ["node1"], "7", {"9"})
    assert flagged["disturbed"] == 1.0 and "9" in str(flagged["evidence"])


def test_the_jobs_beside_a_run_add_to_what_the_watch_saw_of_its_cores():
    sample = {"cpu_list": "0-1", "cpus": 2.0, "others_share": 0.6, "disturbed": 1.0,
              "evidence": "others took 60% of cores 0-1"}
    merged = with_neighbours(sample, ["node1"], "7", {"9"})
    assert merged["cpu_list"] == "0-1" and merged["others_share"] == 0.6
    assert merged["evidence"] == ("others took 60% of cores 0-1; other jobs ran on node(s) "
                                  "node1: 9")
    quiet = with_neighbours({**sample, "disturbed": 0.0, "evidence": None}, ["node1"], "7",
                            set())
    assert quiet["disturbed"] == 0.0 and quiet["shared_with"] == ""


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
        shown = tunelab("compare", d)
        assert "Isolation: the study let its jobs share nodes with other jobs" in shown.stdout \
            + shown.stderr
    else:  # whole nodes: the second job waited for the first (a busy machine may still
        # flag a run from its cores' evidence, never from a job beside it)
        assert all(not n["shared_with"] and "other jobs" not in (n["evidence"] or "")
                   for n in noise)
    script = next((d / "jobs").glob("*.sh")).read_text()
    assert ("#SBATCH --exclusive" in script.splitlines()) == (isolation == "exclusive")
    assert json.loads(rows(d, "SELECT value FROM meta WHERE key = 'spec'")[0]["value"])
