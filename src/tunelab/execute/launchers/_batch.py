"""What the Slurm and PBS launchers share: the job script, the submit command, preflight.

A scheduler backend is three narrow hooks — the script's scheduler (``slurm``/``pbs``), the
submit command, the job id parsed from its output — plus poll, cancel and find.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tunelab.errors import LaunchError
from tunelab.execute.launchers.base import Job, Launcher
from tunelab.execute.launchers.script import JobScript, render

__all__ = ["BatchLauncher", "scheduler_call"]

_WALLTIME_MARGIN_S = 120.0
_CALL_TIMEOUT_S = 120.0


def scheduler_call(argv: Sequence[str], *, timeout_s: float = _CALL_TIMEOUT_S
                   ) -> subprocess.CompletedProcess[str]:
    """Run a scheduler command (argv, no shell); a missing or hanging command is a
    :class:`LaunchError`."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise LaunchError(f"{argv[0]!r} is not on PATH: this machine cannot reach the "
                          "scheduler") from None
    except subprocess.TimeoutExpired:
        raise LaunchError(f"{' '.join(argv[:2])} did not answer within {timeout_s:g} s") \
            from None
    except OSError as exc:  # not executable, too many processes, …
        raise LaunchError(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from None


def first_line(text: str, limit: int = 400) -> str:
    """A scheduler's message on one line: its lines that say something (not a lone quote or
    a banner of dashes), joined, at most ``limit`` characters."""
    lines = [ln.strip() for ln in text.strip().splitlines()]
    words = [ln for ln in lines if any(c.isalnum() for c in ln)]
    joined = " ".join(" ".join(words).split())
    if not joined:
        return "no message"
    return joined if len(joined) <= limit else joined[: limit - 1] + "…"


class BatchLauncher(Launcher):
    """A launcher that writes a job script and submits it."""

    scheduler: str

    def walltime_s(self, job: Job) -> float:
        """The job's walltime: the configured one, else the runs' timeouts plus a margin."""
        configured = self.config.walltime_s
        if configured is not None:
            return configured
        return sum(r.timeout_s for r in job.runs) + _WALLTIME_MARGIN_S

    def job_script(self, job: Job) -> JobScript:
        """What ``job`` asks the scheduler for, and the job step it runs."""
        cfg = self.config
        needs = job.needs()
        site = cfg.site_profile(self.scheduler)
        python = cfg.python or sys.executable
        step = f"exec {python} -m tunelab.execute.launchers.step {job.spec_path}"
        return JobScript(
            scheduler=self.scheduler, name=job.name, walltime_s=self.walltime_s(job),
            body=(step,), nodes=cfg.nodes or needs.nodes,
            tasks_per_node=cfg.tasks_per_node or needs.ranks_per_node,
            cpus_per_task=cfg.cpus_per_task or needs.threads, memory=cfg.memory or needs.memory,
            account=cfg.account, partition=cfg.partition, modules=tuple(cfg.modules),
            directives=tuple(cfg.directives), env=cfg.job_env(self.scheduler),
            workdir=str(job.jobs_dir), output=str(job.output_path), no_requeue=True,
            pbs_resources=cfg.resources_for(self.scheduler), workdir_mode=site.workdir,
            account_flag=site.account_flag,
            exclusive=cfg.isolation == "exclusive", cores_per_node=cfg.cores_per_node)

    def write(self, job: Job) -> Path:
        """Write the job's description and script; return the script's path."""
        job.write_spec(self.config.python or sys.executable)
        job.script_path.write_text(render(self.job_script(job)))
        return job.script_path

    def check_with(self, jobs: Sequence[Job], test_argv: Sequence[str]) -> None:
        """Submit-test each distinct job shape with ``test_argv + [script]``; a refusal is a
        :class:`LaunchError` naming the job's resources and the scheduler's message."""
        seen = set()
        with tempfile.TemporaryDirectory(prefix="tunelab-check-") as tmp:
            for job in jobs:
                script = self.job_script(job)
                shape = (script.nodes, script.tasks_per_node, script.cpus_per_task,
                         script.walltime_s)
                if shape in seen:
                    continue
                seen.add(shape)
                path = Path(tmp) / "check.sh"
                path.write_text(render(script))
                out = scheduler_call([*test_argv, str(path)])
                if out.returncode != 0:
                    raise LaunchError(
                        f"{test_argv[0]} refused a job of {script.nodes} node(s) x "
                        f"{script.tasks_per_node} task(s) x {script.cpus_per_task} cpu(s), "
                        f"walltime {script.walltime_s:g} s"
                        f"{', account ' + script.account if script.account else ''}"
                        f"{', partition ' + script.partition if script.partition else ''}: "
                        f"{first_line(out.stderr or out.stdout)}")
