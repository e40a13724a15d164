"""The Slurm launcher: ``sbatch`` to submit, ``squeue`` (and ``sacct`` when there is
accounting) to poll, ``scancel`` to cancel. Works without Slurm accounting: a job that left
the queue is judged by the exit-status files of its runs."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Sequence

from tunelab.errors import LaunchError
from tunelab.execute.launchers._batch import BatchLauncher, first_line, scheduler_call
from tunelab.execute.launchers.base import Job, JobStatus, require

__all__ = ["UNREACHABLE_PATIENCE_S", "SlurmLauncher"]

UNREACHABLE_PATIENCE_S = 300.0
"""How long the controller may be out of reach before a submission or a poll gives up."""

#: sbatch's words when it could not reach slurmctld (nothing was submitted, or it timed out).
_UNREACHABLE = re.compile(r"Unable to contact slurm controller|Socket timed out on send/recv"
                          r"|Communication connection failure")

_QUEUED = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED",
           "RESV_DEL_HOLD", "STOPPED", "RESIZING", "SIGNALING"}
_RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT"}


#: Pending reasons (``squeue %r``) that say the job cannot start on the cluster as it is.
_BLOCKED = re.compile(r"ReqNodeNotAvail|Nodes required for job are DOWN|NodeDown|PartitionDown"
                      r"|PartitionInactive|PartitionNodeLimit|BadConstraints")


def _phase(state: str, reason: str = "") -> JobStatus:
    word = state.split()[0].rstrip("+") if state.strip() else ""
    if word in _QUEUED:
        reason = "" if reason.strip() in ("None", "(null)") else reason.strip()
        return JobStatus("queued", word, reason, bool(_BLOCKED.search(reason)))
    if word in _RUNNING:
        return JobStatus("running", word)
    return JobStatus("ended", word or "UNKNOWN")


class SlurmLauncher(BatchLauncher):
    """Submits jobs with ``sbatch`` (``--parsable``, ``--no-requeue``)."""

    name = "slurm"
    scheduler = "slurm"

    def check(self, shapes: Sequence[Job]) -> None:
        """Slurm's commands exist, and ``sbatch --test-only`` accepts every job shape."""
        for cmd in ("sbatch", "squeue", "scancel"):
            require(cmd, "the Slurm client commands (Debian: slurm-client)")
        self.check_with(shapes, ["sbatch", "--test-only"])

    def submit(self, job: Job) -> str:
        """``sbatch --parsable SCRIPT``; the job id. While the controller cannot be reached
        (``slurmctld`` restarting) the submission is tried again, for as long as a poll may
        go unanswered, each time after looking for the job by its name (an ``sbatch`` that
        timed out may have reached the controller)."""
        script = self.write(job)
        deadline = time.monotonic() + UNREACHABLE_PATIENCE_S
        while True:
            out = scheduler_call(["sbatch", "--parsable", str(script)])
            if out.returncode == 0 or not _UNREACHABLE.search(out.stderr) \
                    or time.monotonic() > deadline:
                break
            time.sleep(max(self.config.poll_s, 1.0))
            found = self.find(job)
            if found is not None:
                return found
        if out.returncode != 0:
            raise LaunchError(f"sbatch refused job {job.name}: {first_line(out.stderr)}")
        job_id = out.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise LaunchError(f"sbatch printed no job id for {job.name}: {out.stdout.strip()!r}")
        return job_id

    def poll(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """States from ``squeue -t all`` (then ``sacct``); ``unknown`` when neither knows;
        :class:`LaunchError` when ``squeue`` cannot answer at all."""
        if not job_ids:
            return {}
        fmt = ["-h", "-t", "all", "-o", "%i|%T|%r"]
        out = scheduler_call(["squeue", *fmt, "-j", ",".join(job_ids)])
        if out.returncode != 0:  # an id Slurm already forgot makes squeue -j fail
            out = scheduler_call(["squeue", *fmt])
        if out.returncode != 0:  # cannot ask: never take that for "the jobs are gone"
            raise LaunchError(f"squeue failed: {first_line(out.stderr)}")
        found: dict[str, JobStatus] = {}
        for line in out.stdout.splitlines():
            job_id, _, rest = line.strip().partition("|")
            state, _, reason = rest.partition("|")
            if job_id in job_ids:
                found[job_id] = _phase(state, reason)
        if any(s.blocked for s in found.values()):
            unavailable = _unavailable_nodes()
            found = {j: JobStatus(s.phase, s.state, f"{s.reason} ({unavailable})", True)
                     if s.blocked and unavailable else s for j, s in found.items()}
        missing = [j for j in job_ids if j not in found]
        if missing and shutil.which("sacct"):
            acct = scheduler_call(["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j",
                                   ",".join(missing)])
            for line in acct.stdout.splitlines() if acct.returncode == 0 else []:
                job_id, _, state = line.strip().partition("|")
                if job_id in missing:
                    found[job_id] = _phase(state)
        return {j: found.get(j, JobStatus("unknown", "")) for j in job_ids}

    def cancel(self, job_ids: Sequence[str]) -> None:
        """``scancel`` (silent for ended or unknown ids)."""
        if job_ids:
            scheduler_call(["scancel", *job_ids])

    def find(self, job: Job) -> str | None:
        """The id of a job named ``job.name`` in ``squeue -t all``."""
        out = scheduler_call(["squeue", "-h", "-t", "all", "--name", job.name, "-o", "%i"])
        ids = out.stdout.split() if out.returncode == 0 else []
        return ids[-1] if ids else None


def _unavailable_nodes() -> str:
    """The nodes Slurm holds out of service, with their state and reason (``sinfo -R``):
    ``node2: drained, x``; empty when it cannot say."""
    out = scheduler_call(["sinfo", "-h", "-R", "-o", "%N|%T|%E"])
    if out.returncode != 0:
        return ""
    items = []
    for line in out.stdout.splitlines():
        nodes, _, rest = line.strip().partition("|")
        state, _, why = rest.partition("|")
        if nodes:
            items.append(f"{nodes}: {state.lower()}" + (f", {why}" if why.strip() else ""))
    return "; ".join(items)
