"""The local launcher: runs commands as child processes of this machine.

A run is an argv list (never a shell string) with an environment and a working directory;
stdout and stderr go to files, and the outcome comes back as an :class:`Outcome`. On timeout
or interrupt the command's whole process group is killed, so an ``mpirun`` and all its ranks
go together. Under the launcher contract, :meth:`LocalLauncher.submit` runs a job's runs to
their end, one after another (one run at a time keeps measurements undisturbed), and
:meth:`LocalLauncher.collect` hands their outcomes back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tunelab.errors import LaunchError
from tunelab.execute.launchers.base import Job, JobStatus, Launcher, Outcome, RunRequest
from tunelab.execute.launchers.config import LauncherConfig

if TYPE_CHECKING:
    from tunelab.execute.watch import RunWatch

__all__ = ["LocalLauncher"]

_KILL_GRACE_S = 3.0


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
        """Run ``argv`` to completion or until ``timeout_s``; raise LaunchError if it
        cannot start at all (for example, the executable does not exist). ``should_stop``
        is asked every ``poll_s`` while the command runs; when it says True the command's
        process group is killed and the outcome is ``stopped`` (a pruned run)."""
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            start = time.perf_counter()
            try:
                proc = subprocess.Popen(
                    list(argv), env=dict(env), cwd=cwd, stdout=out, stderr=err,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                )
            except FileNotFoundError:
                raise LaunchError(f"command not found: {argv[0]!r}") from None
            except PermissionError:
                raise LaunchError(f"command is not executable: {argv[0]!r}") from None
            except OSError as exc:
                raise LaunchError(f"cannot start {argv[0]!r}: {exc}") from exc
            try:
                rc = _wait(proc, start + timeout_s, should_stop, poll_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                return Outcome("timeout", None, time.perf_counter() - start)
            except BaseException:  # Ctrl-C: take the whole process group down with us
                _kill_group(proc)
                raise
            wall = time.perf_counter() - start
            if rc is None:  # should_stop said so
                _kill_group(proc)
                return Outcome("stopped", None, wall)
        return Outcome("ok" if rc == 0 else "failed", rc, wall)


def _wait(proc: subprocess.Popen[bytes], deadline: float,
          should_stop: Callable[[], bool] | None, poll_s: float) -> int | None:
    """The exit code; None when ``should_stop`` asked to stop; TimeoutExpired at the
    deadline."""
    if should_stop is None:
        return proc.wait(timeout=max(deadline - time.perf_counter(), 0.0))
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, 0)
        try:
            return proc.wait(timeout=min(poll_s, left))
        except subprocess.TimeoutExpired:
            if should_stop():
                return None


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after a grace period."""
    for sig, wait in ((signal.SIGTERM, _KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            # the leader is gone; make sure no stragglers of the group survive
            os.killpg(proc.pid, signal.SIGKILL)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue
