"""Progress of a running study, on standard error (standard output keeps the results).

:func:`study_progress` picks the display for where standard error goes: a rich progress bar
(runs done / total, failures, ETA) on a terminal; one plain line per finished run otherwise
(``[12/48] np=2 npool=2 r1 ok 5.31 s``), flushed at once, so the log of a job under ``nohup``,
``sbatch`` or ``qsub`` shows the study as it goes.
"""

from __future__ import annotations

import contextlib
import math
import sys
from types import TracebackType
from typing import IO, Protocol

from tunelab.execute.runner import RunEvent
from tunelab.report.output import is_terminal

__all__ = ["LineProgress", "LiveProgress", "Progress", "event_line", "study_progress"]


class Progress(Protocol):
    """What the runner's callbacks feed: ``start`` once, ``update`` after every run."""

    def start(self, done: int, total: int) -> None:
        """The plan is known: ``done`` of ``total`` runs are already stored."""

    def update(self, event: RunEvent) -> None:
        """A run finished."""

    def stop(self) -> None:
        """Stop displaying (idempotent)."""


def event_line(event: RunEvent) -> str:
    """``[12/48] np=2 npool=2 r1 ok 5.31 s`` (and the reason of a run that was not ok)."""
    width = len(str(event.total))
    line = (f"[{event.done:>{width}}/{event.total}] {event.point.label()} "
            f"r{event.repeat} {event.status} {event.wall_s:.2f} s")
    if event.value is not None and event.fom != "wall_s" and math.isfinite(event.value):
        line += f" {event.fom}={event.value:.6g}"
    if event.reason:
        line += f": {event.reason}"
    return line.replace("\n", " ")


class LineProgress:
    """One line per finished run (for pipes, files and batch job logs)."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self, done: int, total: int) -> None:
        """Say how many runs the study has and how many were stored before."""
        before = f", {done} stored before" if done else ""
        self._write(f"tunelab: {total} runs planned{before}")

    def update(self, event: RunEvent) -> None:
        """Write the run's line."""
        self._write(event_line(event))

    def stop(self) -> None:
        """Nothing to take down."""

    def _write(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


class LiveProgress:
    """A rich progress bar; runs that were not ok are printed above it."""

    def __init__(self, stream: IO[str]) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichProgress

        self.failures = 0
        self._progress = RichProgress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("runs · {task.fields[failures]} not ok"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(file=stream, highlight=False),
            transient=True,
        )
        self._task: int | None = None
        self._started = False

    def __enter__(self) -> LiveProgress:
        self._progress.start()
        self._started = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self, done: int, total: int) -> None:
        """Show the bar with ``done`` of ``total`` runs."""
        self._task = self._progress.add_task("running", total=total, completed=done,
                                             failures=0)

    def update(self, event: RunEvent) -> None:
        """Advance the bar; print a run that was not ok above it."""
        from rich.text import Text

        if event.status != "ok":
            self.failures += 1
            self._progress.console.print(Text(event_line(event), style="yellow"),
                                         soft_wrap=True)
        if self._task is not None:
            self._progress.update(self._task, completed=event.done,  # type: ignore[arg-type]
                                  failures=self.failures,
                                  description=event.point.label()[:30])

    def stop(self) -> None:
        """Take the bar down (idempotent; a terminal that has gone away, as on a hang-up,
        leaves nothing to take down)."""
        if self._started:
            self._started = False
            with contextlib.suppress(OSError):
                self._progress.stop()


def study_progress(*, quiet: bool = False,
                   stream: IO[str] | None = None) -> LineProgress | LiveProgress | _Silent:
    """The progress display for ``stream`` (standard error): a bar on a terminal, lines
    elsewhere, nothing with ``quiet``."""
    stream = stream or sys.stderr
    if quiet:
        return _Silent()
    return LiveProgress(stream) if is_terminal(stream) else LineProgress(stream)


class _Silent:
    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def start(self, done: int, total: int) -> None:
        del done, total

    def update(self, event: RunEvent) -> None:
        del event

    def stop(self) -> None:
        return None
