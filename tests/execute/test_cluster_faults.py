"""Faults on the virtual Slurm cluster, as a user meets them: a node's ``slurmd`` killed in
the middle of a pack, jobs cancelled from outside (``scancel``) in pack and per-run mode, the
``srun`` of a run in flight killed (``kill -9``) in pack and per-run mode, and a run whose
retries ran out, resumed once. Every study runs from a relative directory (the
default ``runs/<name>``) and ends with every run ``ok`` exactly once and no process of its
jobs left behind (no rank, no ``slurmstepd``)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import PY
from tests.execute.test_slurm_launcher import jobs, rows, runs, squeue_state, wait_for

pytestmark = pytest.mark.slow


def _study(tmp_path: Path, name: str, launcher: str, *, xs: int = 6, sleep: float = 1.0,
           nodes: int = 2) -> tuple[Path, str]:
    """A study whose runs start a task on each of ``nodes`` nodes (srun inside the job), each
    task carrying a marker that finds its processes."""
    marker = f"tunelab-fault-{uuid.uuid4().hex[:10]}"
    (tmp_path / "study.yaml").write_text(f"""
name: {name}
workload:
  name: command
  options:
    argv: [srun, --nodes={nodes}, --ntasks={nodes}, sh, -c,
           "sleep {sleep}; echo value={{x}} #{marker}"]
    foms: {{value: 'value=(?P<value>[0-9.]+)'}}
parameters: {{x: {list(range(1, xs + 1))}, nodes: [{nodes}], ppn: [1]}}
repeats: 1
timeout: 120
launcher: {launcher}
""")
    return Path("study.yaml"), marker


def _start(tmp_path: Path, study: Path, *, quiet: bool = True) -> subprocess.Popen[str]:
    return subprocess.Popen([PY, "-m", "tunelab", "run", str(study), *(["-q"] if quiet else [])],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _processes() -> list[str]:
    """``PID ARGS`` of every process, whole lines (``ps`` cuts them at 80 characters when
    its output is not a terminal, and the markers sit at their ends)."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True)
    return out.stdout.splitlines()


def _left_behind(marker: str, job_ids: list[str]) -> list[str]:
    return [line for line in _processes()
            if marker in line
            or any(f"slurmstepd: [{j}." in line for j in job_ids)]


def _assert_every_run_ok_once_and_nothing_left(d: Path, marker: str, n: int) -> None:
    done = runs(d)
    keys = [(r["params"], r["repeat"]) for r in done]
    assert len(done) == n and len(set(keys)) == n, keys  # every run exactly once
    assert all(r["status"] == "ok" for r in done), [(r["status"], r["reason"]) for r in done]
    ids = [j["job_id"] for j in jobs(d) if j["job_id"]]
    deadline = time.monotonic() + 90  # a restarted slurmd ends its orphaned steps
    while _left_behind(marker, ids) and time.monotonic() < deadline:
        time.sleep(1)
    assert _left_behind(marker, ids) == []


def test_a_node_lost_mid_pack_loses_no_run(slurm_env, tmp_path):
    study, marker = _study(tmp_path, "nodefail", "{type: slurm, mode: pack, site: virtual, "
                                                 "poll_interval: 0.5s}", sleep=2)
    d = tmp_path / "runs" / "nodefail"
    proc = _start(tmp_path, study)
    try:
        wait_for(lambda: len(runs(d)) >= 2, what="two recorded runs")
        first = jobs(d)[0]["job_id"]
        slurm_env.slurm.kill_slurmd(2)  # node2 is lost while the pack runs on both nodes
        wait_for(lambda: squeue_state(first) == "NODE_FAIL", what="NODE_FAIL")
    finally:
        slurm_env.slurm.restart_slurmd(2)  # the node is repaired; the next pack uses it
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    lost = rows(d, "SELECT state, node, reason FROM attempts")
    assert lost and all(a["state"] in ("NODE_FAIL", "ABORTED") for a in lost)
    assert len(jobs(d)) >= 2  # what the lost pack did not finish was packed again
    _assert_every_run_ok_once_and_nothing_left(d, marker, 6)


