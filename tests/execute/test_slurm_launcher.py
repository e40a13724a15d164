"""Studies through real Slurm on the virtual cluster: per-run and pack jobs, pw.x across two
virtual nodes, resume after kill -9 of the controller, Ctrl-C, detach + status, refused
submissions, walltime, scancel and broken output (node failures and cancellations from
outside that must lose no run: test_cluster_faults.py)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import PY, tunelab

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SI = ROOT / "examples" / "qe" / "si.in"


def rows(study_dir: Path, sql: str) -> list[sqlite3.Row]:
    conn = sqlite3.connect(study_dir / "tunelab.db")
    conn.row_factory = sqlite3.Row
    try:
        return list(conn.execute(sql))
    finally:
        conn.close()


def runs(study_dir: Path) -> list[dict]:
    return [dict(r) for r in rows(study_dir, "SELECT r.*, p.params FROM runs r JOIN points p "
                                             "ON p.id = r.point_id ORDER BY r.id")]


def jobs(study_dir: Path) -> list[dict]:
    if not (study_dir / "tunelab.db").exists():
        return []
    return [dict(r) for r in rows(study_dir, "SELECT * FROM jobs ORDER BY submitted_at")]


def wait_for(predicate, timeout: float = 120.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except sqlite3.Error:
            pass
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def squeue_state(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"],
                         capture_output=True, text=True)
    return out.stdout.strip()


def qe_study(write_study, launcher: str, repeats: int = 2) -> Path:
    return write_study(f"""
        name: qe-cluster
        workload:
          name: qe
          options: {{input: {SI}, energy_tolerance: 1.0e-5}}
        parameters:
          np: [1, 2]
          nodes: [1, 2]
        constraints: ["nodes <= np"]
        repeats: {repeats}
        baseline: {{np: 1, nodes: 1}}
        timeout: 300
        objective: {{fom: pwscf_wall_s}}
        launcher: {launcher}
        """)


def test_qe_pack_spans_two_nodes_and_resumes_after_kill_9(write_study, slurm_env, tmp_path):
    path = qe_study(write_study, "{type: slurm, mode: pack, cores_per_node: 2, "
                                 "poll_interval: 0.5s, site: virtual}")
    d = tmp_path / "d"
    proc = subprocess.Popen([PY, "-m", "tunelab", "run", str(path), "--dir", str(d), "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len(runs(d)) >= 1, what="a first recorded run")
    finally:
        proc.kill()  # kill -9 of the controller while the pack still runs
        proc.wait()
    submitted = jobs(d)
    assert len(submitted) == 1 and submitted[0]["state"] == "active"
    assert squeue_state(submitted[0]["job_id"]) in ("RUNNING", "COMPLETED", "COMPLETING")
    res = tunelab("run", path, "--dir", d, "-q")
    assert res.returncode == 0, res.stderr
    done = runs(d)
    keys = [(r["params"], r["repeat"]) for r in done]
    assert len(done) == 6 and len(set(keys)) == 6  # every run exactly once
    assert all(r["status"] == "ok" for r in done), [r["reason"] for r in done]
    assert len(jobs(d)) == 1  # re-attached, never submitted again
    split = [r for r in done if json.loads(r["params"]) == {"np": 2, "nodes": 2}]
    for run in split:  # the two ranks ran on the two virtual nodes
        out = " ".join((d / run["run_dir"] / "stdout.txt").read_text().split())
        assert "running on 2 processors" in out and "MPI processes distributed on 2 nodes" in out
        hostfile = (d / run["run_dir"] / "hostfile").read_text().split()
        assert hostfile[0::2] == ["node1", "node2"]
    energies = {round(float(r["value"]), 6) for r in rows(
        d, "SELECT value FROM foms WHERE name = 'total_energy_ry'")}
    assert len(energies) == 1


def test_per_run_detach_then_status_collects(write_study, slurm_env, tmp_path):
    path = write_study("""
        name: detach
        workload:
          name: command
          options:
            argv: [sh, -c, "echo value={x}; sleep 1"]
            foms: {value: 'value=(?P<value>[0-9.]+)'}
        parameters: {x: [1, 2, 3]}
        repeats: 1
        timeout: 60
        launcher: {type: slurm, max_queued: 2, poll_interval: 0.5s}
        """)
    d = tmp_path / "d"
    res = tunelab("run", path, "--dir", d, "--detach", "-q")
    assert res.returncode == 0, res.stderr
    assert "2 job(s) in the queue" in res.stderr  # max_queued
    # a controller that does not answer (a missing SLURM_CONF would wait on DNS for a minute)
    dead = tmp_path / "dead-slurm.conf"
    dead.write_text("ClusterName=dead\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=9\n"
                    "AuthType=auth/none\nNodeName=localhost CPUs=1 State=UNKNOWN\n"
                    "PartitionName=p Nodes=localhost Default=YES\n")
    unreachable = subprocess.run([PY, "-m", "tunelab", "status", str(d)], capture_output=True,
                                 text=True, env={**os.environ, "SLURM_CONF": str(dead)})
    assert unreachable.returncode == 2 and "squeue failed" in unreachable.stderr
    assert runs(d) == [] and all(j["state"] == "active" for j in jobs(d))  # nothing lost
    wait_for(lambda: all(squeue_state(j["job_id"]) == "COMPLETED" for j in jobs(d)),
             what="the detached jobs")
    status = tunelab("status", d)
    assert status.returncode == 0, status.stderr
    assert "2/3 runs done" in status.stdout and "2 runs collected now" in status.stdout
    res = tunelab("run", path, "--dir", d, "-q")
    assert res.returncode == 0, res.stderr
    assert sorted(r["status"] for r in runs(d)) == ["ok"] * 3 and len(jobs(d)) == 3


def test_ctrl_c_cancels_the_jobs_it_submitted(write_study, slurm_env, tmp_path):
    path = write_study("""
        name: ctrlc
        workload:
          name: command
          options: {argv: [sleep, "{x}"]}
        parameters: {x: [100, 101]}
        repeats: 1
        timeout: 300
        launcher: {type: slurm, poll_interval: 0.5s}
        """)
    d = tmp_path / "d"
    proc = subprocess.Popen([PY, "-m", "tunelab", "run", str(path), "--dir", str(d), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(jobs(d)) == 2 and all(j["job_id"] for j in jobs(d)),
             what="two submitted jobs")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "batch jobs were cancelled" in err
    for job in jobs(d):
        assert job["state"] == "closed"
        wait_for(lambda j=job: squeue_state(j["job_id"]) == "CANCELLED", what="cancelled")
    assert runs(d) == []  # the cut runs are not recorded: the next run does them


def test_faults_walltime_scancel_and_broken_output(write_study, slurm_env, tmp_path):
    script = ('case {mode} in ok) echo value=1;; long) sleep 150; echo value=2;; '
              'cancel) sleep 150;; nooutput) echo value=3; rm stdout.txt;; '
              'truncated) echo value=12345; truncate -s 4 stdout.txt;; esac')
    path = write_study(f"""
        name: faults
        workload:
          name: command
          options:
            argv: [sh, -c, "{script}"]
            foms: {{value: 'value=(?P<value>[0-9.]+)'}}
        parameters: {{mode: [ok, long, cancel, nooutput, truncated]}}
        repeats: 1
        timeout: 300
        launcher: {{type: slurm, walltime: 1m, poll_interval: 0.5s, retries: 0}}
        """)
    d = tmp_path / "d"
    proc = subprocess.Popen([PY, "-m", "tunelab", "run", str(path), "--dir", str(d), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def cancel_job() -> str | None:
        for job in jobs(d):
            modes = [json.loads(r["point_key"])["mode"] for r in json.loads(job["runs"])]
            if job["job_id"] and modes == ["cancel"] and squeue_state(job["job_id"]) == "RUNNING":
                return job["job_id"]
        return None

    wait_for(lambda: cancel_job() is not None, what="the job to scancel")
    subprocess.run(["scancel", cancel_job() or ""], check=True)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, err
    by_mode = {json.loads(r["params"])["mode"]: r for r in runs(d)}
    assert by_mode["ok"]["status"] == "ok"
    # the allocation's walltime and a scancel from outside are the infrastructure's doing:
    # lost (retries: 0 here, so stored at once; a resume runs them again), never failed
    assert by_mode["long"]["status"] == "lost" and "TIMEOUT" in by_mode["long"]["reason"]
    assert by_mode["cancel"]["status"] == "lost" and "CANCELLED" in by_mode["cancel"]["reason"]
    assert by_mode["nooutput"]["status"] == "failed"
    assert "output missing" in by_mode["nooutput"]["reason"]
    assert by_mode["truncated"]["status"] == "failed"
    assert "unparsable" in by_mode["truncated"]["reason"]
    foms = rows(d, "SELECT r.status, f.name FROM foms f JOIN runs r ON r.id = f.run_id "
                   "WHERE f.name = 'value'")
    assert all(r["status"] == "ok" for r in foms)  # never a number from a broken run


@pytest.mark.parametrize("launcher, message", [
    ("{type: slurm, partition: restricted, account: bogus}", "Invalid account"),
    ("{type: slurm, walltime: 2h}", "time limit"),
    ("{type: slurm, nodes: 3}", "node"),
])
def test_refused_submissions_stop_before_anything_runs(write_study, slurm_env, tmp_path,
                                                       launcher, message):
    path = write_study(f"""
        name: refused
        workload:
          name: command
          options: {{argv: ["true"]}}
        parameters: {{x: [1, 2]}}
        repeats: 1
        launcher: {launcher}
        """)
    d = tmp_path / "d"
    res = tunelab("run", path, "--dir", d, "-q")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tunelab: error: sbatch refused")
    assert message.lower() in lines[0].lower()
    assert runs(d) == [] and jobs(d) == []


def test_missing_sbatch_is_a_one_line_error(write_study, tmp_path):
    path = write_study("""
        name: nosbatch
        workload:
          name: command
          options: {argv: [/bin/true]}
        parameters: {x: [1]}
        launcher: {type: slurm}
        """)
    env = {**os.environ, "PATH": "/nonexistent"}
    res = subprocess.run([PY, "-m", "tunelab", "run", str(path), "--dir", str(tmp_path / "d"),
                          "-q"], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip() == ("tunelab: error: 'sbatch' is not on PATH: this machine cannot "
                                  "submit to the scheduler (install the Slurm client commands "
                                  "(Debian: slurm-client), or run tunelab on the login node)")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP])
def test_kill_9_while_jobs_queue_then_resume_reattaches(write_study, slurm_env, tmp_path, sig):
    """``kill -9`` of the controller, or a hang-up (the SSH session dropped: a batch
    study's controller dies on it, its jobs are not cancelled as on Ctrl-C)."""
    path = write_study("""
        name: queued
        workload:
          name: command
          options:
            argv: [sh, -c, "sleep 2; echo value={x}"]
            foms: {value: 'value=(?P<value>[0-9.]+)'}
        parameters: {x: [1, 2, 3, 4, 5, 6]}
        repeats: 1
        timeout: 60
        launcher: {type: slurm, max_queued: 6, poll_interval: 0.5s}
        """)
    d = tmp_path / "d"
    proc = subprocess.Popen([PY, "-m", "tunelab", "run", str(path), "--dir", str(d), "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(jobs(d)) == 6 and all(j["job_id"] for j in jobs(d)),
                 what="six submitted jobs")
    finally:
        proc.send_signal(sig)
        assert proc.wait() == -sig
    pending = [j for j in jobs(d) if squeue_state(j["job_id"]) in ("PENDING", "RUNNING")]
    assert pending, "every job ended before the controller was killed"
    # a controller that died between sbatch and storing the id: the job is found by name
    conn = sqlite3.connect(d / "tunelab.db")
    with conn:
        conn.execute("UPDATE jobs SET job_id = NULL, state = 'submitting' WHERE token = ?",
                     (pending[-1]["token"],))
    conn.close()
    res = tunelab("run", path, "--dir", d, "-q")
    assert res.returncode == 0, res.stderr
    done = runs(d)
    assert sorted(json.loads(r["params"])["x"] for r in done) == [1, 2, 3, 4, 5, 6]
    assert all(r["status"] == "ok" for r in done)
    assert len(jobs(d)) == 6 and all(j["state"] == "closed" for j in jobs(d))
