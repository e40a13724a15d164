"""Why a run that exited with a non-zero status failed, in one line a person can act on.

The last line a program printed is often not the reason: Open MPI ends its report with a
line of dashes, and the line that names the fault (``mpirun noticed that process rank 0 …
exited on signal 11 (Segmentation fault).``) or the program's own error (``ERROR: cannot open
input.dat``) lies above the banner it wraps around it. :func:`failure_reason` picks, in order:

1. a process that ended on a signal: MPI's line that says so, or the signal of the run's
   own exit status (negative, as :mod:`subprocess` reports it);
2. the exception line of a Python traceback;
3. the first line that reads as an error (``error``, ``fatal``, ``cannot``, ``not found``,
   ``segmentation fault``…), standard error before standard output;
4. the last line that is not a banner;

skipping the boilerplate every MPI failure prints (rules of dashes, "Primary job terminated
normally, but…", gfortran's floating-point note). A status above 128 that no line explains
is named as the signal a shell would mean by it.

Text taken from a program's output goes through :func:`printable` before it becomes part of a
reason, so that a stored reason is one bounded line a terminal shows as it is: escape
sequences a program printed (a window title, colours) are shown escaped, never sent.
"""

from __future__ import annotations

import re
import signal

__all__ = ["MESSAGE_CHARS", "REASON_CHARS", "failure_reason", "printable"]

REASON_CHARS = 300
"""The longest reason line kept (its end is cut)."""
MESSAGE_CHARS = 1_000
"""The longest reason a workload's parse error gives (its end is cut)."""

_SIGNAL_LINE = re.compile(r"(?:exited|terminated|killed) (?:on|by) signal \d+", re.I)
_ERROR_WORDS = re.compile(
    r"\berror\b|\bfatal\b|\bexception\b|\bcannot\b|\bcan't\b|\bcould not\b|\bunable to\b|"
    r"\bnot found\b|\bno such file\b|\bpermission denied\b|\bout of memory\b|"
    r"\bsegmentation fault\b|\bbus error\b|\billegal instruction\b|\baborted\b|\bkilled\b|"
    r"\binvalid\b|\bfailed\b|\bfailure\b", re.I)
_BOILERPLATE = (
    "primary job  terminated normally",
    "primary job terminated normally",
    "a non-zero exit code. per user-direction",
    "per user-direction, the job has been aborted",
    "mpirun detected that one or more processes exited with non-zero status",
    "the job to be terminated. the first process to do so was",
    "process name: [[",
    "note: invoking mpi_abort causes open mpi to kill all mpi processes",
    "you may or may not see output from other processes",
    "note: the following floating-point exceptions are signalling",
)
_BANNER = re.compile(r"^[\W_]*$")
"""A line of punctuation only: ``-----``, ``=====``, ``*****``."""


def _lines(text: str) -> list[str]:
    """The lines of ``text`` worth reading: stripped, not empty, not a banner or MPI's
    boilerplate."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or _BANNER.match(line):
            continue
        lower = " ".join(line.lower().split())
        if any(lower.startswith(b) or b in lower for b in _BOILERPLATE):
            continue
        out.append(line)
    return out


def _signal_name(number: int) -> str | None:
    """``11`` -> ``Segmentation fault``; None for a number that is no signal here."""
    try:
        return signal.strsignal(signal.Signals(number)) or signal.Signals(number).name
    except ValueError:
        return None


def _python_exception(text: str) -> str | None:
    """The exception line of the last Python traceback in ``text``."""
    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return None
    for raw in text[start:].splitlines()[1:]:
        if raw and not raw[0].isspace():
            return raw.strip()
    return None


_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escaped(char: str) -> str:
    """``char`` as Python writes it in a string literal: ``\\x1b``, ``\\u202e``, ``\\t``."""
    code = ord(char)
    if char in _NAMED:
        return _NAMED[char]
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, limit: int = REASON_CHARS) -> str:
    """``text`` as one line of at most ``limit`` characters that a terminal shows as it is:
    every character Python does not count as printable (controls such as ESC and BEL, line
    breaks, bidirectional overrides, unpaired surrogates; any space but the ASCII one) is
    written escaped (``\\x1b``), and a longer result is cut, its end marked ``…``."""
    pieces = [char if char.isprintable() else _escaped(char) for char in text[:limit + 1]]
    if len(text) <= limit and sum(map(len, pieces)) <= limit:
        return "".join(pieces)
    kept: list[str] = []
    size = 0
    for piece in pieces:
        if size + len(piece) > limit - 1:
            break
        kept.append(piece)
        size += len(piece)
    return "".join(kept) + "…"


def _cut(line: str) -> str:
    return printable(line, REASON_CHARS)


def failure_reason(rc: int | None, stdout: str, stderr: str) -> str:
    """``exit code RC: WHY`` for a run that ended with status ``rc`` (``killed by signal
    N (Name)`` when ``rc`` is negative); see the module docstring for how WHY is found."""
    streams = (stderr, stdout)
    if rc is not None and rc < 0:
        head = f"killed by signal {-rc}"
        name = _signal_name(-rc)
        head += f" ({name})" if name else ""
    else:
        head = f"exit code {rc}"
    for text in streams:  # an MPI launcher's word on a rank that died on a signal
        for line in _lines(text):
            if _SIGNAL_LINE.search(line):
                return f"{head}: {_cut(line)}"
    if rc is not None and rc < 0:
        return head
    for text in streams:
        exception = _python_exception(text)
        if exception:
            return f"{head}: {_cut(exception)}"
    for text in streams:
        for line in _lines(text):
            if _ERROR_WORDS.search(line):
                return f"{head}: {_cut(line)}"
    if rc is not None and rc > 128 and (name := _signal_name(rc - 128)) is not None:
        return f"{head} (128 + signal {rc - 128}: {name}, as a shell reports a program " \
               "killed by it)"
    for text in streams:
        lines = _lines(text)
        if lines:
            return f"{head}: {_cut(lines[-1])}"
    return head
