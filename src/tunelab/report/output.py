"""One output layer for every command: a result as data, rendered for where it goes.

A command builds a :class:`View` — blocks of text (:class:`TextTable`, :class:`Lines`,
:class:`Summary`), a JSON document and CSV records — and :func:`emit` renders it in one of
:data:`FORMATS`:

- ``text`` on a terminal: rich tables fitted to the terminal's width. A value is never cut:
  columns are dropped (least useful first) and the caption names them; only columns marked
  ``wrap`` (a point's ``k=v`` list) break, and only between words. A table shows its first
  :data:`TERMINAL_ROWS` rows (the best points of a ranking) and says how many more a pipe
  or a file gets: thousands of rows scroll the rest off a screen and take rich seconds.
- ``text`` into a pipe, a file or a batch job's log: plain lines, one record per line, columns
  aligned by their content only, never wrapped, no colour, no trailing spaces — so ``grep``
  finds whole rows whatever the width of the terminal that started the job.
- ``json``: the view's document, NaN written as ``null`` (schemas in ``docs/output.md``).
- ``csv``: the view's records, one row each, under a header that names ``fields`` first (so
  a view without records is a header, never an empty line).
- ``markdown``: tables as pipe tables, a summary as a one-row table of its figures, lines as
  a list (one line: a paragraph), text escaped (for a pull request or a write-up).

Status messages are not results: they go to standard error through :func:`message`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import IO, Any, Literal

from tunelab.console import is_terminal, message
from tunelab.errors import TunelabError

__all__ = [
    "FORMATS",
    "SCHEMA_VERSION",
    "Block",
    "Cell",
    "Column",
    "Lines",
    "Summary",
    "TextTable",
    "View",
    "emit",
    "is_terminal",
    "json_safe",
    "message",
    "render",
]

FORMATS = ("text", "json", "csv", "markdown")
SCHEMA_VERSION = 2
"""Version of every JSON document (its ``schema`` names the command): bump it whenever a field
changes meaning or disappears (adding a field keeps it)."""
Format = Literal["text", "json", "csv", "markdown"]

Cell = str | tuple[str, str]
"""A table cell: its text, or ``(text, rich style)`` for colour on a terminal."""


@dataclass(frozen=True)
class Column:
    """A column of a :class:`TextTable`.

    ``drop`` orders the columns a narrow terminal leaves out (1 first); ``None`` keeps the
    column whatever the width. ``wrap`` lets a terminal break the column's values between
    words (never inside one).
    """

    key: str
    title: str
    align: Literal["left", "right"] = "left"
    drop: int | None = None
    wrap: bool = False


@dataclass(frozen=True)
class TextTable:
    """A titled table: ``rows`` map column keys to cells; ``notes`` follow the table."""

    title: str
    columns: tuple[Column, ...]
    rows: tuple[Mapping[str, Cell], ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Lines:
    """Sentences, one per line (a ``style`` colours them on a terminal)."""

    lines: tuple[str, ...]
    style: str = ""


@dataclass(frozen=True)
class Summary:
    """A sentence that sums a result up, the figures it states, and lines that follow it.

    Text shows the sentence and the lines; Markdown a one-row table of ``figures`` (column
    -> value) and the lines as a list, so a write-up gets the numbers as data."""

    sentence: str
    figures: Mapping[str, str]
    details: tuple[str, ...] = ()


Block = TextTable | Lines | Summary


@dataclass(frozen=True)
class View:
    """A command's result: text blocks, a JSON document and CSV records (``fields``: the
    CSV columns known without records, first)."""

    blocks: tuple[Block, ...]
    document: Mapping[str, Any]
    records: tuple[Mapping[str, Any], ...] = field(default=())
    fields: tuple[str, ...] = ()


def json_safe(value: Any) -> Any:
    """``value`` with NaN and infinities as None, tuples as lists, keys as strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return json_safe(value.item())
    return value


def _text(cell: Cell | None) -> str:
    if cell is None:
        return ""
    return cell if isinstance(cell, str) else cell[0]


def _style(cell: Cell | None) -> str:
    return "" if cell is None or isinstance(cell, str) else cell[1]


# ---------------------------------------------------------------------------------------
# plain text (pipes, files, job logs)


