"""The job step after a run the infrastructure lost: what it records, and whether the job
goes on with its next run (Slurm itself is faked by the runs' own words and by
monkeypatching the step's questions to Slurm)."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from tunelab.execute.launchers import step, stepcheck
from tunelab.execute.launchers.base import RunRequest, write_json_atomic

UNREACHABLE = ("srun: error: Unable to confirm allocation for job 15: Unable to contact slurm "
               "controller (connect failure)")
PENDING = "srun: Cancelled pending job step with signal 15"


def _run(tmp_path: Path, name: str, script: str, timeout_s: float = 60) -> RunRequest:
    run_dir = tmp_path / name
    return RunRequest(name, 0, run_dir, (sys.executable, "-c", script), {}, tmp_path,
                      timeout_s)


def _job(tmp_path: Path, *runs: RunRequest) -> str:
    spec = tmp_path / "job.json"
    write_json_atomic(spec, {"token": "t", "python": sys.executable,
                             "runs": [r.to_json() for r in runs]})
    return str(spec)


def _exit(run: RunRequest) -> dict[str, object]:
    return json.loads((run.run_dir / "exit.json").read_text())


def _fail_with(line: str) -> str:
    return f"import sys; print({line!r}, file=sys.stderr); sys.exit(1)"


@pytest.fixture
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The step's holds, recorded instead of slept; Slurm's node timeout is 20 s."""
    slept: list[float] = []
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(step, "_node_timeout_s", lambda: 20.0)
    monkeypatch.setattr(step, "_hold", slept.append)
    return slept


def test_an_unreachable_controller_loses_the_run_and_the_job_goes_on(
        tmp_path, monkeypatch, no_waiting):
    monkeypatch.setattr(step, "allocation_usable", lambda job_id, wait_s: True)
    first = _run(tmp_path, "a", _fail_with(UNREACHABLE))
    second = _run(tmp_path, "b", "print('value=1')")
    assert step.main([_job(tmp_path, first, second)]) == 0
    lost = _exit(first)
    assert lost["status"] == "lost"
    assert lost["reason"] == f"the Slurm controller could not be reached: {UNREACHABLE}"
    assert _exit(second)["status"] == "ok" and no_waiting == []


def test_a_lost_run_on_nodes_that_are_not_up_holds_the_allocation(
        tmp_path, monkeypatch, no_waiting):
    monkeypatch.setattr(step, "allocation_usable", lambda job_id, wait_s: False)
    first = _run(tmp_path, "a", _fail_with(UNREACHABLE))
    second = _run(tmp_path, "b", "print('value=1')")
    assert step.main([_job(tmp_path, first, second)]) == 75
    assert _exit(first)["status"] == "lost"
    assert not second.run_dir.exists()  # packed again by the controller
    assert len(no_waiting) == 1 and 0 < no_waiting[0] <= 80


def test_a_node_failure_holds_without_asking_whether_the_nodes_are_up(
        tmp_path, monkeypatch, no_waiting):
    asked: list[str] = []
    monkeypatch.setattr(step, "allocation_usable", lambda job_id, wait_s: asked.append(job_id))
    first = _run(tmp_path, "a", _fail_with("srun: error: Node failure on node2"))
    assert step.main([_job(tmp_path, first)]) == 75
    assert asked == [] and len(no_waiting) == 1 and 79 < no_waiting[0] <= 80


def test_a_step_that_never_started_is_lost_not_timed_out_and_ends_the_job(
        tmp_path, monkeypatch, no_waiting):
    monkeypatch.setattr(step, "allocation_usable", lambda job_id, wait_s: True)
    waiting = ("import signal, sys, time\n"
               "def cancelled(*a):\n"
               f"    print({PENDING!r}, file=sys.stderr); sys.exit(1)\n"
               "signal.signal(signal.SIGTERM, cancelled)\n"
               "print('ready', flush=True)\n"
               "time.sleep(60)\n")
    first = _run(tmp_path, "a", waiting, timeout_s=1.0)
    second = _run(tmp_path, "b", "print('value=1')")
    assert step.main([_job(tmp_path, first, second)]) == 75
    lost = _exit(first)
    assert lost["status"] == "lost" and lost["rc"] is None
    assert lost["reason"].startswith("srun's job step never started") and PENDING in lost["reason"]
    assert not second.run_dir.exists() and no_waiting == []


