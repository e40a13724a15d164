"""Terminal conventions every part of tunelab shares: is standard error a terminal, one status
line on standard error, progress of a long task, plain ``--help`` text.

A primitive below the output layer (:mod:`tunelab.report.output` builds on it), so that
programs of their own (``python -m tunelab.bench.ddp``) follow the same conventions without
importing the report package.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO, Any

__all__ = ["PLAIN_HELP", "TaskProgress", "is_terminal", "message", "usage_error_line"]

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


def usage_error_line(exc: BaseException, args: Sequence[str] | None = None) -> str | None:
    """One line for a command-line usage error of typer (click): the option, the value given
    (read from ``args``, default ``sys.argv[1:]``, where the error does not carry it) and what
    the option takes, instead of the four-line usage box; None when ``exc`` is not one.

    The one place every tunelab command line (``tunelab``, ``python -m tunelab.bench.merge``)
    turns its parser's refusals into text."""
    format_message = getattr(exc, "format_message", None)
    if format_message is None:
        return None
    param = getattr(exc, "param", None)
    opts = [*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())]
    if not opts or not str(getattr(exc, "message", "")):
        return " ".join(str(format_message()).split()) + " (see --help)"
    found, value = _given_value(exc, opts, sys.argv[1:] if args is None else args)
    why = " ".join(str(getattr(exc, "message", "")).split())
    for prefix in ("Value error, ", "Input "):
        why = why.removeprefix(prefix)
    shown = f" {value!r}" if found else ""
    return f"invalid value{shown} for {'/'.join(opts)}: {why} (see --help)"


def _given_value(exc: BaseException, opts: Sequence[str],
                 args: Sequence[str]) -> tuple[bool, Any]:
    """The value the user gave the option at fault: what the parser's validation saw (its
    cause, a pydantic error), else the word after the option (or after its ``=``) in ``args``."""
    errors = getattr(exc.__cause__, "errors", None)
    if callable(errors):
        try:
            return True, errors()[0]["input"]
        except (LookupError, TypeError):
            pass
    found: tuple[bool, Any] = (False, None)
    for i, arg in enumerate(args):
        for opt in opts:
            if arg == opt and i + 1 < len(args):
                found = (True, args[i + 1])
            elif opt.startswith("--") and arg.startswith(opt + "="):
                found = (True, arg[len(opt) + 1:])
    return found


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
