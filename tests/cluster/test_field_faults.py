"""Faults of the field that the first fault tests (tests/execute/test_cluster_faults.py) do
not build: a pack that reaches its walltime, a job requeued under tunelab, the controller
resumed after its jobs finished. The job step's side is checked with Slurm's own words (as
srun printed them on the virtual cluster); the whole study on the virtual cluster (slow)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.execute.test_cluster_faults import (
    _assert_every_run_ok_once_and_nothing_left,
    _start,
    _study,
)
from tests.execute.test_slurm_launcher import jobs, rows, runs, squeue_state, wait_for
from tunelab.cluster.slurm import VirtualCluster
from tunelab.errors import LaunchError
from tunelab.execute.launchers import LauncherConfig, step, stepcheck
from tunelab.execute.launchers import slurm as slurm_launcher
from tunelab.execute.launchers._batch import scheduler_call
from tunelab.execute.launchers.base import Job, RunRequest, write_json_atomic
from tunelab.execute.launchers.slurm import SlurmLauncher

#: What srun printed on the virtual cluster once its job's walltime had passed, while
#: squeue still said RUNNING (Slurm 22.05; the job was ended up to 30 s later).
TIME_UP = ("srun: error: Unable to create step for job 22: Job/step already completing or "
           "completed")


@pytest.fixture
def own_slurm(slurm_installed: None, monkeypatch: pytest.MonkeyPatch
              ) -> Iterator[VirtualCluster]:
    """A 2-node virtual cluster of this test's own, ``SLURM_CONF`` set for it: these tests
    kill and restart its daemons, requeue its jobs and run it past walltimes, which left the
    session's cluster unable to run the next test files' two-node jobs (PMIx across both
    nodes, merge over MPI and Dask: both failed after these tests in a whole-suite run)."""
    cluster = VirtualCluster.start(2, slurmd_timeout_s=10)
    try:
        for key, value in cluster.env.items():
            monkeypatch.setenv(key, value)
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The step's holds, recorded instead of slept; Slurm says the job still runs."""
    slept: list[float] = []
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(step, "_node_timeout_s", lambda: 20.0)
    monkeypatch.setattr(step, "_hold", slept.append)
    monkeypatch.setattr(step, "allocation_usable", lambda job_id, wait_s: True)  # squeue: R
    return slept


def _srun(tmp_path: Path, name: str, *shell: str, timeout_s: float = 60) -> RunRequest:
    """A run whose launcher is an executable ``srun`` that runs the ``shell`` lines."""
    exe = tmp_path / "bin" / "srun"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text("#!/bin/sh\n" + "\n".join(shell) + "\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return RunRequest(name, 0, tmp_path / name, (str(exe), "-n", "1", "prog"), {}, tmp_path,
                      timeout_s)


def _job(tmp_path: Path, *runs: RunRequest) -> str:
    spec = tmp_path / "job.json"
    write_json_atomic(spec, {"token": "t", "python": sys.executable,
                             "runs": [r.to_json() for r in runs]})
    return str(spec)


def test_a_step_refused_because_the_walltime_passed_is_packed_again_at_no_cost(
        tmp_path, no_waiting):
    """Once the walltime has passed, every srun is refused until Slurm ends the job: the
    refused run never started (no exit status, no start mark: the controller packs it again
    without spending a retry), and the job starts no further run (each would be refused
    the same way and spend one)."""
    refused = _srun(tmp_path, "a", f"echo '{TIME_UP}' >&2", "exit 1")
    after = RunRequest("b", 0, tmp_path / "b", (sys.executable, "-c", "print('value=1')"), {},
                       tmp_path, 60)
    assert step.main([_job(tmp_path, refused, after)]) == 75
    assert not (refused.run_dir / "exit.json").exists()
    assert not (refused.run_dir / "started.json").exists()
    assert not after.run_dir.exists()  # never begun: packed again
    assert len(no_waiting) == 1  # held the allocation until Slurm ends it


def test_an_srun_that_exits_0_after_its_node_failed_loses_the_run(tmp_path, no_waiting):
    """srun exited 0 after "Node failure on node1" on the virtual cluster (per-run job,
    slurmd of node1 killed 8 s into an 80 s run), its task cut off and no output: the run
    is lost (submitted again), never an ok run whose output is "unparsable"."""
    cut = _srun(tmp_path, "a", "echo 'srun: error: Node failure on node1' >&2", "exit 0")
    assert step.main([_job(tmp_path, cut)]) == 75
    status = json.loads((cut.run_dir / "exit.json").read_text())
    assert status["status"] == "lost" and status["rc"] == 0
    assert status["reason"] == "the scheduler ended the run: srun: error: Node failure on node1"
    assert len(no_waiting) == 1  # a node failed: the allocation is held, no further run


