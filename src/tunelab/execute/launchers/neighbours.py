"""Who else ran on a run's nodes: the scheduler's side of the evidence the job step stores
beside each run (``noise`` columns ``shared_with``, ``evidence``, ``disturbed``, beside the
noise watch's sample of the run's cores: ``cpus``, ``cpu_list``, ``others_share``…).

A timed run should have its cores to itself: per-run and pack jobs ask for whole nodes unless
the study says ``isolation: shared``. Whatever was asked, the step records the cores the run
could use (its affinity) and the other jobs the scheduler placed on the run's nodes while it
ran (Slurm: ``squeue -w``); a run that shared its nodes with another job is flagged
``disturbed``. Other schedulers are not asked (PBS's ``qstat`` lists no node's jobs cheaply):
their runs carry the cores only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from tunelab.cpustat import cpu_list_text
from tunelab.execute.launchers.stepcheck import ask_slurm

__all__ = ["other_jobs", "with_neighbours"]

_SQUEUE_TIMEOUT_S = 20.0


def other_jobs(hosts: Sequence[str], job_id: str) -> set[str]:
    """Ids of the running jobs other than ``job_id`` that the scheduler has on ``hosts``
    (Slurm only; empty elsewhere, or when the scheduler cannot be asked)."""
    if not hosts or not job_id or "SLURM_JOB_ID" not in os.environ:
        return set()
    listed = ask_slurm(["squeue", "-h", "-t", "RUNNING", "-w", ",".join(hosts), "-o", "%i"],
                       _SQUEUE_TIMEOUT_S)
    return {j for j in (listed or "").split() if j.split("_")[0] != job_id}


def with_neighbours(noise: Mapping[str, float | str | None] | None, hosts: Sequence[str],
                    job_id: str, before: set[str]) -> dict[str, float | str | None]:
    """The run's ``noise`` columns (the noise watch's sample of its cores, when it has one)
    with the other jobs found on ``hosts`` before it (``before``, from :func:`other_jobs`)
    or now: a run that shared its nodes is ``disturbed``, and the evidence says with whom."""
    out: dict[str, float | str | None] = dict(noise or {})
    if not out.get("cpu_list"):
        try:
            cpus = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = list(range(os.cpu_count() or 1))
        out.update(cpus=float(len(cpus)), cpu_list=cpu_list_text(cpus))
    shared = sorted(before | other_jobs(hosts, job_id))
    out["shared_with"] = ",".join(shared)
    if shared:
        said = f"other jobs ran on node(s) {','.join(hosts)}: {', '.join(shared)}"
        out["evidence"] = "; ".join(str(e) for e in (out.get("evidence"), said) if e)
        out["disturbed"] = 1.0
    out.setdefault("disturbed", 0.0)
    return out
