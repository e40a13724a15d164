"""User-facing errors of tunelab.

Every error a user can cause (a bad study file, a missing program, a busy study directory)
is a :class:`TunelabError` carrying one sentence that names the file, field or value at
fault. The CLI prints it on one line and exits with status 2. Errors raised by foreign code
(``yaml``, ``sqlite3``, ``subprocess``) are translated where they enter, ``raise … from exc``.

Hierarchy::

    TunelabError
    ├── StudyError          a study file that cannot be read or is invalid
    ├── SpaceError          a parameter space with no valid point, or a point outside it
    ├── WorkloadError       unknown workload, bad workload option, missing executable
    │   └── ParseError      a run's output that holds no figure of merit (the run is failed)
    │       └── RunReportedError  the output itself says the run failed (pw.x's "Error in …")
    ├── StoreError          a study directory that is busy, foreign or unreadable
    └── LaunchError         a command that cannot be started at all
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType

__all__ = [
    "STOP_SIGNALS",
    "LaunchError",
    "ParseError",
    "RunReportedError",
    "SpaceError",
    "StoreError",
    "StudyError",
    "TunelabError",
    "WorkloadError",
    "handle_stop_signals",
    "interrupted",
]


class TunelabError(Exception):
    """Root of every error tunelab reports to a user as one line."""


class StudyError(TunelabError):
    """A study file that cannot be read or does not validate."""


class SpaceError(TunelabError):
    """A parameter space that has no valid point, or a point that is not in it.

    ``subject`` names the part of the study at fault, when one is: ``("derived", name)`` or
    ``("constraint", label)``, so that the error can be located in the study file."""

    def __init__(self, message: str, subject: tuple[str, str] | None = None) -> None:
        super().__init__(message)
        self.subject = subject


class WorkloadError(TunelabError):
    """An unknown workload, an invalid workload option or a missing executable.

    ``option`` is the path of the workload option at fault in ``workload.options``, when
    one is (``("argv", 1)``), so that the error can be located in the study file."""

    def __init__(self, message: str, option: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.option = option


class ParseError(WorkloadError):
    """A run's output from which the workload's figures of merit cannot be read.

    Raised by ``Workload.parse``; the runner records the run as ``failed`` with this
    message as its reason, and the study goes on.
    """


class RunReportedError(ParseError):
    """The program's own output says it failed (e.g. pw.x's ``Error in routine … (N): …``).

    Its message becomes the run's failure reason, ahead of the last line of stderr.
    """


class StoreError(TunelabError):
    """A study directory that is locked by another run, or holds a different study."""


class LaunchError(TunelabError):
    """A command that cannot be started (for example, its executable is not installed)."""


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was caused by, an interrupt (Python 3.11 wraps one raised
    while a class is being created in a RuntimeError)."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""The signals that stop tunelab as Ctrl-C does: SIGTERM (``kill``, a batch system) and
SIGHUP (the terminal closed, an ssh session dropped). A run in flight goes down with it
(its processes run in their own session, so the hang-up never reaches them)."""


def handle_stop_signals(handler: Callable[[int, FrameType | None], object], *,
                        hangup: bool = True) -> None:
    """Install ``handler`` for :data:`STOP_SIGNALS`; a SIGHUP ignored when tunelab started
    (``nohup``) stays ignored, and without ``hangup`` SIGHUP gets its default action (a
    batch study's controller dies on it as on ``kill -9``: its jobs run on, and the same
    command re-attaches to them)."""
    for sig in STOP_SIGNALS:
        if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
            continue
        signal.signal(sig, handler if sig != signal.SIGHUP or hangup else signal.SIG_DFL)