def _plain_table(table: TextTable) -> list[str]:
    columns = [c for c in table.columns if any(_text(r.get(c.key)) for r in table.rows)]
    columns = columns or list(table.columns)
    cells = [[c.title for c in columns]]
    cells += [[_text(row.get(c.key)).replace("\n", " ") for c in columns] for row in table.rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    out = [table.title] if table.title else []
    for line in cells:
        parts = [
            text.rjust(w) if col.align == "right" else text.ljust(w)
            for text, w, col in zip(line, widths, columns, strict=True)
        ]
        out.append("  ".join(parts).rstrip())
    out.extend(table.notes)
    return out


def _sentences(block: Lines | Summary) -> tuple[str, ...]:
    """The lines a text rendering shows for a block of sentences."""
    if isinstance(block, Summary):
        return (block.sentence, *block.details)
    return block.lines


def _plain(view: View) -> str:
    chunks = []
    for block in view.blocks:
        lines = _plain_table(block) if isinstance(block, TextTable) else list(_sentences(block))
        chunks.append("\n".join(lines))
    return "\n\n".join(c for c in chunks if c) + "\n"


# ---------------------------------------------------------------------------------------
# markdown


_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\|*`<>[]"})


def _md_escape(text: str) -> str:
    """``text`` as Markdown shows it literally, on one line."""
    return text.translate(_MD_SPECIAL).replace("\n", " ")


def _md_lines(lines: tuple[str, ...]) -> str:
    """Sentences in Markdown: one is a paragraph (a leading ``#`` is no heading), more a
    list."""
    if len(lines) == 1:
        text = _md_escape(lines[0])
        return "\\" + text if text.startswith(("#", "-", "+", "=")) else text
    return "\n".join(f"- {_md_escape(line)}" for line in lines)


def _markdown(view: View) -> str:
    chunks = []
    for block in view.blocks:
        if isinstance(block, Lines):
            if block.lines:
                chunks.append(_md_lines(block.lines))
            continue
        if isinstance(block, Summary):
            names = list(block.figures)
            rows = ["| " + " | ".join(_md_escape(n) for n in names) + " |",
                    "|" + "|".join("---" for _ in names) + "|",
                    "| " + " | ".join(_md_escape(block.figures[n]) for n in names) + " |"]
            if block.details:
                rows += ["", "\n".join(f"- {_md_escape(d)}" for d in block.details)]
            chunks.append("\n".join(rows))
            continue
        columns = [c for c in block.columns if any(_text(r.get(c.key)) for r in block.rows)]
        columns = columns or list(block.columns)
        lines = [f"**{_md_escape(block.title)}**", ""] if block.title else []
        lines.append("| " + " | ".join(_md_escape(c.title) for c in columns) + " |")
        lines.append("|" + "|".join("---:" if c.align == "right" else "---" for c in columns)
                     + "|")
        for row in block.rows:
            lines.append("| " + " | ".join(_md_escape(_text(row.get(c.key))) for c in columns)
                         + " |")
        if block.notes:
            lines += ["", _md_lines(block.notes)]
        chunks.append("\n".join(lines))
    return "\n\n".join(c for c in chunks if c) + "\n"


# ---------------------------------------------------------------------------------------
# csv and json


def _csv(view: View) -> str:
    names: list[str] = list(view.fields)
    for record in view.records:
        names.extend(k for k in record if k not in names)
    if not names:
        return ""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    for record in view.records:
        writer.writerow({k: _csv_value(v) for k, v in record.items()})
    return buffer.getvalue()


def _csv_value(value: Any) -> Any:
    value = json_safe(value)
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return value


def _json(view: View) -> str:
    return json.dumps(json_safe(view.document), indent=2, ensure_ascii=False,
                      allow_nan=False) + "\n"


# ---------------------------------------------------------------------------------------
# terminal


def _need(table: TextTable, col: Column) -> int:
    """The narrowest a column can be without cutting a value (a word, for ``wrap``)."""
    texts = [_text(r.get(col.key)) for r in table.rows]
    if col.wrap:
        words = [w for t in texts for w in t.split()] or [""]
        return max(len(col.title), max(len(w) for w in words))
    return max([len(col.title)] + [len(t) for t in texts])


def _natural(table: TextTable, col: Column) -> int:
    """A column's width with every value on one line."""
    return max([len(col.title)] + [len(_text(r.get(col.key))) for r in table.rows])


def _rich_table(block: TextTable, columns: list[Column]) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(title=block.title or None, title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, show_edge=False)
    for col in columns:
        table.add_column(col.title, justify=col.align, no_wrap=not col.wrap,
                         min_width=_need(block, col), overflow="fold")
    for row in block.rows:
        table.add_row(*(Text(_text(row.get(c.key)), style=_style(row.get(c.key)))
                        for c in columns))
    return table


def _fit(console: Any, block: TextTable) -> tuple[Any, list[Column]]:
    """The rich table of the columns that fit the console without cutting a value (None
    when even the columns that are never dropped do not fit), and the columns left out."""
    from rich.measure import Measurement

    columns = [c for c in block.columns if any(_text(r.get(c.key)) for r in block.rows)]
    columns = columns or list(block.columns)
    dropped: list[Column] = []
    while True:
        table = _rich_table(block, columns)
        # rich narrows only the wrapping columns (down to their longest word) before it crops
        # the others: the table fits when its natural width minus that slack fits
        natural = Measurement.get(console, console.options.update_width(10**4), table).maximum
        slack = sum(_natural(block, c) - _need(block, c) for c in columns if c.wrap)
        narrowest = natural - slack
        droppable = [c for c in columns if c.drop is not None]
        if narrowest <= console.width:
            return table, dropped
        if not droppable:
            return None, dropped
        victim = min(droppable, key=lambda c: c.drop or 0)
        columns.remove(victim)
        dropped.append(victim)


TERMINAL_ROWS = 40
"""Rows of a table a terminal shows; a pipe, a file and every other format get them all."""


def _first_rows(block: TextTable) -> TextTable:
    """``block`` cut to :data:`TERMINAL_ROWS` rows, its notes saying how to see the rest."""
    more = len(block.rows) - TERMINAL_ROWS
    if more <= 0:
        return block
    return replace(block, rows=block.rows[:TERMINAL_ROWS], notes=(
        f"({more:,} more rows not shown on a terminal: a pipe (| less), a file or --format "
        f"csv|json|markdown gives all {len(block.rows):,})", *block.notes))


def _terminal(view: View, stream: IO[str], width: int | None) -> None:
    from rich.console import Console
    from rich.text import Text

    console = Console(file=stream, width=width, highlight=False)
    first = True
    for block in view.blocks:
        if not first:
            console.print()
        first = False
        if isinstance(block, Lines | Summary):
            style = block.style if isinstance(block, Lines) else ""
            for line in _sentences(block):  # sentences wrap between words on a terminal
                console.print(Text(line, style=style))
            continue
        block = _first_rows(block)
        table, dropped = _fit(console, block)
        if table is None:  # even the essential columns are too wide: one record per block
            _records(console, block)
            continue
        console.print(table)
        notes = list(block.notes)
        if dropped:
            names = ", ".join(c.title for c in dropped)
            notes.append(f"(left out at this width: {names}; a wider terminal, a pipe or "
                         "--format json shows every column)")
        for note in notes:
            console.print(Text(note))


def _records(console: Any, table: TextTable) -> None:
    """A table too wide for the terminal, as ``title: value`` lines per row."""
    from rich.text import Text

    if table.title:
        console.print(Text(table.title, style="bold"))
    for row in table.rows:
        console.print()
        for col in table.columns:
            cell = row.get(col.key)
            if _text(cell):
                line = Text(f"{col.title}: ")
                line.append(_text(cell), style=_style(cell))
                console.print(line, soft_wrap=not col.wrap)  # only ``wrap`` values break
    for note in table.notes:
        console.print(Text(note))


# ---------------------------------------------------------------------------------------


def render(view: View, fmt: str) -> str:
    """``view`` as a string in ``fmt`` (``text`` renders the plain form)."""
    if fmt == "json":
        return _json(view)
    if fmt == "csv":
        return _csv(view)
    if fmt == "markdown":
        return _markdown(view)
    if fmt == "text":
        return _plain(view)
    raise TunelabError(f"unknown output format {fmt!r}; valid: {', '.join(FORMATS)}")


def emit(view: View, fmt: str = "text", *, stream: IO[str] | None = None,
         terminal: bool | None = None, width: int | None = None) -> None:
    """Write ``view`` to ``stream`` (standard output) in ``fmt``.

    ``text`` becomes rich tables only when ``stream`` is a terminal (``terminal`` overrides
    the check; ``width`` the terminal's width), plain lines otherwise.
    """
    stream = stream or sys.stdout
    if fmt not in FORMATS:
        raise TunelabError(f"unknown output format {fmt!r}; valid: {', '.join(FORMATS)}")
    if terminal is None:
        terminal = is_terminal(stream)
    if fmt == "text" and terminal:
        _terminal(view, stream, width)
    else:
        stream.write(render(view, fmt))
    stream.flush()
