"""The command blocks of the project's Markdown, read the way ``tests/test_docs.py`` runs them.

A *command block* is a fenced block tagged ``bash``, ``sh``, ``shell`` or ``console``, or an
untagged one whose first line starts like a command (``tunelab …``, ``$ …``, ``python …``,
``make …``, ``eval …``, ``scripts/…``, ``.venv/bin/…``). In a ``console`` block (or any block
whose commands carry a ``$`` prompt) the other lines are the output the commands print.

An HTML comment right before a fence tells the test what to do with the block:

- ``<!-- docs-test: skip (REASON) -->`` — it cannot run here (a GPU, a real cluster site, a
  multi-minute benchmark…); the test checks that what the repository provides in it exists
  instead: each ``tunelab`` command and option (its ``--help`` parses), each
  ``python -m MODULE`` and ``python FILE`` with its options, ``scripts/…``, ``make TARGET``.
- ``<!-- docs-test: file NAME -->`` — the block (YAML, usually) is written to ``NAME`` in the
  document's scratch directory before the blocks after it run.

Everything else in a command block runs, in order, in one scratch directory per document.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Block", "Command", "blocks_of", "commands_of", "documents"]

ROOT = Path(__file__).resolve().parents[1]
COMMAND_TAGS = ("bash", "sh", "shell", "console")
COMMAND_STARTS = ("tunelab ", "$ ", "python ", "python3 ", ".venv/bin/", "make ", "eval ",
                  "scripts/", "bash scripts/")
SHELL_TOKENS = {"|", ">", ">>", "<", "2>&1", ";", "&"}
_MARKER = re.compile(r"<!--\s*docs-test:\s*(?P<kind>skip|file)\s*(?P<arg>.*?)\s*-->")
_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<tag>[\w+-]*)")


def documents() -> list[Path]:
    """README.md and every Markdown file under docs/, in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@dataclass
class Command:
    """One command line of a block (continuations joined), and the output shown after it."""

    line: str
    output: list[str] = field(default_factory=list)

    @property
    def needs_shell(self) -> bool:
        """Pipes, redirections, ``$(…)``, variables or ``VAR=value`` prefixes: the narrow
        case where the test hands the line to bash (``set -o pipefail``)."""
        if "$" in self.line or "`" in self.line:
            return True
        try:
            tokens = shlex.split(self.line, comments=True)
        except ValueError:
            return True
        return bool(tokens) and (any(t in SHELL_TOKENS for t in tokens)
                                 or re.fullmatch(r"[A-Za-z_]\w*=.*", tokens[0]) is not None)

    def argvs(self) -> list[list[str]]:
        """The line as argv lists (``a && b`` is two); only for lines without a shell."""
        tokens = shlex.split(self.line, comments=True)
        out: list[list[str]] = [[]]
        for token in tokens:
            if token == "&&":
                out.append([])
            else:
                out[-1].append(token)
        return [argv for argv in out if argv]


@dataclass
class Block:
    """A fenced block: where it starts, its tag, its lines, and the marker before it."""

    path: Path
    line: int
    tag: str
    lines: list[str]
    marker: str = ""
    """``skip``, ``file`` or empty."""
    argument: str = ""
    """The skip reason (in parentheses) or the file name."""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def is_command(self) -> bool:
        """Whether the block holds commands (see the module docstring)."""
        if self.tag in COMMAND_TAGS:
            return True
        if self.tag:
            return False
        first = next((ln.strip() for ln in self.lines if ln.strip()), "")
        return first.startswith(COMMAND_STARTS)


def blocks_of(path: Path) -> list[Block]:
    """Every fenced block of the Markdown file ``path``, with its marker."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence = opening.group("fence")
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        previous = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = _MARKER.search(previous)
        blocks.append(Block(path, start + 1, opening.group("tag").lower(), body,
                            marker.group("kind") if marker else "",
                            marker.group("arg") if marker else ""))
    return blocks


def commands_of(block: Block) -> list[Command]:
    """The commands of a command block: continuation lines joined, comment lines and blank
    lines dropped; with ``$`` prompts, the lines after a command are its output."""
    prompted = any(ln.startswith("$ ") for ln in block.lines)
    commands: list[Command] = []
    pending = ""
    for raw in block.lines:
        if pending:
            pending += " " + raw.strip()
        elif prompted and not raw.startswith("$ "):
            if commands:
                commands[-1].output.append(raw)
            continue
        else:
            pending = raw.removeprefix("$ ").strip()
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        if pending and not pending.startswith("#"):
            commands.append(Command(pending))
        pending = ""
    return commands
