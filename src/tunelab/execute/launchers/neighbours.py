"""Where a run ran inside its job, and who else ran there: the evidence the job step stores
beside each run (``noise`` columns ``cpus``, ``cpu_list``, ``shared_with``, ``evidence``,
``disturbed``).

A timed run should have its cores to itself: per-run and pack jobs ask for whole nodes unless
the study says ``isolation: shared``. Whatever was asked, the step records the cores the run
could use (its affinity) and the other jobs the scheduler placed on the run's nodes while it
ran (Slurm: ``squeue -w``); a run that shared its nodes with another job is flagged
``disturbed``. Other schedulers are not asked (PBS's ``qstat`` lists no node's jobs cheaply):
their runs carry the cores only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

__all__ = ["cpu_list", "other_jobs", "placement_evidence"]

_SQUEUE_TIMEOUT_S = 20.0


def cpu_list(cpus: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5`` (the kernel's cpuset notation)."""
    parts: list[str] = []
    ordered = sorted(set(cpus))
    start = prev = None
    for cpu in [*ordered, None]:
        if cpu is not None and prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(parts)


def other_jobs(hosts: Sequence[str], job_id: str) -> set[str]:
    """Ids of the running jobs other than ``job_id`` that the scheduler has on ``hosts``
    (Slurm only; empty elsewhere, or when the scheduler cannot be asked)."""
    if not hosts or not job_id or "SLURM_JOB_ID" not in os.environ or not shutil.which("squeue"):
        return set()
    try:
        out = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-w", ",".join(hosts), "-o",
                              "%i"], capture_output=True, text=True, timeout=_SQUEUE_TIMEOUT_S,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return set()
    if out.returncode != 0:
        return set()
    return {j for j in out.stdout.split() if j.split("_")[0] != job_id}


def placement_evidence(hosts: Sequence[str], job_id: str, before: set[str],
                       ) -> dict[str, float | str | None]:
    """The ``noise`` columns of a run that ran on ``hosts`` in job ``job_id``: its cores, and
    the other jobs found there before it (``before``, from :func:`other_jobs`) or now."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = list(range(os.cpu_count() or 1))
    shared = sorted(before | other_jobs(hosts, job_id))
    evidence = (f"other jobs ran on node(s) {','.join(hosts)}: {', '.join(shared)}"
                if shared else "")
    return {"cpus": float(len(cpus)), "cpu_list": cpu_list(cpus),
            "shared_with": ",".join(shared), "evidence": evidence,
            "disturbed": 1.0 if shared else 0.0}
