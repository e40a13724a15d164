"""A rich progress bar for a running study: runs done / total, failures, ETA."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from tunelab.execute.runner import RunEvent

__all__ = ["StudyProgress"]


class StudyProgress:
    """Progress display fed by the runner's ``on_start`` / ``on_event`` callbacks."""

    def __init__(self, console: Console, *, enabled: bool = True) -> None:
        self.console = console
        self.enabled = enabled
        self.failures = 0
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("runs · {task.fields[failures]} failed"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            disable=not enabled,
            transient=False,
        )
        self._task: TaskID | None = None

    def __enter__(self) -> StudyProgress:
        self._progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop drawing (idempotent)."""
        self._progress.stop()

    def start(self, done: int, total: int) -> None:
        """Called once the plan is known: ``done`` of ``total`` runs already stored."""
        self._task = self._progress.add_task("running", total=total, completed=done,
                                             failures=0)

    def update(self, event: RunEvent) -> None:
        """Called after each run."""
        if event.status != "ok":
            self.failures += 1
            if self.enabled:
                self._progress.console.print(
                    f"[yellow]{event.status}[/yellow] {event.point.label()} "
                    f"repeat {event.repeat}: {event.reason}", markup=True, highlight=False)
        if self._task is not None:
            self._progress.update(self._task, completed=event.done, failures=self.failures,
                                  description=event.point.label()[:40])
