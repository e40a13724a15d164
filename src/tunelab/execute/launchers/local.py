"""The local launcher: runs commands as child processes of this machine.

A run is an argv list (never a shell string) with an environment and a working directory;
stdout and stderr go to files, and the outcome comes back as an :class:`Outcome`. On timeout
or interrupt every process of the run is killed (its process group, its cgroup, the orphans
it left: see :mod:`tunelab.execute.hygiene`), so an ``mpirun`` and all its ranks go
together, and after every run whatever it left running is killed. Under the launcher
contract, :meth:`LocalLauncher.submit` runs a job's runs to their end, one after another (one
run at a time keeps measurements undisturbed), and :meth:`LocalLauncher.collect` hands their
outcomes back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tunelab.execute.launchers.base import Job, JobStatus, Launcher, Outcome, RunRequest
from tunelab.execute.launchers.config import LauncherConfig
from tunelab.execute.launchers.process import run_command

if TYPE_CHECKING:
    from tunelab.execute.launchers.watch import RunWatch

__all__ = ["LocalLauncher"]


class LocalLauncher(Launcher):
    """Runs commands on this machine, each in its own process group."""

    name = "local"
    batch = False

    def __init__(self, config: LauncherConfig | None = None, *,
                 watch: RunWatch | None = None) -> None:
        super().__init__(config or LauncherConfig())
        self._outcomes: dict[Path, Outcome] = {}
        self.watch = watch
        """Noise watch, ``--wait-quiet`` and pruning around each run (the runner sets it)."""

    def submit(self, job: Job) -> str:
        """Run every run of ``job`` to its end here; the token is the job id. The outcomes
        stay in memory until collected (no exit-status files: nothing else reads them)."""
        from tunelab.execute.launchers.step import execute_run

        for run in job.runs:
            self._outcomes[run.run_dir] = execute_run(run, status_file=False,
                                                       watch=self.watch)
        return job.token

    def collect(self, run: RunRequest) -> Outcome | None:
        """The outcome of a run this launcher ran (once)."""
        return self._outcomes.pop(run.run_dir, None)

    def poll(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """Local jobs have ended once submitted."""
        return {j: JobStatus("ended", "COMPLETED") for j in job_ids}

    def cancel(self, job_ids: Sequence[str]) -> None:
        """Nothing to cancel: a local job ends inside :meth:`submit`."""

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        timeout_s: float,
        stdout_path: Path,
        stderr_path: Path,
        should_stop: Callable[[], bool] | None = None,
        poll_s: float = 0.5,
    ) -> Outcome:
        """Run ``argv`` to completion or until ``timeout_s`` in the current run's process
        hygiene (see :func:`~tunelab.execute.launchers.process.run_command`)."""
        return run_command(argv, env=env, cwd=cwd, timeout_s=timeout_s,
                           stdout_path=stdout_path, stderr_path=stderr_path,
                           should_stop=should_stop, poll_s=poll_s)
