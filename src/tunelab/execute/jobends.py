"""How the end of a batch job is judged, run by run.

A job that ended leaves each of its runs in one of three states: finished (an exit-status
file: the controller records it), cut off (``started.json`` but no exit status) or never
started. For the last two the scheduler's word for the job's end decides who is to blame:

* **the infrastructure** — a node failure, a failed boot, preemption, a cancellation from
  outside tunelab, an allocation's walltime, a job the scheduler no longer knows (or
  anything else that ended a job before its run could finish): the run is **lost**. It is
  submitted again (``launcher.retries`` times), then stored as ``lost``; a resume runs it
  again. A lost run never reads as a program's exit code.
* **the program** — a job killed for using more memory than it asked for
  (``OUT_OF_MEMORY``): the run that was in flight **failed**.
* runs a pack never started while it made progress on others are simply **packed again**:
  nothing went wrong with them. A job that started none of its runs lost them all.

:func:`scheduler_reason` finds the scheduler's word (its state, else its message in the
job's output: PBS's ``qstat`` gives none); :func:`judge_run_end` is the pure decision.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tunelab.execute.launchers.base import ENDED_STATES, JobStatus

__all__ = ["PROGRAM_STATES", "RunEnd", "judge_run_end", "scheduler_reason"]

PROGRAM_STATES = frozenset({"OUT_OF_MEMORY"})
"""Job states that blame the run that was in flight (every other end blames the
infrastructure)."""

#: The scheduler's own words in a job's output, for jobs it no longer lists.
_OUTPUT_REASONS = (
    (re.compile(r"DUE TO TIME LIMIT|walltime \S+ exceeded limit", re.I), "TIMEOUT"),
    (re.compile(r"DUE TO NODE FAILURE|node fail", re.I), "NODE_FAIL"),
    (re.compile(r"DUE TO PREEMPTION|preempted", re.I), "PREEMPTED"),
    (re.compile(r"CANCELLED AT|job killed|qdel", re.I), "CANCELLED"),
)
_OUTPUT_TAIL = 20_000


def scheduler_reason(status: JobStatus, output: Path | None) -> str:
    """Why a job ended, in the scheduler's words (``TIMEOUT``, ``NODE_FAIL``,
    ``CANCELLED``…): its state, else the scheduler's message in the job's output."""
    if status.state in ENDED_STATES and status.state != "COMPLETED":
        return status.state
    text = ""
    if output is not None:
        try:
            text = output.read_text(errors="replace")[-_OUTPUT_TAIL:]
        except OSError:
            text = ""
    for pattern, word in _OUTPUT_REASONS:
        if pattern.search(text):
            return word
    return status.state or "UNKNOWN"


@dataclass(frozen=True)
class RunEnd:
    """What becomes of one run of an ended job that left no exit status: ``lost`` (an
    attempt the infrastructure lost), ``failed`` (the program's doing) or ``repack`` (never
    started; it goes into the next pack as it is), with the sentence that says why."""

    kind: Literal["lost", "failed", "repack"]
    reason: str


def judge_run_end(word: str, *, started: bool, pack_progressed: bool, job_name: str,
                  output_tail: str = "") -> RunEnd:
    """The fate of a run of the ended job ``job_name`` whose end the scheduler calls
    ``word``: ``started`` (it has ``started.json``), ``pack_progressed`` (the job began at
    least one of its runs), ``output_tail`` (the job's last output line, for a job that
    ended before starting anything)."""
    if started:
        what = "was put back in the queue" if word == "REQUEUED" else "ended"
        reason = f"scheduler: {word} (job {job_name} {what} during this run)"
        return RunEnd("failed" if word in PROGRAM_STATES else "lost", reason)
    if pack_progressed:
        return RunEnd("repack", f"scheduler: {word} (job {job_name} ended before this run "
                                "started; packed again)")
    tail = f": {output_tail}" if output_tail else ""
    return RunEnd("lost", f"scheduler: {word} (job {job_name} ended before this run "
                          f"started){tail}")