def test_a_program_that_runs_too_long_is_a_timeout(tmp_path, no_waiting):
    first = _run(tmp_path, "a", "import time; time.sleep(60)", timeout_s=0.5)
    assert step.main([_job(tmp_path, first)]) == 0
    assert _exit(first)["status"] == "timeout"


def _command(tmp_path: Path, name: str, *shell: str) -> RunRequest:
    """A run whose command is an executable called ``name`` running the ``shell`` lines."""
    exe = tmp_path / "bin" / name
    exe.parent.mkdir(exist_ok=True)
    exe.write_text("#!/bin/sh\n" + "\n".join(shell) + "\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return RunRequest(name, 0, tmp_path / name, (str(exe), "-n", "2", "prog"), {}, tmp_path, 60)


def test_a_run_whose_srun_is_killed_by_a_signal_is_lost_and_the_job_goes_on(
        tmp_path, monkeypatch, no_waiting):
    monkeypatch.setattr(step, "allocation_usable", lambda job_id, wait_s: True)
    killed = _command(tmp_path, "srun", "echo 'srun: Step created for job 5' >&2", "kill -9 $$")
    second = _run(tmp_path, "b", "print('value=1')")
    assert step.main([_job(tmp_path, killed, second)]) == 0
    lost = _exit(killed)
    assert lost["status"] == "lost" and lost["rc"] == -9
    assert lost["reason"].startswith("the run's launcher srun was killed by signal 9")
    assert _exit(second)["status"] == "ok" and no_waiting == []


@pytest.mark.parametrize(("name", "shell", "rc"), [
    ("srun", ["echo 'srun: error: node1: task 0: Killed' >&2", "exit 137"], 137),  # a task's
    ("program", ["kill -SEGV $$"], -11),  # the program itself, no launcher around it
])
def test_a_program_killed_by_a_signal_failed(tmp_path, monkeypatch, no_waiting, name, shell,
                                              rc):
    monkeypatch.setattr(step, "allocation_usable", lambda job_id, wait_s: True)
    run = _command(tmp_path, name, *shell)
    assert step.main([_job(tmp_path, run)]) == 0
    failed = _exit(run)
    assert (failed["status"], failed["rc"], failed["reason"]) == ("failed", rc, None)


def _fake_squeue(monkeypatch: pytest.MonkeyPatch, listings: list[str]) -> list[list[str]]:
    """Slurm faked: each ``squeue`` answers the next of ``listings`` (the last one for
    good); the calls are returned."""
    calls: list[list[str]] = []

    def ask(argv: list[str], timeout_s: float = 30.0) -> str | None:
        calls.append(argv)
        if argv[0] != "squeue":
            return ""
        return listings.pop(0) if len(listings) > 1 else listings[0]

    monkeypatch.setattr(stepcheck, "ask_slurm", ask)
    monkeypatch.setattr(stepcheck, "_GONE_POLL_S", 0.0)
    return calls


def test_the_next_run_starts_once_the_cancelled_leftover_step_is_gone(monkeypatch, capsys):
    calls = _fake_squeue(monkeypatch, ["7.batch 7.1\n", "7.batch 7.1\n", "7.batch 7.1\n",
                                       "7.batch\n"])
    assert stepcheck.cancel_leftover_steps("7") == ["7.1"]
    assert calls.count(["scancel", "7.1"]) == 1
    assert len([c for c in calls if c[0] == "squeue"]) == 4  # listed until it was gone
    assert "cancelled step(s) 7.1 left by an earlier run of job 7" in capsys.readouterr().err


def test_a_cancelled_step_that_stays_listed_is_waited_for_a_bounded_time(monkeypatch, capsys):
    _fake_squeue(monkeypatch, ["7.batch 7.1 7.2\n"])
    assert stepcheck.cancel_leftover_steps("7", wait_s=0.0) == ["7.1", "7.2"]
    assert "step(s) 7.1, 7.2 still listed 0 s after they were cancelled" in \
        capsys.readouterr().err