def test_an_srun_whose_program_cancelled_a_step_of_its_own_is_ok(tmp_path, no_waiting):
    """The merge benchmark's Dask transport ends its workers' step when it is done: srun
    prints "Job step aborted" and "STEP … CANCELLED" and exits 0. That run is ok (treating
    every abort line as the scheduler's lost every Dask merge run on two nodes, 3 of 3
    attempts, in the whole suite)."""
    words = ("srun: Job step aborted: Waiting up to 7 seconds for job step to finish.",
             "slurmstepd-node1: error: *** STEP 3.1 ON node1 CANCELLED AT 2026-11-28T21:15:34 ***")
    run = _srun(tmp_path, "a", *(f"echo '{w}' >&2" for w in words), "echo value=1", "exit 0")
    assert step.main([_job(tmp_path, run)]) == 0
    assert json.loads((run.run_dir / "exit.json").read_text())["status"] == "ok"


def test_an_srun_that_succeeded_after_the_controller_was_briefly_away_is_ok(
        tmp_path, no_waiting):
    away = ("srun: error: Unable to confirm allocation for job 15: Unable to contact slurm "
            "controller (connect failure)")
    run = _srun(tmp_path, "a", f"echo '{away}' >&2", "echo value=1", "exit 0")
    assert step.main([_job(tmp_path, run)]) == 0
    assert json.loads((run.run_dir / "exit.json").read_text())["status"] == "ok"


def test_an_srun_stopped_until_the_timeout_loses_the_run_not_the_program(tmp_path, no_waiting):
    """``kill -STOP`` of a run's srun (its tasks ended; srun could not say so): at the
    run's timeout the attempt is lost and run again, never a program's timeout; the job
    goes on with its next run."""
    held = _srun(tmp_path, "a", "kill -STOP $$", "echo value=1", timeout_s=1.0)
    after = RunRequest("b", 0, tmp_path / "b", (sys.executable, "-c", "print('value=1')"), {},
                       tmp_path, 60)
    assert step.main([_job(tmp_path, held, after)]) == 0
    status = json.loads((held.run_dir / "exit.json").read_text())
    assert status["status"] == "lost", status
    assert status["reason"].startswith("the run's launcher srun: its process was stopped")
    assert json.loads((after.run_dir / "exit.json").read_text())["status"] == "ok"


def test_a_program_stopped_until_the_timeout_is_a_timeout_that_says_so(tmp_path, no_waiting):
    """A program run without a launcher: its timeout stays its own, the reason says it was
    stopped."""
    run = RunRequest("p", 0, tmp_path / "p", ("sh", "-c", "kill -STOP $$"), {}, tmp_path, 1.0)
    assert step.main([_job(tmp_path, run)]) == 0
    status = json.loads((run.run_dir / "exit.json").read_text())
    assert status["status"] == "timeout"
    assert status["reason"].startswith("its process was stopped by a signal")


def test_a_program_that_prints_the_same_words_itself_still_failed(tmp_path, no_waiting):
    """Only srun's own line counts: a program (no launcher) echoing it failed."""
    run = RunRequest("p", 0, tmp_path / "p", (sys.executable, "-c",
                                              f"import sys; print({TIME_UP!r}); sys.exit(3)"),
                     {}, tmp_path, 60)
    assert step.main([_job(tmp_path, run)]) == 0
    status = json.loads((run.run_dir / "exit.json").read_text())
    assert (status["status"], status["rc"]) == ("failed", 3)


