"""The virtual Slurm cluster: real munge, slurmctld and one slurmd per virtual node."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tunelab.cluster.slurm import SLURM_ROOT, VirtualCluster


def _wait_job(cluster: VirtualCluster, job: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = cluster.slurm.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"])
        if state.stdout.strip() in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return state.stdout.strip()
        time.sleep(0.2)
    raise AssertionError(f"job {job} did not finish")


def test_a_job_spans_two_nodes_with_pmix(virtual_cluster, tmp_path):
    out = tmp_path / "out.txt"
    # srun's own notes ("step creation temporarily disabled" on a busy machine) go to stderr
    sub = virtual_cluster.slurm.run([
        "sbatch", "--parsable", "-N", "2", "--ntasks-per-node=1", "-o", str(out),
        "-e", str(tmp_path / "err.txt"), "--wrap",
        "srun --mpi=pmix hostname; srun hostname -I"])
    assert sub.returncode == 0, sub.stderr
    assert _wait_job(virtual_cluster, sub.stdout.strip()) == "COMPLETED"
    lines = out.read_text().split()
    assert sorted(lines[:2]) == ["node1", "node2"]
    assert sorted(lines[2:]) == sorted(n.address for n in virtual_cluster.nodes.nodes)


def test_partition_limits_refuse_jobs(virtual_cluster):
    slurm = virtual_cluster.slurm
    too_long = slurm.run(["sbatch", "-t", "2:00:00", "--wrap", "true"])
    assert too_long.returncode != 0 and "time limit" in too_long.stderr
    account = slurm.run(["sbatch", "-p", "restricted", "-A", "bogus", "--wrap", "true"])
    assert "Invalid account" in account.stderr


def test_cluster_down_leaves_no_daemon_namespace_or_state(slurm_installed):
    cluster = VirtualCluster.start(1)
    prefix, root = cluster.nodes.prefix, cluster.slurm.root
    pids = [int((root / "run" / f).read_text()) for f in ("slurmctld.pid", "munged.pid")]
    cluster.down()
    cluster.down()  # twice is fine
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        assert stat.split(") ")[1][0] == "Z", f"{stat[:40]} still runs"
    assert f"{prefix}n1" not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                               text=True).stdout
    assert not (SLURM_ROOT / prefix).exists()


def test_script_up_status_down(slurm_installed, tmp_path):
    script = Path(__file__).resolve().parents[2] / "scripts" / "virtual-cluster.sh"
    up = subprocess.run([str(script), "up", "1"], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    conf = up.stdout.strip().removeprefix("export SLURM_CONF=")
    prefix = Path(conf).parent.name
    try:
        status = subprocess.run([str(script), "status"], capture_output=True, text=True)
        assert f"{prefix} SLURM_CONF={conf}" in status.stdout
        sinfo = subprocess.run(["sinfo", "-h", "-o", "%D %t"], capture_output=True, text=True,
                               env={**os.environ, "SLURM_CONF": conf})
        assert sinfo.stdout.split() == ["1", "idle"]
    finally:
        down = subprocess.run([str(script), "down", prefix], capture_output=True, text=True)
    assert down.returncode == 0 and f"virtual cluster {prefix}: down" in down.stderr
    assert not Path(conf).exists()
    bad = subprocess.run([str(script), "up", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("virtual-cluster: error: number")
