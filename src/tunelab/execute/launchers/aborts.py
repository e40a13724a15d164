"""A run that the scheduler or the MPI runtime ended, told from what they printed.

When a node fails, a job is preempted or cancelled, the scheduler kills the job's steps: the
program's launcher (``srun``, ``mpirun``) then exits with a code of its own (Slurm's ``srun``
gave 233 when a node's daemon died) before the job step is told the job is over. That exit
code is not the program's. :func:`scheduler_abort` finds the line that says so in the run's
standard error, so the job step records the run as lost (the infrastructure's doing) instead
of failed.

The same holds when ``srun`` could not reach the Slurm controller at all (``slurmctld`` or
``munged`` down: "Unable to contact slurm controller", "Unable to confirm allocation",
"Protocol authentication error", a munge failure): the program never ran, so the run is
lost, and :func:`scheduler_abort` says the controller could not be reached. And a run
whose ``srun`` was still waiting for its step to be created when the run's timeout came
("Cancelled pending job step": an earlier step the controller believes still runs holds
the job's resources) never started its program: lost too (:func:`step_never_started`),
never a program's timeout.

Only the launchers' and the runtime's own words match, never a program's exit message
(``srun: error: node1: task 0: Exited with exit code 1`` is the program's).

A launcher that was itself killed by a signal (``kill -9`` of the run's ``srun``, an
operator's or a cleanup's doing) is an abort too (:func:`launcher_killed`): ``srun`` and
Open MPI's ``mpirun`` report a task that died on signal N as their own exit status 128 + N
(``srun: error: node1: task 0: Killed``, status 137), and never die of their tasks'
signals, so a launcher that ended on a signal (a negative status, as :mod:`subprocess`
reports it) says nothing about the program — whose job step, orphaned, may still run. A
program run without a launcher that dies on a signal (a segfault, the OOM killer) failed.

Once a job's walltime has passed, Slurm refuses every new step ("Unable to create step for
job N: Job/step already completing or completed") while ``squeue`` still says RUNNING, for
up to 30 s, until its next time-limit check ends the job (:func:`job_ending`): the run's
program never started, and nothing more can run in that job.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from pathlib import PurePath

from tunelab.execute.launchers.process import STOPPED

__all__ = ["JOB_ENDING", "NEVER_STARTED", "allocation_ends", "job_ending", "launcher_killed",
           "launcher_stopped", "node_failure", "scheduler_abort",
           "step_never_started"]

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

JOB_ENDING = "srun's job step was refused because the job's time is up"
"""How :func:`job_ending`'s reasons begin."""

#: Aborts that say the allocation itself is broken or ending (a node failed, the job's
#: walltime, preemption, the whole job cancelled, a step refused because the job's time is
#: up): nothing more can run in it.
_ALLOCATION_ENDS = re.compile(
    r"Task launch for \S+ failed on node|Node failure on|DUE TO |\*\*\* JOB \S+ ON \S+ CANCELLED"
    r"|ORTE has lost|An ORTE daemon|PRTE has lost|PBS: job killed"
    rf"|^{re.escape(JOB_ENDING)}")

#: srun (or sbatch) could not reach slurmctld, or could not authenticate through munge.
_UNREACHABLE = re.compile(
    r"\b(?:srun|sbatch|salloc): error: .*(?:"
    r"Unable to contact slurm controller"
    r"|Protocol authentication error"
    r"|Munge (?:en|de)code failed"
    r")"
)

#: srun's words when its step was still pending (never created) as it was cancelled.
_PENDING_CANCELLED = re.compile(
    r"\bsrun: Cancelled pending (?:job step|step for job)")
_PENDING = re.compile(r"\bsrun: Job \S+ step creation (?:temporarily|still) disabled")
_CREATED = re.compile(r"\bsrun: (?:Step created for|Job step created)")


def _tail_lines(stderr: bytes | str) -> list[str]:
    text = stderr[-_TAIL_BYTES:]
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text.splitlines()


def scheduler_abort(stderr: bytes | str) -> str | None:
    """Why the infrastructure ended the run, from ``stderr``'s tail: "the scheduler ended
    the run: LINE" or "the Slurm controller could not be reached: LINE" (the first line
    that says so), or None."""
    for line in _tail_lines(stderr):
        if _UNREACHABLE.search(line):
            return f"the Slurm controller could not be reached: {line.strip()[:300]}"
        if _ABORTS.search(line):
            return f"the scheduler ended the run: {line.strip()[:300]}"
    return None


