"""Who is to blame when a batch job ends before its runs: the decision, run by run, and the
words the scheduler and the MPI runtime print when they end a run."""

from __future__ import annotations

import pytest

from tunelab.execute.jobends import judge_run_end
from tunelab.execute.launchers.aborts import scheduler_abort


@pytest.mark.parametrize("word", ["NODE_FAIL", "BOOT_FAIL", "PREEMPTED", "CANCELLED", "TIMEOUT",
                                  "DEADLINE", "UNKNOWN", "FAILED", "COMPLETED"])
def test_a_run_cut_off_by_the_infrastructure_is_lost(word):
    end = judge_run_end(word, started=True, pack_progressed=True, job_name="tunelab-x")
    assert end.kind == "lost" and f"scheduler: {word}" in end.reason
    assert "ended during this run" in end.reason


def test_a_run_cut_off_for_its_memory_failed():
    end = judge_run_end("OUT_OF_MEMORY", started=True, pack_progressed=True, job_name="j")
    assert end.kind == "failed"


def test_runs_a_progressing_pack_never_started_are_packed_again_as_they_are():
    for word in ("NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT"):
        assert judge_run_end(word, started=False, pack_progressed=True, job_name="j").kind \
            == "repack"


def test_a_job_that_started_nothing_lost_every_run_with_its_last_words():
    end = judge_run_end("FAILED", started=False, pack_progressed=False, job_name="tunelab-ab",
                        output_tail="tunelab: module load qe failed on node1")
    assert end.kind == "lost"
    assert end.reason == ("scheduler: FAILED (job tunelab-ab ended before this run started): "
                          "tunelab: module load qe failed on node1")


@pytest.mark.parametrize("line", [
    "srun: error: Task launch for StepId=2.3 failed on node node2: Communication connection "
    "failure",
    "srun: Job step aborted: Waiting up to 7 seconds for job step to finish.",
    "slurmstepd-node1: error: *** STEP 6.5 ON node1 CANCELLED AT 2026-11-26T15:31:27 ***",
    "slurmstepd: error: *** JOB 9 ON node1 CANCELLED AT 2026-01-01 DUE TO NODE FAILURE ***",
    "ORTE has lost communication with a remote daemon.",
    "=>> PBS: job killed: node 1 (cn02) requested job terminate",
])
def test_the_words_of_an_abort_are_found(line):
    assert scheduler_abort(f"some output\n{line}\nmore\n".encode()) == line.strip()


def test_a_programs_own_failure_is_not_an_abort():
    text = ("Error in routine mp_start_pools (1):\n srun: error: node1: task 0: Exited with "
            "exit code 1\nsrun: error: node1: task 1: Killed\n")
    assert scheduler_abort(text) is None