@pytest.mark.slow
def test_a_pack_requeued_while_a_run_is_in_flight_loses_no_run_and_says_requeued(
        own_slurm, tmp_path):
    """``scontrol requeue`` (of a job an operator made requeueable: tunelab submits with
    ``--no-requeue``) while a run is in flight: that run is a lost attempt named REQUEUED,
    not a run the job's COMPLETED end cut off, and every run ends ok exactly once."""
    study, marker = _study(tmp_path, "requeued", "{type: slurm, mode: pack, site: virtual, "
                                                 "poll_interval: 0.5s}", xs=4, sleep=3)
    d = tmp_path / "runs" / "requeued"
    proc = _start(tmp_path, study, quiet=False)
    wait_for(lambda: len(runs(d)) >= 1 and _in_flight(d), what="a run in flight")
    job = jobs(d)[0]["job_id"]
    subprocess.run(["scontrol", "update", f"jobid={job}", "requeue=1"], check=True)
    subprocess.run(["scontrol", "requeue", job], check=True)
    said = []
    assert proc.stderr is not None
    for line in proc.stderr:  # the controller saw it queued again (Slurm holds it ~2 min)
        said.append(line)
        if f"job {job} pending" in line:
            break
    subprocess.run(["scontrol", "update", f"jobid={job}", "starttime=now"], check=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, "".join(said) + err
    attempts = rows(d, "SELECT state, reason FROM attempts")
    assert attempts and {a["state"] for a in attempts} == {"REQUEUED"}, [dict(a) for a in attempts]
    assert all("put back in the queue during this run" in a["reason"] for a in attempts)
    _assert_every_run_ok_once_and_nothing_left(d, marker, 4)


def _in_flight(d: Path) -> bool:
    """A run has started and has no exit status yet."""
    return any(not (p.parent / "exit.json").exists() for p in d.glob("runs/*/r*/started.json"))


@pytest.mark.slow
def test_a_pack_that_reaches_its_walltime_spends_no_retry_on_runs_it_never_began(
        own_slurm, tmp_path):
    """40 runs of 2 s in a pack of walltime 1 min: the run the walltime cuts off is lost and
    run again; the runs srun was refused once the walltime had passed (Slurm ends the job
    up to 30 s later) are packed again as never begun, at no retry; every run ends ok
    exactly once."""
    study, marker = _study(tmp_path, "walltime", "{type: slurm, mode: pack, site: virtual, "
                                                 "walltime: 1m, poll_interval: 0.5s}",
                           xs=40, sleep=2, nodes=1)
    d = tmp_path / "runs" / "walltime"
    proc = _start(tmp_path, study, quiet=False)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    attempts = [dict(a) for a in rows(d, "SELECT state, reason FROM attempts")]
    assert not [a for a in attempts if "Unable to create step" in a["reason"]], attempts
    assert len(jobs(d)) >= 2  # the walltime ended the first pack part-way
    _assert_every_run_ok_once_and_nothing_left(d, marker, 40)


@pytest.mark.slow
def test_a_per_run_job_whose_node_fails_mid_run_loses_the_attempt_not_the_run(
        own_slurm, tmp_path):
    """slurmd of the node of a running per-run job killed: srun exits 0 after "Node failure
    on nodeK" with the task's output lost; the attempt is lost and the run is run again."""
    study, marker = _study(tmp_path, "nodefail1", "{type: slurm, site: virtual, "
                                                  "poll_interval: 0.5s}",
                           xs=1, sleep=60, nodes=1)
    d = tmp_path / "runs" / "nodefail1"
    proc = _start(tmp_path, study)
    wait_for(lambda: _in_flight(d), what="the run in flight")
    job = jobs(d)[0]["job_id"]
    node = int(own_slurm.slurm.run(["squeue", "-h", "-j", job, "-o", "%N"]).stdout.strip()
               .removeprefix("node"))
    try:
        own_slurm.slurm.kill_slurmd(node)
        wait_for(lambda: squeue_state(job) == "NODE_FAIL", what="NODE_FAIL")
    finally:
        own_slurm.slurm.restart_slurmd(node)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert rows(d, "SELECT state FROM attempts")
    _assert_every_run_ok_once_and_nothing_left(d, marker, 1)


def test_leftover_steps_are_asked_for_again_while_the_controller_is_away(monkeypatch,
                                                                          capsys):
    """slurmctld killed -9 and restarted mid-pack (measured: the step of the run that ended
    while it was down stayed listed, and the next run's srun waited for its CPUs until the
    run's 120 s timeout): before the next run the step asks again until the controller
    answers, then cancels that step."""
    answers: list[str | None] = [None, None, "7.batch 7.3\n", "7.batch\n"]
    calls: list[list[str]] = []

    def ask(argv: list[str], timeout_s: float = 30.0) -> str | None:
        calls.append(argv)
        if argv[0] != "squeue":
            return ""
        return answers.pop(0) if len(answers) > 1 else answers[0]

    monkeypatch.setattr(stepcheck, "ask_slurm", ask)
    monkeypatch.setattr(stepcheck, "_RETRY_S", 0.0)
    monkeypatch.setattr(stepcheck, "_GONE_POLL_S", 0.0)
    assert stepcheck.cancel_leftover_steps("7") == ["7.3"]
    assert ["scancel", "7.3"] in calls
    assert "cancelled step(s) 7.3" in capsys.readouterr().err


def test_a_controller_away_for_good_delays_the_next_run_a_bounded_time(monkeypatch):
    monkeypatch.setattr(stepcheck, "ask_slurm", lambda argv, timeout_s=30.0: None)
    monkeypatch.setattr(stepcheck, "_RETRY_S", 0.0)
    assert stepcheck.cancel_leftover_steps("7", wait_s=0.0) == []


DOWN = ("sbatch: error: Batch job submission failed: Unable to contact slurm controller "
        "(connect failure)")


def _slurm_job(tmp_path: Path) -> Job:
    run = RunRequest('{"x": 1}', 0, tmp_path / "r0", ("true",), {}, tmp_path, 60)
    (tmp_path / "jobs").mkdir(exist_ok=True)
    return Job("0123456789ab", (run,), tmp_path / "jobs")


def test_a_submission_while_the_controller_is_away_is_tried_again(tmp_path, monkeypatch):
    """sbatch while slurmctld restarts (measured, per-run mode: `tunelab run` stopped with
    exit 2 "sbatch refused job …: Unable to contact slurm controller"): tried again until
    the controller answers; the study goes on. sbatch and squeue are faked by scripts that
    print Slurm's words."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tries = tmp_path / "tries"
    (bin_dir / "sbatch").write_text(
        f"#!/bin/sh\necho x >> {tries}\n"
        f"[ $(wc -l < {tries}) -ge 3 ] && {{ echo 42; exit 0; }}\necho '{DOWN}' >&2; exit 1\n")
    (bin_dir / "squeue").write_text("#!/bin/sh\nexit 1\n")  # the controller is away
    for exe in bin_dir.iterdir():
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(time, "sleep", lambda s: None)
    launcher = SlurmLauncher(LauncherConfig(type="slurm"))
    assert launcher.submit(_slurm_job(tmp_path)) == "42"
    assert len(tries.read_text().split()) == 3


def test_a_refusal_is_not_tried_again(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission "
                                    "failed: Invalid account' >&2; exit 1\n")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    with pytest.raises(LaunchError, match="Invalid account"):
        SlurmLauncher(LauncherConfig(type="slurm")).submit(_slurm_job(tmp_path))


@pytest.mark.slow
def test_a_job_submitted_while_slurmctld_is_down_goes_in_once_it_is_back(own_slurm, tmp_path,
                                                                       monkeypatch):
    """The real controller killed -9: a submission made while it is down waits for it and
    is accepted once it is back (one job, not two)."""
    launcher = SlurmLauncher(LauncherConfig(type="slurm", poll_interval="0.5s"))
    job = _slurm_job(tmp_path)
    got: list[object] = []
    refused: list[str] = []

    def call(argv, **kwargs):  # the real sbatch, its refusals noted
        out = scheduler_call(argv, **kwargs)
        if argv[0] == "sbatch" and out.returncode != 0:
            refused.append(out.stderr)
        return out

    monkeypatch.setattr(slurm_launcher, "scheduler_call", call)
    own_slurm.slurm.kill_slurmctld()
    try:
        thread = threading.Thread(target=lambda: got.append(_submit_or_error(launcher, job)))
        thread.start()
        wait_for(lambda: refused, what="a submission refused while the controller is down")
    finally:
        own_slurm.slurm.restart_slurmctld()
    thread.join(timeout=400)
    assert got and isinstance(got[0], str) and got[0].isdigit(), got
    named = own_slurm.slurm.run(["squeue", "-h", "-t", "all", "--name", job.name, "-o", "%i"])
    assert named.stdout.split() == [got[0]]
    assert "Unable to contact slurm controller" in refused[0]


def _submit_or_error(launcher: SlurmLauncher, job: Job) -> object:
    try:
        return launcher.submit(job)
    except LaunchError as exc:
        return exc


def test_a_step_that_stays_listed_after_its_cancel_ends_the_pack_at_no_cost(
        tmp_path, monkeypatch, no_waiting):
    """slurmctld restarted mid-pack (measured): the step of the run that ended while it was
    down was cancelled and still listed 60 s later (its processes were gone, so the cancel
    never completed); the next run's srun then waited for its CPUs until the run's 120 s
    timeout and was lost. Now the job starts no further run: the runs left are packed
    again, never begun, at no retry."""
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setattr(stepcheck, "ask_slurm", lambda argv, timeout_s=30.0:
                        "" if argv[0] != "squeue" else "7.batch 7.1\n")
    monkeypatch.setattr(stepcheck, "_GONE_WAIT_S", 0.0)
    monkeypatch.setattr(stepcheck, "_RETRY_S", 0.0)
    first = RunRequest("a", 0, tmp_path / "a", (sys.executable, "-c", "print('value=1')"), {},
                       tmp_path, 60)
    second = RunRequest("b", 0, tmp_path / "b", (sys.executable, "-c", "print('value=2')"), {},
                        tmp_path, 60)
    assert step.main([_job(tmp_path, first, second)]) == 75
    assert json.loads((first.run_dir / "exit.json").read_text())["status"] == "ok"
    assert not second.run_dir.exists()  # never begun: packed again
