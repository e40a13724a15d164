"""Terminal conventions every part of tunelab shares: is standard error a terminal, one status
line on standard error, progress of a long task, plain ``--help`` text.

A primitive below the output layer (:mod:`tunelab.report.output` builds on it), so that
programs of their own (``python -m tunelab.bench.ddp``) follow the same conventions without
importing the report package.
"""

from __future__ import annotations

import sys
from typing import IO, Any

__all__ = ["PLAIN_HELP", "TaskProgress", "is_terminal", "message"]

PLAIN_HELP: dict[str, Any] = {"rich_markup_mode": None,
                              "context_settings": {"help_option_names": ["-h", "--help"]}}
"""typer settings for plain help: the same on a terminal, in a pipe, at any width."""


def is_terminal(stream: IO[str]) -> bool:
    """True when ``stream`` is an interactive terminal."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def message(text: str, *, stream: IO[str] | None = None) -> None:
    """A status line on standard error: one line, never wrapped, flushed at once."""
    stream = stream or sys.stderr
    stream.write(text.rstrip("\n") + "\n")
    stream.flush()


class TaskProgress:
    """Progress of one long task on standard error: a bar on a terminal, else a line every 10 %
    (use as a context manager; call :meth:`update` with work done and total)."""

    def __init__(self, what: str, unit: str) -> None:
        self.what = what
        self.unit = unit
        self._bar: Any = None
        self._task: Any = None
        self._shown = -1

    def __enter__(self) -> TaskProgress:
        if is_terminal(sys.stderr):
            from rich.console import Console
            from rich.progress import Progress

            self._bar = Progress(console=Console(file=sys.stderr), transient=False)
            self._bar.start()
        return self

    def update(self, done: int, total: int) -> None:
        if self._bar is not None:
            if self._task is None:
                self._task = self._bar.add_task(self.what, total=total)
            self._bar.update(self._task, completed=done)
            return
        tenth = done * 10 // max(1, total)
        if tenth != self._shown:
            self._shown = tenth
            message(f"{self.what}: {done}/{total} {self.unit} ({100 * done // max(1, total)}%)")

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
