"""What each value of a tunelab database must hold, checked whenever a store is opened.

A database can pass SQLite's ``quick_check`` and still hold values tunelab never writes: a
``meta.spec`` that is not JSON, a figure of merit that is text, a status the CHECK does not
know (SQLite checks CHECK constraints only on a writable database), a noise column holding
``'abc'``. Every reader turns rows into Python values in its own way; a value it cannot
decode ended in a traceback deep in pandas or the statistics. :func:`check_values` is the one
place that says what each column holds: it finds the first value that breaks its rule and
refuses the store in one line naming the table, column, row and value, before anything reads
or writes it, for every command alike.

The rules are SQL (one scan of each table, values decoded in Python only for the few meta
keys and for the one row at fault), so a large store costs a fraction of a second. Figures of
merit are held to the bounds the runner applies when it stores them
(:attr:`LIMITS.fom_magnitude <tunelab.limits.Limits.fom_magnitude>`): a store written before
that bound with a larger one is refused, not fed to statistics that overflow on it.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunelab.errors import StoreError
from tunelab.limits import LIMITS
from tunelab.store.schema import NOISE_COLUMNS, STATUSES

__all__ = ["check_values"]

_SHOWN_CHARS = 60
"""Characters of a faulty value the error shows."""
_META_CHARS = 100_000
"""Longest meta value decoded here (all but ``spec`` and ``spec_yaml`` are a few bytes)."""
_MAX_PID = 1 << 22
"""Largest process id Linux hands out (``/proc/sys/kernel/pid_max`` at most)."""


@dataclass(frozen=True)
class _Rule:
    """A column's rule: ``valid`` is an SQL condition on it (``{c}`` names the column)."""

    column: str
    valid: str
    expect: str


def _json(kind: str) -> str:
    return ("CASE WHEN typeof({c}) = 'text' AND json_valid({c}) "
            f"THEN json_type({{c}}) = '{kind}' ELSE 0 END")


_NUMBER = "typeof({c}) IN ('integer', 'real') AND abs(CAST({c} AS REAL)) <= 1.7e308"
_TEXT = "typeof({c}) = 'text'"
_WHOLE = "typeof({c}) = 'integer' AND {c} >= 0"
_TOP = LIMITS.fom_magnitude

_TABLES: dict[str, tuple[str, list[_Rule]]] = {
    # table: (SQL naming a row, rules)
    "points": ("'point ' || id", [
        _Rule("key", _json("object"), "a point: a JSON object"),
        _Rule("params", _json("object"), "the point's parameters: a JSON object"),
    ]),
    "runs": ("'run ' || id", [
        _Rule("point_id", "typeof({c}) = 'integer' AND {c} IN (SELECT id FROM points)",
              "the id of a stored point"),
        _Rule("repeat", _WHOLE, "a whole number >= 0"),
        _Rule("status", "{c} IN (" + ", ".join(f"'{s}'" for s in STATUSES) + ")",
              "one of " + ", ".join(STATUSES)),
        _Rule("reason", "{c} IS NULL OR " + _TEXT, "text or NULL"),
        _Rule("rc", "{c} IS NULL OR typeof({c}) = 'integer'", "an exit status or NULL"),
        _Rule("wall_s", _NUMBER + " AND {c} >= 0", "seconds: a finite number >= 0"),
        _Rule("started_at", _TEXT, "a time stamp: text"),
        _Rule("ended_at", _TEXT, "a time stamp: text"),
        _Rule("host", _TEXT, "a host name: text"),
    ]),
    "foms": ("'run ' || run_id || ', figure ' || quote(name)", [
        _Rule("name", _TEXT, "a figure of merit's name: text"),
        _Rule("value", f"typeof({{c}}) IN ('integer', 'real') AND (CAST({{c}} AS REAL) = 0 OR "
                       f"abs(CAST({{c}} AS REAL)) BETWEEN {1 / _TOP!r} AND {_TOP!r})",
              f"a number of magnitude {1 / _TOP:g} to {_TOP:g}, or 0, the bounds tunelab "
              "stores figures of merit within"),
    ]),
    "sysinfo": ("'snapshot ' || id", [
        _Rule("snapshot", _json("object"), "a machine snapshot: a JSON object"),
    ]),
    "noise": ("'run ' || run_id", [
        *(_Rule(name, "{c} IS NULL OR " + (_TEXT if kind == "TEXT" else _NUMBER),
                "text or NULL" if kind == "TEXT" else "a finite number or NULL")
          for name, kind in NOISE_COLUMNS.items() if name != "disturbed"),
        _Rule("disturbed", "{c} IN (0, 1)", "0 or 1"),
    ]),
    "jobs": ("'job ' || quote(token)", [
        _Rule("launcher", _TEXT, "a launcher's name: text"),
        _Rule("job_id", "{c} IS NULL OR " + _TEXT, "a scheduler's job id: text or NULL"),
        _Rule("runs", _json("array"), "the job's runs: a JSON list"),
    ]),
    "attempts": ("'attempt ' || id", [
        _Rule("point_id", "typeof({c}) = 'integer'", "the id of a point"),
        _Rule("repeat", _WHOLE, "a whole number >= 0"),
    ]),
}


