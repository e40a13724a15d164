"""A reader that leaves early (``tunelab export DIR -o - | head -c 100``) ends tunelab
quietly, with exit status 0, whatever was writing: a table, JSON, Parquet bytes, ``--help``.

Python raises :class:`BrokenPipeError` on the first write after the reader closed the pipe
(SIGPIPE is ignored in Python). Left alone, click turns it into a silent exit 1 and code that
translates ``OSError`` into a one-line error (exit 2: bad input) would blame the user. So
:func:`guard_stdout` puts a thin proxy in front of standard output (and of its binary
buffer) that turns the error into :class:`ReaderLeft` — a :class:`BaseException`, which no
``except Exception`` or ``except OSError`` on the way catches — and :func:`tunelab.cli.main`
ends the process quietly when it arrives. What the reader wanted was written.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

__all__ = ["ReaderLeft", "guard_stdout", "silence_stdout"]


class ReaderLeft(BaseException):  # noqa: N818 - an event, not an error
    """Standard output's reader is gone (EPIPE)."""


def _closed(exc: OSError) -> bool:
    return isinstance(exc, BrokenPipeError) or exc.errno == errno.EPIPE


class _Guarded:
    """``stream`` with its writes and flushes turning EPIPE into :class:`ReaderLeft`."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, data: Any) -> Any:
        try:
            return self._stream.write(data)
        except OSError as exc:
            if _closed(exc):
                raise ReaderLeft from None
            raise

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            if _closed(exc):
                raise ReaderLeft from None
            raise

    @property
    def buffer(self) -> Any:
        return _Guarded(self._stream.buffer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_stdout() -> None:
    """Put the EPIPE-guarding proxy in front of ``sys.stdout`` (once)."""
    if not isinstance(sys.stdout, _Guarded) and sys.stdout is not None:
        sys.stdout = _Guarded(sys.stdout)


def silence_stdout() -> None:
    """Point standard output at /dev/null, so that the interpreter's last flush at exit
    finds no reader missing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno() if sys.__stdout__ else 1)
        os.close(devnull)
    except (OSError, ValueError):
        pass
