"""The console script's first code: signals are handled before anything slow is imported.

Importing the command line (typer, rich, pydantic) takes a few tenths of a second; a SIGTERM,
SIGHUP or Ctrl-C in that time would otherwise kill tunelab without a word (exit 143) or print a
``KeyboardInterrupt`` traceback. Here both become one line and exit status 130, like an
interrupt at any later point.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

from tunelab.errors import STOP_SIGNALS, handle_stop_signals, interrupted

__all__ = ["main"]


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _quiet_ignored_interrupts(unraisable: sys.UnraisableHookArgs) -> None:
    """No traceback for a Ctrl-C that landed where Python ignores exceptions (an at-fork
    hook, a ``__del__``): the runner delivers it again (see ``hygiene``)."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        return
    sys.__unraisablehook__(unraisable)


def main() -> None:
    """Install the SIGTERM and SIGHUP handler, then import and run :func:`tunelab.cli.main`."""
    handle_stop_signals(_interrupt)
    sys.unraisablehook = _quiet_ignored_interrupts
    try:
        from tunelab.cli import main as cli_main
    except BaseException as exc:
        if not interrupted(exc):
            raise
        for sig in (signal.SIGINT, *STOP_SIGNALS):
            signal.signal(sig, signal.SIG_IGN)
        sys.stderr.write("tunelab: interrupted while starting; nothing was done\n")
        sys.stderr.flush()
        os._exit(130)  # no finalization of half-imported modules: nothing was done
    cli_main()
