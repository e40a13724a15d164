"""Launchers: run one command and report how it ended.

A launcher runs an argv list (never a shell string) with an environment and a working
directory, writes stdout and stderr to files, and returns an :class:`Outcome`. On timeout or
interrupt it kills every process of the run (its process group, its cgroup, its adopted
orphans: see :mod:`tunelab.execute.hygiene`), so an ``mpirun`` and all its ranks go together,
and after every run it kills what the run left behind.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tunelab.errors import LaunchError
from tunelab.execute import hygiene

__all__ = ["LocalLauncher", "Outcome"]

Status = Literal["ok", "failed", "timeout"]
_KILL_GRACE_S = 3.0


@dataclass(frozen=True)
class Outcome:
    """How a command ended: status, exit code (None after a timeout) and wall time."""

    status: Status
    rc: int | None
    wall_s: float


class LocalLauncher:
    """Runs commands as child processes of this machine, each in its own process group."""

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
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
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
