"""A run that the scheduler or the MPI runtime ended, told from what they printed.

When a node fails, a job is preempted or cancelled, the scheduler kills the job's steps: the
program's launcher (``srun``, ``mpirun``) then exits with a code of its own (Slurm's ``srun``
gave 233 when a node's daemon died) before the job step is told the job is over. That exit
code is not the program's. :func:`scheduler_abort` finds the line that says so in the run's
standard error, so the job step records the run as lost (the infrastructure's doing) instead
of failed.
"""

from __future__ import annotations

import re

__all__ = ["scheduler_abort"]

_TAIL_BYTES = 16_384

_ABORTS = re.compile(
    r"srun: error: Task launch for \S+ failed on node"
    r"|srun: error: Node failure on"
    r"|srun: Job step aborted"
    r"|srun: error: Unable to create step for job"
    r"|\*\*\* (?:STEP|JOB) \S+ ON \S+ CANCELLED AT"
    r"|DUE TO (?:NODE FAILURE|TIME LIMIT|PREEMPTION)"
    r"|ORTE has lost communication with a remote daemon"
    r"|An ORTE daemon has unexpectedly failed"
    r"|PRTE has lost communication with a remote daemon"
    r"|=>> PBS: job killed"
)


def scheduler_abort(stderr: bytes | str) -> str | None:
    """The first line of ``stderr``'s tail in which the scheduler or the MPI runtime says
    it ended the run, or None."""
    text = stderr[-_TAIL_BYTES:]
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    for line in text.splitlines():
        if _ABORTS.search(line):
            return line.strip()[:300]
    return None
