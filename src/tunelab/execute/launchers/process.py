"""One command run on this machine to its end: its own process group (and cgroup, see
:mod:`tunelab.execute.hygiene`), output to files, a timeout that kills every process of it, an
optional stop check (pruning). The local launcher and the job step both run commands here.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tunelab.errors import LaunchError
from tunelab.execute import hygiene
from tunelab.execute.launchers.base import Outcome

__all__ = ["STOPPED", "run_command", "stopped"]

_KILL_GRACE_S = 3.0

STOPPED = "its process was stopped by a signal (SIGSTOP or SIGTSTP) and never continued"
"""How the reason of a timeout begins when the command's own process was stopped then."""


def stopped(pid: int) -> bool:
    """True when process ``pid`` is stopped by a signal (state T in ``/proc/PID/stat``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(") ")[2][:1] == "T"


def run_command(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    timeout_s: float,
    stdout_path: Path,
    stderr_path: Path,
    should_stop: Callable[[], bool] | None = None,
    poll_s: float = 0.5,
    shared_memory: bool = True,
) -> Outcome:
    """Run ``argv`` to completion or until ``timeout_s``; raise LaunchError if it
    cannot start at all (for example, the executable does not exist). ``should_stop``
    is asked every ``poll_s`` while the command runs; when it says True the command's
    process group is killed and the outcome is ``stopped`` (a pruned run). With
    ``shared_memory`` (a run on this node only) its MPI and UCX shared-memory files go to
    a directory of its own, removed after it (see
    :meth:`tunelab.execute.hygiene.RunProcesses.environment`)."""
    processes = hygiene.current(stdout_path.parent)
    try:
        out_file = open(stdout_path, "wb")  # noqa: SIM115
        try:
            err_file = open(stderr_path, "wb")  # noqa: SIM115
        except OSError:
            out_file.close()
            raise
    except OSError as exc:  # the study directory became unwritable since it was prepared
        from tunelab.execute.guards import write_fault

        processes.cleanup()
        raise write_fault(exc, stdout_path.parent) from None
    with out_file as out, err_file as err, processes.in_flight():
        start = time.perf_counter()
        try:
            proc = subprocess.Popen(
                list(argv), env=processes.environment(env, shared_memory=shared_memory),
                cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                **processes.popen_options(),
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
            rc = _wait(proc, start + timeout_s, should_stop, poll_s)
            wall = time.perf_counter() - start
        except subprocess.TimeoutExpired:
            wall = time.perf_counter() - start  # the time at the timeout, not after the kill
            held = stopped(proc.pid)
            processes.end(proc, _KILL_GRACE_S)
            return Outcome("timeout", None, wall, reason=(
                f"{STOPPED}: killed at the {timeout_s:g} s timeout") if held else None)
        except BaseException:  # Ctrl-C: every process of the run goes down with us
            processes.end(proc, _KILL_GRACE_S)
            raise
        if rc is None:  # should_stop said so: the run goes down like on a timeout
            processes.end(proc, _KILL_GRACE_S)
            return Outcome("stopped", None, wall)
        processes.cleanup()  # what the run left behind (background processes, daemons)
    if processes.ended_while_stopped:  # its end was seen late: the wall time is not the run's
        return Outcome("lost", rc, wall, reason=(
            f"tunelab was stopped (SIGSTOP or Ctrl-Z) when the run ended, so its {wall:.3g} s "
            "count the stop, not the run"))
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
