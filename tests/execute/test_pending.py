"""A batch job that cannot start because its nodes are drained: the controller says why it
waits and stops with one line, losing nothing (Slurm's commands faked on PATH: ``squeue``
lists the job pending for drained nodes, ``sbatch --test-only`` refuses it once a node is
drained; the real cluster's behaviour is in the field notes of docs/clusters.md)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

from tests.conftest import PY

_FAKES = {
    # --test-only passes before the node is drained (the first squeue drains it)
    "sbatch": """
if [ "$1" = --test-only ]; then
  if [ -e "$STATE/drained" ]; then
    echo "sbatch: error: Batch job submission failed: Requested node configuration is" \
      "not available" >&2
    exit 1
  fi
  echo "sbatch: Job 3 to start at 2026-01-01T00:00:00" >&2; exit 0
fi
echo 45
""",
    "squeue": """
case "$*" in *--name*) exit 0;; esac
touch "$STATE/drained"
if [ -e "$STATE/cancelled" ]; then echo "45|CANCELLED|None"; exit 0; fi
echo "45|PENDING|ReqNodeNotAvail, UnavailableNodes:node2"
""",
    "sinfo": 'echo "node2|DRAINED|maintenance"\n',
    "scancel": 'touch "$STATE/cancelled"\n',
    "sacct": "exit 1\n",
}


def test_a_job_whose_nodes_are_drained_stops_the_study_with_one_line(tmp_path: Path) -> None:
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name, body in _FAKES.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}")
        (bin_dir / name).chmod(0o755)
    (tmp_path / "study.yaml").write_text("""
name: drained
workload:
  name: command
  options:
    argv: [sh, -c, "echo value={x}"]
    foms: {value: 'value=(?P<value>[0-9.]+)'}
parameters: {x: [1, 2]}
repeats: 1
timeout: 60
launcher: {type: slurm, site: virtual, max_queued: 1, poll_interval: 0.1s,
           blocked_wait: 0.3s}
""")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "STATE": str(state)}
    res = subprocess.run([PY, "-m", "tunelab", "run", "study.yaml"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    reason = "ReqNodeNotAvail, UnavailableNodes:node2 (node2: drained, maintenance)"
    assert f"job 45 pending: {reason}" in lines
    assert lines[-1].startswith("tunelab: error: job 45 (tunelab-")
    assert f"cannot start: {reason} (for " in lines[-1]
    assert "s); sbatch refused a job of 1 node(s)" in lines[-1]
    assert "Requested node configuration is not available" in lines[-1]
    assert "nothing was lost" in lines[-1]
    assert (state / "cancelled").exists()
    with sqlite3.connect(tmp_path / "runs" / "drained" / "tunelab.db") as db:
        assert db.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
        assert db.execute("SELECT count(*) FROM attempts").fetchone()[0] == 0
