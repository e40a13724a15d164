"""The PBS launcher: ``qsub`` to submit, ``qstat`` to poll, ``qdel`` to cancel.

Output options go on the ``qsub`` command line (``-o FILE -j oe -N NAME``): Slurm's
PBS-compatible wrappers ignore them inside the script. ``qstat`` gives no reason for a
job's end; a job that ended without exit-status files is judged by the scheduler's own
message in the job's output (walltime exceeded, cancelled, node failure).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tunelab.errors import LaunchError
from tunelab.execute.launchers._batch import BatchLauncher, first_line, scheduler_call
from tunelab.execute.launchers.base import Job, JobStatus, require

__all__ = ["PbsLauncher"]

_ENDED = {"C", "F", "X"}
_QSTAT_UNKNOWN_RC = 153  # "Unknown Job Id": PBS and Slurm's wrapper alike
_UNKNOWN = re.compile(r"Unknown Job|Job has finished", re.I)
_RUNNING = {"R", "E"}


class PbsLauncher(BatchLauncher):
    """Submits jobs with ``qsub``."""

    name = "pbs"
    scheduler = "pbs"

    def check(self, shapes: Sequence[Job]) -> None:
        """PBS's commands exist (PBS has no submit test: a refusal shows at submission)."""
        for cmd in ("qsub", "qstat", "qdel"):
            require(cmd, "the PBS client commands")

    def submit(self, job: Job) -> str:
        """``qsub -N NAME -o OUT -j oe SCRIPT``; the job id (``123`` or ``123.server``)."""
        script = self.write(job)
        out = scheduler_call(["qsub", "-N", job.name, "-o", str(job.output_path), "-j", "oe",
                              str(script)])
        job_id = out.stdout.strip().split()[0] if out.stdout.strip() else ""
        if out.returncode != 0 or not job_id[:1].isdigit():
            raise LaunchError(f"qsub refused job {job.name}: "
                              f"{first_line(out.stderr or out.stdout)}")
        return job_id

    def poll(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """States from ``qstat``; a job qstat no longer lists is ``unknown``;
        :class:`LaunchError` when ``qstat`` cannot answer at all."""
        if not job_ids:
            return {}
        out = scheduler_call(["qstat", *job_ids])
        if out.returncode != 0 and not out.stdout.strip() and \
                not _UNKNOWN.search(out.stderr) and out.returncode != _QSTAT_UNKNOWN_RC:
            raise LaunchError(f"qstat failed: {first_line(out.stderr)}")
        found: dict[str, JobStatus] = {}
        for line in out.stdout.splitlines():
            fields = line.split()
            if len(fields) < 6 or fields[0] not in job_ids:
                continue
            state = fields[4]
            if state in _ENDED:
                found[fields[0]] = JobStatus("ended", state)
            else:
                found[fields[0]] = JobStatus("running" if state in _RUNNING else "queued", state)
        return {j: found.get(j, JobStatus("unknown", "")) for j in job_ids}

    def cancel(self, job_ids: Sequence[str]) -> None:
        """``qdel`` each job (ended ones are ignored)."""
        for job_id in job_ids:
            scheduler_call(["qdel", job_id])

    def find(self, job: Job) -> str | None:
        """The id of a job named ``job.name`` in ``qstat -f`` (full names: the short
        listing cuts them at 16 characters)."""
        out = scheduler_call(["qstat", "-f"])
        job_id = None
        for line in out.stdout.splitlines():
            key, _, value = line.strip().partition(":" if line.startswith("Job Id") else "=")
            if key.strip() == "Job Id":
                job_id = value.strip()
            elif key.strip() == "Job_Name" and value.strip() == job.name:
                return job_id
        return None