def check_values(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse the store at ``path`` in one line (:class:`StoreError`) when a value in it is
    not what tunelab writes there: the meta values tunelab reads back, then every table's
    columns (see :data:`_TABLES`). Tables and columns an older version lacks are skipped."""
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = "
                                             "'table'")}
    if "meta" in tables:
        _check_meta(conn, path)
    for table, (row_name, rules) in _TABLES.items():
        if table not in tables:
            continue
        have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        rules = [r for r in rules if r.column in have]
        bad = " ".join(f"WHEN NOT coalesce(({r.valid.format(c=r.column)}), 0) THEN {i}"
                       for i, r in enumerate(rules))
        shown = ", ".join(_shown(r.column) for r in rules)
        row = conn.execute(f"SELECT {row_name}, CASE {bad} END AS bad, {shown} FROM {table} "
                           "WHERE bad IS NOT NULL LIMIT 1").fetchone()
        if row is not None:
            rule = rules[row[1]]
            _refuse(path, f"{table}.{rule.column} of {row[0]}", row[2 + row[1]], rule.expect)


def _shown(column: str) -> str:
    """SQL for what the error shows of a value: text and blobs cut short."""
    return (f"CASE WHEN typeof({column}) IN ('text', 'blob') "
            f"THEN substr({column}, 1, {_SHOWN_CHARS + 1}) ELSE {column} END")


def _refuse(path: Path, where: str, value: Any, expect: str) -> None:
    if isinstance(value, bytes):
        text = f"x'{value[:_SHOWN_CHARS // 2].hex()}'"
    elif isinstance(value, str):
        text = repr(value[:_SHOWN_CHARS]) + ("..." if len(value) > _SHOWN_CHARS else "")
    else:
        text = repr(value)
    raise StoreError(f"{path}: the results database is damaged: {where} holds {text} "
                     f"(expected {expect}); nothing was read or changed. Restore it from a "
                     f"copy, or correct that value with: sqlite3 {path}")


# --- meta -------------------------------------------------------------------------------


def _loads(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return None


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: str) -> bool:
    try:
        return math.isfinite(float(value))
    except ValueError:
        return False


def _objective(value: str) -> bool:
    got = _loads(value)
    return (isinstance(got, list) and len(got) == 2 and isinstance(got[0], str)
            and got[1] in ("minimize", "maximize"))


def _auto_rounds(value: str) -> bool:
    got = _loads(value) if value else [1, 1]
    return (isinstance(got, list) and len(got) == 2 and all(_whole(n) for n in got)
            and 1 <= got[0] <= got[1] <= LIMITS.repeats)


def _inflight(value: str) -> bool:
    got = _loads(value) if value else {"pid": 1, "start": 0}
    return (isinstance(got, dict) and _whole(got.get("pid")) and 0 < got["pid"] <= _MAX_PID
            and _whole(got.get("start")))


_META: dict[str, tuple[Callable[[str], bool], str]] = {
    "schema_version": (lambda v: v.isdigit() and len(v) < 10, "a version: a whole number"),
    "objective": (lambda v: not v or _objective(v),
                  'a JSON list [figure of merit, "minimize" or "maximize"], or empty'),
    "noise_threshold": (lambda v: not v or _number(v) and float(v) >= 0,
                        "a finite number >= 0, or empty"),
    "planned_runs": (lambda v: not v or v.isdigit() and len(v) < 10,
                     "a whole number, or empty"),
    "baseline": (lambda v: not v or isinstance(_loads(v), dict),
                 "a point (a JSON object), or empty"),
    "repeats_auto": (_auto_rounds, "a JSON list [min rounds, max rounds], or empty"),
    "discarded_runs": (lambda v: isinstance(_loads(v), list), "a JSON list"),
    "inflight": (_inflight, 'a JSON object {"pid": a process id, "start": its start time, '
                            '...}, or empty'),
}
"""The meta values tunelab reads back, but the study file (``spec``, checked in SQL) and its
text: key -> (whether a value is valid, what it must be). ``reference.<fom>`` values (the
invariants' references) are finite numbers."""


def _check_meta(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a meta value tunelab reads back that it would not have written."""
    spec = conn.execute(f"SELECT {_shown('value')} FROM meta WHERE key = 'spec' AND NOT "
                        f"coalesce(({_json('object').format(c='value')}), 0)").fetchone()
    if spec is not None:
        _refuse(path, "meta.value of key 'spec'", spec[0], "the study: a JSON object")
    keys = ", ".join(f"'{k}'" for k in _META)
    rows = conn.execute(
        f"SELECT key, CASE WHEN typeof(value) = 'text' AND length(value) <= {_META_CHARS} "
        f"THEN value END, {_shown('value')} FROM meta "
        f"WHERE key IN ({keys}) OR key LIKE 'reference.%'")
    for key, value, shown in rows:
        valid, expect = _META.get(key, (_number, "a finite number"))
        if value is None or not valid(value):
            _refuse(path, f"meta.value of key {key!r}", shown, expect)
