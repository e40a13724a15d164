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

import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tunelab.errors import LaunchError
from tunelab.execute import hygiene
from tunelab.execute.launchers.base import Job, JobStatus, Launcher, Outcome, RunRequest
from tunelab.execute.launchers.config import LauncherConfig

__all__ = ["LocalLauncher"]

_KILL_GRACE_S = 3.0


class LocalLauncher(Launcher):
    """Runs commands on this machine, each in its own process group."""

    name = "local"
    batch = False

    def __init__(self, config: LauncherConfig | None = None) -> None:
        super().__init__(config or LauncherConfig())
        self._outcomes: dict[Path, Outcome] = {}

    def submit(self, job: Job) -> str:
        """Run every run of ``job`` to its end here; the token is the job id. The outcomes
        stay in memory until collected (no exit-status files: nothing else reads them)."""
        from tunelab.execute.launchers.step import execute_run

        for run in job.runs:
            self._outcomes[run.run_dir] = execute_run(run, status_file=False)
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
    ) -> Outcome:
        """Run ``argv`` to completion or until ``timeout_s``; raise LaunchError if it
        cannot start at all (for example, the executable does not exist)."""
        processes = hygiene.current(stdout_path.parent)
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err, \
                processes.in_flight():
            start = time.perf_counter()
            try:
                proc = subprocess.Popen(
                    list(argv), env={**env, **processes.env}, cwd=cwd, stdout=out,
                    stderr=err, stdin=subprocess.DEVNULL, **processes.popen_options(),
                )
            except FileNotFoundError:
                processes.cleanup()
                raise LaunchError(f"command not found: {argv[0]!r}") from None
            except PermissionError:
                processes.cleanup()
                raise LaunchError(f"command is not executable: {argv[0]!r}") from None
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                processes.cleanup()
                raise LaunchError(f"cannot start {argv[0]!r}: {exc}") from None
            except BaseException:  # interrupted while starting: what did start goes down
                processes.cleanup()
                raise
            try:
                processes.started(proc)
                rc = proc.wait(timeout=timeout_s)
                wall = time.perf_counter() - start
            except subprocess.TimeoutExpired:
                wall = time.perf_counter() - start  # the time at the timeout, not after the kill
                processes.end(proc, _KILL_GRACE_S)
                return Outcome("timeout", None, wall)
            except BaseException:  # Ctrl-C: every process of the run goes down with us
                processes.end(proc, _KILL_GRACE_S)
                raise
            processes.cleanup()  # what the run left behind (background processes, daemons)
        return Outcome("ok" if rc == 0 else "failed", rc, wall)
