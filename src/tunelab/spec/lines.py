"""Where in a study file: the line numbers behind :mod:`tunelab.spec`'s error messages.

:class:`StudyLines` turns a path into the study's data (``("search", "max_wall")``) into a
:class:`~tunelab.errors.StudyError` located at the deepest line known for it
(``study.yaml:12: ...``); :func:`shorten` cuts a value quoted in such a message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tunelab.errors import StudyError

__all__ = ["StudyLines", "shorten"]


@dataclass(frozen=True)
class StudyLines:
    """A study file's name and the line of each path into its data (``()``: the file)."""

    source: str
    lines: Mapping[tuple[Any, ...], int]

    def error(self, path: tuple[Any, ...], message: str) -> StudyError:
        """A StudyError located at the deepest known line of ``path``."""
        for depth in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:depth]))
            if line is not None:
                return StudyError(f"{self.source}:{line}: {message}")
        return StudyError(f"{self.source}: {message}")


def shorten(text: str, width: int = 80) -> str:
    """``text`` cut for an error message."""
    return text if len(text) <= width else text[:width - 1] + "…"
