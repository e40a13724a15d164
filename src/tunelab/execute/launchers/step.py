"""The job step: runs a job's runs one after another inside the allocation.

``python -m tunelab.execute.launchers.step JOB.json`` is the whole body of a submitted job
script. For each run of the job that has not started yet it writes the Open MPI hostfile
(the allocation's first ``nodes`` hosts), ``started.json``, runs the command with its
timeout (killing its process group on timeout), and writes ``exit.json`` with the wall time
measured here, inside the job. It never touches the store. On SIGTERM (``scancel``, the
walltime) it kills the run in flight and exits without an exit status for it, so the
controller records the scheduler's reason.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from tunelab.errors import LaunchError
from tunelab.execute.launchers.aborts import (
    JOB_ENDING,
    NEVER_STARTED,
    allocation_ends,
    job_ending,
    launcher_killed,
    launcher_stopped,
    node_failure,
    scheduler_abort,
    step_never_started,
)
from tunelab.execute.launchers.base import (
    EXIT_FILE,
    STARTED_FILE,
    Outcome,
    RunRequest,
    write_json_atomic,
)
from tunelab.execute.launchers.neighbours import other_jobs, with_neighbours
from tunelab.execute.launchers.process import run_command
from tunelab.execute.launchers.stepcheck import allocation_usable, steps_held

if TYPE_CHECKING:
    from tunelab.execute.launchers.watch import RunWatch

__all__ = ["execute_run", "main"]


class _Terminated(BaseException):
    """SIGTERM from the scheduler (cancelled or out of walltime)."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def execute_run(run: RunRequest, *, job_id: str = "", hosts: list[str] | None = None,
                environ: dict[str, str] | None = None, status_file: bool = True,
                watch: RunWatch | None = None) -> Outcome:
    """Run ``run`` here and leave ``exit.json`` (and ``started.json``) in its directory
    (without ``status_file``: only return the outcome — the local launcher keeps it).
    ``watch`` (the local launcher's) samples the machine around the run and may stop it.

    ``hosts`` are the allocation's hosts (None outside one): the first ``needs.nodes`` go
    into ``run_dir/hostfile`` and ``TUNELAB_HOSTS``, the first one's address into
    ``TUNELAB_HEAD_ADDR`` (a rendezvous for torchrun or a Dask scheduler).
    """
    if not run.run_dir.is_dir():
        run.run_dir.mkdir(parents=True)
    env = {**(os.environ if environ is None else environ), **run.env}
    host = socket.gethostname()
    if hosts is not None:
        from tunelab.cluster.allocation import node_address, write_hostfile

        mine = hosts[: run.needs.nodes]
        write_hostfile(run.run_dir / "hostfile", mine, run.needs.ranks_per_node)
        env["TUNELAB_HOSTS"] = ",".join(mine)
        if run.needs.nodes > 1:
            env["TUNELAB_HEAD_ADDR"] = node_address(mine[0])
        write_json_atomic(run.run_dir / STARTED_FILE,
                          {"job_id": job_id, "host": host, "hosts": mine, "started_at": _now(),
                           "pid": os.getpid()})
    watched = watch.start(run) if watch is not None else None
    neighbours = other_jobs(mine, job_id) if hosts is not None else set()
    started = _now()
    try:
        outcome = run_command(
            run.argv, env=env, cwd=run.cwd, timeout_s=run.timeout_s,
            stdout_path=run.run_dir / "stdout.txt", stderr_path=run.run_dir / "stderr.txt",
            should_stop=watched.should_stop if watched is not None else None, poll_s=0.2,
            shared_memory=hosts is None or run.needs.nodes <= 1)
    except LaunchError as exc:
        outcome = Outcome("failed", None, 0.0, reason=str(exc))
    if watched is not None:
        outcome = watched.finish(outcome)
    if hosts is not None:
        outcome = _infrastructure_loss(outcome, run.argv,
                                       _read_tail(run.run_dir / "stderr.txt"))
    reason = outcome.reason
    noise = outcome.noise
    if hosts is not None:
        noise = with_neighbours(noise, mine, job_id, neighbours)
    result = Outcome(outcome.status, outcome.rc, outcome.wall_s, host, started, _now(), reason,
                     noise)
    if not status_file:
        return result
    if (reason or "").startswith(JOB_ENDING):  # its program never started: no exit status,
        (run.run_dir / STARTED_FILE).unlink(missing_ok=True)  # so it is packed again as
        return result  # a run the job never began, with no attempt spent on it
    write_json_atomic(run.run_dir / EXIT_FILE, {
        "status": result.status, "rc": result.rc, "wall_s": result.wall_s, "host": host,
        "started_at": started, "ended_at": result.ended_at, "reason": reason,
        "job_id": job_id, "noise": noise})
    return result