def test_a_pack_cancelled_from_outside_loses_no_run(slurm_env, tmp_path):
    study, marker = _study(tmp_path, "packcancel", "{type: slurm, mode: pack, site: virtual, "
                                                   "poll_interval: 0.5s}")
    d = tmp_path / "runs" / "packcancel"
    proc = _start(tmp_path, study)
    wait_for(lambda: len(runs(d)) >= 2, what="two recorded runs")
    subprocess.run(["scancel", jobs(d)[0]["job_id"]], check=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert {a["state"] for a in rows(d, "SELECT state FROM attempts")} <= {"CANCELLED",
                                                                           "ABORTED"}
    _assert_every_run_ok_once_and_nothing_left(d, marker, 6)


def test_per_run_jobs_cancelled_from_outside_lose_no_run(slurm_env, tmp_path):
    study, marker = _study(tmp_path, "runcancel", "{type: slurm, site: virtual, max_queued: 4, "
                                                  "poll_interval: 0.5s}", nodes=1)
    d = tmp_path / "runs" / "runcancel"
    proc = _start(tmp_path, study)
    wait_for(lambda: sum(bool(j["job_id"]) for j in jobs(d)) >= 3, what="queued jobs")
    subprocess.run(["scancel", *[j["job_id"] for j in jobs(d) if j["job_id"]]], check=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert rows(d, "SELECT state FROM attempts")  # the cancelled ones were lost, then rerun
    _assert_every_run_ok_once_and_nothing_left(d, marker, 6)


def _kill_srun(marker: str) -> bool:
    """SIGKILL the ``srun`` of the run in flight (the one whose command carries ``marker``);
    True once one was killed."""
    for line in _processes():
        pid, _, args = line.strip().partition(" ")
        if args.startswith("srun ") and marker in args:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                continue  # it ended meanwhile: the next run's srun is killed instead
            return True
    return False


@pytest.mark.parametrize("mode", ["pack", "per-run"])
def test_a_killed_srun_loses_its_run_not_the_program(slurm_env, tmp_path, mode):
    """``kill -9`` of the ``srun`` of the run in flight: the attempt is lost (the launcher's
    death, not the program's), run again, and its orphaned step is cancelled before the
    pack's next run, which does not wait for it."""
    study, marker = _study(tmp_path, "srunkill", f"{{type: slurm, mode: {mode}, site: virtual, "
                                                 "poll_interval: 0.5s}", xs=4, sleep=3)
    d = tmp_path / "runs" / "srunkill"
    proc = _start(tmp_path, study, quiet=False)
    wait_for(lambda: _kill_srun(marker), what="the srun of a run in flight")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    attempts = [dict(a) for a in rows(d, "SELECT state, reason, job, node FROM attempts")]
    killed = [a for a in attempts
              if a["reason"].startswith("the run's launcher srun was killed by signal 9")]
    assert len(killed) == 1 and killed[0]["state"] == "ABORTED", _explain(d, attempts)
    # another attempt may only be the busy machine's own doing (a node that missed its
    # timeout), never the kill's: a next run whose step could not be created or never
    # started because the killed srun's step still held the job's CPUs
    assert not [a for a in attempts if a not in killed
                and re.search(r"never started|Unable to create step|step creation", a["reason"])
                ], _explain(d, attempts)
    said = [line for line in err.splitlines() if "an attempt was lost on node1,node2 (the "
            "run's launcher srun was killed by signal 9" in line]
    assert len(said) == 1 and said[0].endswith("; submitted again (retry 1 of 2)"), err
    waited = [p for p in d.glob("runs/*/r*/stderr.txt")
              if "step creation temporarily disabled" in p.read_text()]
    assert waited == [], _explain(d, attempts)  # no run waited for the killed srun's step
    _assert_every_run_ok_once_and_nothing_left(d, marker, 4)


def _explain(d: Path, attempts: list[dict[str, str]]) -> str:
    """The attempts and the tails of every run's stderr and job output, for a failure."""
    tails = [f"{p.relative_to(d)}: {p.read_text(errors='replace')[-600:]!r}"
             for p in sorted([*d.glob("runs/*/r*/stderr.txt"), *d.glob("jobs/*.out")])]
    return "\n".join([f"attempts: {attempts}", *tails])


def test_a_run_whose_retries_ran_out_is_lost_and_one_resume_runs_it(slurm_env, tmp_path):
    study, marker = _study(tmp_path, "exhausted", "{type: slurm, site: virtual, retries: 0, "
                                                  "poll_interval: 0.5s}", xs=3, sleep=3, nodes=1)
    d = tmp_path / "runs" / "exhausted"
    proc = _start(tmp_path, study)
    wait_for(lambda: any(j["job_id"] and squeue_state(j["job_id"]) == "RUNNING"
                         for j in jobs(d)), what="a running job")
    running = next(j for j in jobs(d) if squeue_state(j["job_id"]) == "RUNNING")
    subprocess.run(["scancel", running["job_id"]], check=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1  # a lost run is reported like a failure
    assert "did not succeed" in err
    (lost,) = [r for r in runs(d) if r["status"] == "lost"]
    assert "CANCELLED" in lost["reason"] and "a resume runs it again" in lost["reason"]
    again = subprocess.run([PY, "-m", "tunelab", "run", str(study), "-q"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert json.loads(next(r for r in runs(d) if r["params"] == lost["params"])["params"])
    _assert_every_run_ok_once_and_nothing_left(d, marker, 3)