#: A node of the run's step failed: the words of Slurm that no program's own doing prints.
_NODE_FAILED = re.compile(r"srun: error: Node failure on|srun: error: Task launch for \S+ "
                          r"failed on node|DUE TO NODE FAILURE")


def node_failure(stderr: bytes | str) -> str | None:
    """For a launcher that exited 0: "the scheduler ended the run: LINE" when ``stderr``'s
    tail says a node of its step failed (``srun`` exited 0 after "srun: error: Node failure
    on node1" on the virtual cluster, its task cut off and its output lost), else None. Not
    every abort line: a program that ends a step of its own (the merge benchmark's Dask
    workers, cancelled when it is done) makes srun print "Job step aborted" and "STEP …
    CANCELLED" and succeeds."""
    for line in _tail_lines(stderr):
        if _NODE_FAILED.search(line):
            return f"the scheduler ended the run: {line.strip()[:300]}"
    return None


#: Launchers that report their tasks' signals as an exit status and never die of them.
_LAUNCHERS = frozenset({"srun", "mpirun", "mpiexec", "orterun", "prterun"})


def launcher_killed(argv: Sequence[str], rc: int | None) -> str | None:
    """When the run's command is a launcher (``srun``, ``mpirun``…) that was itself killed
    by a signal (``rc`` negative), the reason ("the run's launcher srun was killed by signal
    9 (Killed), not its program"); else None (a program's own death on a signal included)."""
    if rc is None or rc >= 0 or not argv:
        return None
    name = PurePath(argv[0]).name
    if name not in _LAUNCHERS:
        return None
    try:
        label = signal.strsignal(-rc)
    except ValueError:  # not a signal number of this system
        label = None
    what = f" ({label})" if label else ""
    return (f"the run's launcher {name} was killed by signal {-rc}{what}, not its program "
            f"(a task that dies on a signal makes {name} exit with 128 + the signal)")


def launcher_stopped(argv: Sequence[str], reason: str | None) -> str | None:
    """When the run's command is a launcher (``srun``, ``mpirun``…) that was still stopped by
    a signal at the run's timeout (``kill -STOP`` of it: :data:`~.process.STOPPED` begins
    the timeout's ``reason``), the reason the run is lost; else None. A stopped launcher
    cannot say that its tasks ended, so the timeout is not its program's."""
    if not reason or not reason.startswith(STOPPED) or not argv:
        return None
    name = PurePath(argv[0]).name
    if name not in _LAUNCHERS:
        return None
    return f"the run's launcher {name}: {reason}; not its program's timeout"


def allocation_ends(reason: str) -> bool:
    """True when the abort ``reason`` (:func:`scheduler_abort`'s) says the allocation is
    broken or ending — a node failed, the job hit its walltime, was preempted or cancelled —
    rather than that one step was cancelled or the controller was briefly out of reach."""
    return bool(_ALLOCATION_ENDS.search(reason))


#: srun's words when the job's end time has passed: Slurm refuses every new step at once,
#: but ends the job only at its next time-limit check (every 30 s), and until then
#: ``squeue`` still says RUNNING.
_REFUSED_ENDING = re.compile(
    r"\bsrun: error: Unable to create step for job \S+: Job/step already completing or "
    r"completed")


def job_ending(stderr: bytes | str) -> str | None:
    """When ``srun`` was refused its step because the job is ending (its walltime passed),
    the reason, with the line that says so; else None. The run's program never started."""
    for line in _tail_lines(stderr):
        if _REFUSED_ENDING.search(line):
            return f"{JOB_ENDING}; its program never started: {line.strip()[:300]}"
    return None


NEVER_STARTED = "srun's job step never started"
"""How :func:`step_never_started`'s reasons begin."""


def step_never_started(stderr: bytes | str) -> str | None:
    """When ``srun`` was still waiting for its job step to be created as the run ended
    (its program never started), the reason, with the line that says so; else None."""
    pending: str | None = None
    for line in _tail_lines(stderr):
        if _PENDING_CANCELLED.search(line):
            pending = line
            break
        if _PENDING.search(line):
            pending = line
        elif _CREATED.search(line):
            pending = None
    if pending is None:
        return None
    return (f"{NEVER_STARTED}: it waited for resources of the job that an earlier step "
            f"still held: {pending.strip()[:300]}")
