"""Reading a file that a user names and tunelab reads whole (a pw.x input, a data manifest, a
profile): a regular file only, no further than a size limit.

``Path.read_text()`` on such a name would block for ever on a FIFO, read without end from
``/dev/zero`` or ``/dev/urandom``, and take gigabytes for a huge (or sparse) file before any
check could say what is wrong. :func:`read_input` opens without blocking, checks what the
name is, reads at most the limit, and raises the caller's error class with one sentence that
names the file: ``<label> is not a regular file (a FIFO)``, ``<label> is 2,147,483,648 bytes,
more than the limit of 16 MiB``, ``<label> cannot be read: Permission denied``.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

from tunelab.errors import TunelabError
from tunelab.limits import LIMITS

__all__ = ["read_input", "read_input_json", "read_input_text"]

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _size(limit: int) -> str:
    whole_mib = limit >= 1 << 20 and not limit % (1 << 20)
    return f"{limit >> 20} MiB" if whole_mib else f"{limit:,} bytes"


def read_input(path: str | Path, label: str, *, limit: int = LIMITS.input_file_bytes,
               error: type[TunelabError] = TunelabError) -> bytes:
    """The bytes of the regular file ``path``; ``error(f"{label} …")`` when it is missing,
    not a regular file, larger than ``limit`` bytes or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise error(f"{label} {_why(exc)}") from None
    try:
        mode = os.fstat(fd)
        if stat.S_ISDIR(mode.st_mode):
            raise error(f"{label} is a directory, not a file")
        if not stat.S_ISREG(mode.st_mode):
            kind = next((name for test, name in _KINDS if test(mode.st_mode)), "not a file")
            raise error(f"{label} is not a regular file ({kind})")
        if mode.st_size > limit:
            raise error(f"{label} is {mode.st_size:,} bytes, more than the limit of "
                        f"{_size(limit)} for a file tunelab reads whole")
        os.set_blocking(fd, True)
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise error(f"{label} {_why(exc)}") from None
    finally:
        os.close(fd)
    blob = b"".join(chunks)
    if len(blob) > limit:  # it grew while it was read
        raise error(f"{label} is more than the limit of {_size(limit)} for a file tunelab "
                    "reads whole")
    return blob


def read_input_text(path: str | Path, label: str, *, limit: int = LIMITS.input_file_bytes,
                    error: type[TunelabError] = TunelabError) -> str:
    """:func:`read_input` decoded as UTF-8; a byte that is not names its line and column."""
    blob = read_input(path, label, limit=limit, error=error)
    try:
        return blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = blob.count(b"\n", 0, exc.start) + 1
        column = exc.start - blob.rfind(b"\n", 0, exc.start)
        raise error(f"{label} line {line}: not UTF-8 text (byte 0x{blob[exc.start]:02x} at "
                    f"column {column})") from None


def read_input_json(path: str | Path, label: str, *, limit: int = LIMITS.input_file_bytes,
                    error: type[TunelabError] = TunelabError) -> Any:
    """:func:`read_input_text` parsed as JSON; malformed or too deeply nested JSON is
    ``error(f"{label} is not valid JSON (…)")``."""
    text = read_input_text(path, label, limit=limit, error=error)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise error(f"{label} is not valid JSON ({exc})") from None
    except RecursionError:
        raise error(f"{label} is not valid JSON (nested too deeply)") from None


def _why(exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return "does not exist"
    if exc.errno == errno.ELOOP:
        return "is a loop of symbolic links"
    if exc.errno == errno.EISDIR:
        return "is a directory, not a file"
    return f"cannot be read: {exc.strerror or exc}"
