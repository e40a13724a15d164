"""What the job step asks Slurm about its own allocation between runs.

* :func:`cancel_leftover_steps`: a run's ``srun`` step that outlived it (its ``srun`` was
  killed, or the controller missed the step's end while it was down) holds the job's CPUs,
  and the next run's ``srun`` would wait for them until its timeout. The job step runs its
  runs one at a time, so between runs every numbered step of the job is such a leftover:
  it is cancelled, and the next run starts once Slurm no longer lists it (a step ends a
  second or so after ``scancel``; a run started before would count that wait in its time).
* :func:`allocation_usable`: after a run was lost, whether the job still runs on nodes that
  are up (a cancelled step on healthy nodes, a controller that was out of reach for a
  while), waiting while the controller does not answer.

Both are Slurm-only and never raise: a question Slurm cannot answer is answered "no".
:func:`ask_slurm` asks (the job step's other questions too: :mod:`.neighbours`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time

__all__ = ["allocation_usable", "ask_slurm", "cancel_leftover_steps", "steps_held"]

#: Node states (``sinfo %t``) in which a running job's next step can start.
USABLE_NODE_STATES = frozenset({"alloc", "mix", "idle", "comp", "drng", "resv", "plnd"})
_CALL_TIMEOUT_S = 30.0
_RETRY_S = 2.0
_GONE_WAIT_S = 60.0
"""How long the next run waits for cancelled steps to end (Slurm's own ``UnkillableStepTimeout``
default)."""
_GONE_POLL_S = 0.5


def ask_slurm(argv: list[str], timeout_s: float = _CALL_TIMEOUT_S) -> str | None:
    """A Slurm command's stdout, asked from a job's node; None when it failed, did not
    answer within ``timeout_s`` or Slurm is not here (the job step never raises over it)."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def cancel_leftover_steps(job_id: str, wait_s: float = _GONE_WAIT_S) -> list[str]:
    """``scancel`` every numbered step of Slurm job ``job_id`` still listed (none of this
    job step's runs is in flight when it is called) and wait, up to ``wait_s``, until Slurm
    lists none of them; the ids cancelled. A controller that does not answer is asked again
    for up to ``wait_s`` first: a step that ended while it was down (``slurmctld``
    restarted) is still listed once it is back."""
    if not job_id.isdigit():
        return []
    deadline = time.monotonic() + wait_s
    listed = _numbered_steps(job_id)
    while listed is None and time.monotonic() < deadline:  # the controller is away: a step
        time.sleep(_RETRY_S)  # that ended meanwhile is still listed once it is back, and
        listed = _numbered_steps(job_id)  # would hold the next run's srun to its timeout
    stale = listed or []
    if not stale:
        return []
    ask_slurm(["scancel", *stale])
    print(f"tunelab step: cancelled step(s) {', '.join(stale)} left by an earlier run "
          f"of job {job_id}", file=sys.stderr)
    deadline = time.monotonic() + wait_s
    while True:
        listed = _numbered_steps(job_id)
        if listed is None or not set(stale) & set(listed):
            return stale
        if time.monotonic() >= deadline:
            print(f"tunelab step: step(s) {', '.join(sorted(set(stale) & set(listed)))} still "
                  f"listed {wait_s:.0f} s after they were cancelled", file=sys.stderr)
            return stale
        time.sleep(_GONE_POLL_S)


def steps_held(job_id: str, wait_s: float | None = None) -> list[str]:
    """Cancel the leftover steps of job ``job_id`` (:func:`cancel_leftover_steps`); the ones
    Slurm still lists after that. Such a step holds the job's CPUs for good (the controller
    lost its end while it was down, and a cancel cannot end a step whose processes are
    gone): a next run's srun would wait for them until its timeout."""
    stale = cancel_leftover_steps(job_id, _GONE_WAIT_S if wait_s is None else wait_s)
    if not stale:
        return []
    return sorted(set(stale) & set(_numbered_steps(job_id) or []))


def _numbered_steps(job_id: str) -> list[str] | None:
    """The numbered steps (``JOB.N``) Slurm lists for job ``job_id``; None when it does not
    answer."""
    listed = ask_slurm(["squeue", "-h", "-s", "-j", job_id, "-o", "%i"])
    if listed is None:
        return None
    return [s for s in listed.split() if re.fullmatch(rf"{job_id}\.\d+", s)]


def _nodes_usable(job_id: str) -> bool | None:
    """True when job ``job_id`` runs and every node of it is in a usable state; False when
    not; None when the controller does not answer."""
    state = ask_slurm(["squeue", "-h", "-j", job_id, "-o", "%T|%N"])
    if state is None:
        return None
    word, _, nodelist = state.strip().partition("|")
    if word != "RUNNING" or not nodelist:
        return False
    nodes = ask_slurm(["sinfo", "-h", "-N", "-n", nodelist, "-o", "%t"])
    if nodes is None:
        return None
    states = nodes.split()
    return bool(states) and all(s in USABLE_NODE_STATES for s in states)


def allocation_usable(job_id: str, wait_s: float) -> bool:
    """Whether Slurm job ``job_id`` still runs with every node up, asking again every few
    seconds for up to ``wait_s`` while the controller does not answer."""
    if not job_id.isdigit() or shutil.which("squeue") is None:
        return False
    deadline = time.monotonic() + wait_s
    while True:
        usable = _nodes_usable(job_id)
        if usable is not None:
            return usable
        if time.monotonic() >= deadline:
            return False
        time.sleep(_RETRY_S)
