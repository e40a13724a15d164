"""Who is to blame when a batch job ends before its runs: the decision, run by run, and the
words the scheduler and the MPI runtime print when they end a run."""

from __future__ import annotations

import pytest

from tunelab.execute.jobends import judge_run_end
from tunelab.execute.launchers.aborts import (
    allocation_ends,
    launcher_killed,
    scheduler_abort,
    step_never_started,
)


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
    assert scheduler_abort(f"some output\n{line}\nmore\n".encode()) == \
        f"the scheduler ended the run: {line.strip()}"


def test_a_programs_own_failure_is_not_an_abort():
    text = ("Error in routine mp_start_pools (1):\n srun: error: node1: task 0: Exited with "
            "exit code 1\nsrun: error: node1: task 1: Killed\n")
    assert scheduler_abort(text) is None


@pytest.mark.parametrize("line", [
    "srun: error: Unable to confirm allocation for job 15: Unable to contact slurm controller "
    "(connect failure)",
    "srun: error: Unable to create step for job 7: Unable to contact slurm controller (send "
    "failure)",
    "srun: error: Munge encode failed: Failed to connect to \"/run/munge/munge.socket.2\": "
    "Connection refused (retrying ...)",
    "srun: error: Unable to confirm allocation for job 3: Protocol authentication error",
])
def test_a_controller_out_of_reach_is_named(line):
    reason = scheduler_abort(f"{line}\nsrun: Check SLURM_JOB_ID environment variable.\n")
    assert reason is not None and reason.endswith(line)
    assert reason.startswith("the Slurm controller could not be reached: ")
    assert not allocation_ends(reason)


def test_a_programs_own_words_about_a_controller_are_not_an_abort():
    text = "my_tool: Unable to contact slurm controller at db.example\nError: exit 3\n"
    assert scheduler_abort(text) is None


@pytest.mark.parametrize("line", ["srun: error: Node failure on node2",
                                  "slurmstepd: error: *** JOB 9 ON node1 CANCELLED AT 2026 ***",
                                  "srun: error: Task launch for StepId=2.3 failed on node node2"])
def test_a_broken_or_ending_allocation_is_told_from_a_cancelled_step(line):
    assert allocation_ends(scheduler_abort(line) or "")
    step = "slurmstepd: error: *** STEP 6.5 ON node1 CANCELLED AT 2026-11-26T15:31:27 ***"
    assert not allocation_ends(scheduler_abort(step) or "")


def test_a_step_still_pending_at_the_timeout_never_started():
    cancelled = "srun: Cancelled pending job step with signal 15\nsrun: error: Unable to " \
                "create step for job 15: Job/step already completing or completed\n"
    assert "Cancelled pending job step" in (step_never_started(cancelled) or "")
    waiting = "srun: Job 3 step creation temporarily disabled, retrying (Requested nodes are busy)"
    assert step_never_started(waiting) is not None
    assert step_never_started(f"{waiting}\nsrun: Step created for job 3\nvalue=1\n") is None
    assert step_never_started("value=1\n") is None


@pytest.mark.parametrize("launcher", ["srun", "/usr/bin/srun", "mpirun", "mpiexec"])
def test_a_launcher_killed_by_a_signal_is_an_abort_on_a_step_that_goes_on(launcher):
    reason = launcher_killed([launcher, "-n", "2", "pw.x"], -9)
    name = launcher.rsplit("/", 1)[-1]
    assert reason is not None and reason.startswith(
        f"the run's launcher {name} was killed by signal 9 (Killed), not its program")
    assert not allocation_ends(reason)


@pytest.mark.parametrize(("argv", "rc"), [
    (["srun", "pw.x"], 137),  # a task killed by SIGKILL: srun exits 128 + 9 — the program's
    (["srun", "pw.x"], 1),
    (["pw.x"], -9),  # the program itself killed (the OOM killer), no launcher around it
    (["sh", "-c", "srun pw.x"], -11),
    (["srun", "pw.x"], None),
    ([], -9),
])
def test_a_programs_death_on_a_signal_is_not_a_killed_launcher(argv, rc):
    assert launcher_killed(argv, rc) is None