def _infrastructure_loss(outcome: Outcome, argv: Sequence[str], stderr: bytes) -> Outcome:
    """``outcome`` as ``lost`` when the infrastructure ended the run: its launcher
    (``argv[0]``) was killed by a signal, or its standard error says so — a failure whose
    exit code is the launcher's (the scheduler aborted the step, the controller could not
    be reached), a success whose step lost a node (srun exits 0 after a node failure), or a
    timeout of a step that never started."""
    if outcome.status == "failed" and outcome.rc is not None:
        reason = launcher_killed(argv, outcome.rc) or job_ending(stderr) \
            or scheduler_abort(stderr)
    elif outcome.status == "timeout":
        reason = step_never_started(stderr) or launcher_stopped(argv, outcome.reason)
    elif outcome.status == "ok":  # a launcher that exited 0 after its step was aborted
        reason = node_failure(stderr)
    else:
        reason = None
    if reason is None:
        return outcome
    return Outcome("lost", outcome.rc, outcome.wall_s, reason=reason, noise=outcome.noise)


def _read_tail(path: Path, size: int = 16_384) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            return f.read()
    except OSError:
        return b""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def main(argv: list[str] | None = None) -> int:
    """Run every not-yet-started run of the job file ``argv[0]``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tunelab.execute.launchers.step JOB.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    job_id = os.environ.get("SLURM_JOB_ID") or os.environ.get("PBS_JOBID") or ""
    signal.signal(signal.SIGTERM, _terminate)
    from tunelab.cluster.allocation import allocation_hosts
    from tunelab.execute.gpuwatch import GpuWatch
    from tunelab.execute.launchers.watch import RunWatch
    from tunelab.noise import NoiseWatch

    hosts = allocation_hosts()
    # what others took of this node's cores (and GPUs) per run; the job's srun tasks carry
    # its id, not the step's parentage
    job_env = next((f"\0{name}={os.environ[name]}\0".encode()
                    for name in ("SLURM_JOB_ID", "PBS_JOBID") if os.environ.get(name)), None)
    watch = RunWatch("", noise=NoiseWatch(), gpus=GpuWatch.here(job_env))
    began = False
    try:
        for data in spec["runs"]:
            run = RunRequest.from_json(data)
            if (run.run_dir / STARTED_FILE).exists() or (run.run_dir / EXIT_FILE).exists():
                continue  # begun by an earlier allocation: the controller decides about it
            if began and (held := steps_held(job_id)):
                print(f"tunelab step: step(s) {', '.join(held)} still hold job {job_id}'s "
                      "CPUs; it starts no further run (the runs left are packed again)",
                      file=sys.stderr)
                return 75
            began = True
            outcome = execute_run(run, job_id=job_id, hosts=hosts, watch=watch)
            if outcome.status == "lost" and not _goes_on(job_id, outcome.reason or ""):
                return 75  # EX_TEMPFAIL: the runs left are packed again
    except _Terminated:
        print(f"tunelab step: job {job_id} terminated by the scheduler", file=sys.stderr)
        return 143
    return 0


def _goes_on(job_id: str, reason: str) -> bool:
    """After a run the infrastructure lost: True when the job may start its next run (one
    step was cancelled, or the controller was out of reach, and the job still runs on nodes
    that are up); else False, after holding the allocation when a node failed.

    A step that never started (an earlier step the controller believes still runs holds
    the job's resources) ends the job at once: a new allocation has no such step. When a
    node stopped answering, a further run would only fail the same way: the job holds the
    allocation until the scheduler ends it (it notices a dead node within its node
    timeout), so that the runs are packed again on nodes that work, and gives up after that
    timeout and a minute."""
    if reason.startswith(NEVER_STARTED):
        print(f"tunelab step: {reason}; job {job_id} starts no further run", file=sys.stderr)
        return False
    wait_s = _node_timeout_s() + 60.0
    started = time.monotonic()
    if not allocation_ends(reason) and allocation_usable(job_id, wait_s):
        print(f"tunelab step: a run was lost ({reason[:200]}); job {job_id} still runs on "
              "nodes that are up and goes on with its next run", file=sys.stderr)
        return True
    left = max(0.0, wait_s - (time.monotonic() - started))
    print(f"tunelab step: the scheduler aborted a run; job {job_id} starts no further run "
          f"and waits up to {left:.0f} s for the scheduler to end it", file=sys.stderr)
    _hold(left)
    return False


def _hold(seconds: float) -> None:
    """Hold the allocation (sleep) for ``seconds``."""
    time.sleep(seconds)


def _node_timeout_s() -> float:
    """Slurm's ``SlurmdTimeout`` (how long before a silent node is declared down), else
    Slurm's default of 300 s."""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                             timeout=30, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return 300.0
    match = re.search(r"^SlurmdTimeout\s*=\s*(\d+)", out, re.M)
    return float(match.group(1)) if match else 300.0


if __name__ == "__main__":
    sys.exit(main())
