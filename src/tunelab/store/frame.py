"""The runs table for analysis: :meth:`Store.runs_frame <tunelab.store.Store.runs_frame>`.

One row per run, as :mod:`tunelab.stats` and the reports read it. pandas is imported on use
only: ``tunelab run`` starts its first run sooner without it.

Two columns say under which conditions a run was made, for the statistics' pairing by round
(:mod:`tunelab.stats.blocks`): ``session``, the ``tunelab run`` invocation the run started in
(each one stores a machine snapshot before its first run and names it in the runs it starts,
``sysinfo_id``, so the snapshot's place in the order they were stored numbers it: 1, 2, …;
a run that names none — a batch job's run collected by a later controller, a store written
without a runner — is numbered by the count of snapshots taken up to its start, 0 before
any), and ``rerun``, when a run is the new run of a (point, repeat) whose run
``--rerun-disturbed`` discarded (the discarded run is deleted, so the one stored now is the
new one), the time of that discard (the meta ``discarded_runs``), else ``""``. The order of
the stored rows decides, never the wall clock alone: a clock stepped by NTP or ``date``
mid-study (a year forward: a round of one session read as split across two) moves no run
to another session. Both are read from what every store already holds: no schema change,
and stores of any version read the same.
"""

from __future__ import annotations

import json
import sqlite3
from typing import TYPE_CHECKING, Any

from tunelab.store.schema import NOISE_COLUMNS

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["read_runs_frame"]


def read_runs_frame(conn: sqlite3.Connection) -> pd.DataFrame:
    """One row per run: run columns (with ``session`` and ``rerun``: module docstring), one
    column per parameter, ``fom.<name>`` columns and ``noise.<name>`` columns.

    A parameter named like another column (a run's ``host``, ``repeat``, ``status``,
    ``point``, …) is the column ``param.<name>``: that column keeps its meaning and the
    parameter its values. The ``point`` column
    (the point's key, from which every reader labels a point) keeps the parameter's own name:
    the label reads ``host=1``."""
    import numpy as np
    import pandas as pd  # on use: ``tunelab run`` starts its first run sooner without it

    runs = pd.read_sql_query(
        "SELECT r.id AS run_id, r.point_id, p.key AS point, p.params, r.repeat, r.status, "
        "r.reason, r.rc, r.wall_s, r.started_at, r.ended_at, r.host, r.sysinfo_id "
        "FROM runs r "
        "JOIN points p ON p.id = r.point_id ORDER BY r.id",
        conn,
    )
    snapshots = conn.execute("SELECT id, taken_at FROM sysinfo ORDER BY id").fetchall()
    starts = sorted(str(taken) for _, taken in snapshots)
    by_time = np.searchsorted(np.array(starts, dtype=str),  # snapshots up to its start
                              runs["started_at"].astype(str).to_numpy(dtype=str), side="right")
    place = {int(ident): n for n, (ident, _) in enumerate(snapshots, start=1)}
    own = [place.get(int(i), 0) if pd.notna(i) else 0 for i in runs.pop("sysinfo_id")]
    runs["session"] = np.where(np.array(own, dtype=np.int64) > 0, own,
                               by_time).astype(np.int64)
    discards = _discards(conn)
    runs["rerun"] = [discards.get((key, int(rep)), "")
                     for key, rep in zip(runs["point"], runs["repeat"], strict=True)]
    params = pd.DataFrame([json.loads(p) for p in runs.pop("params")], index=runs.index)
    foms = pd.read_sql_query("SELECT run_id, name, value FROM foms", conn)
    if len(foms):
        wide = foms.pivot(index="run_id", columns="name", values="value")
        wide.columns = [f"fom.{c}" for c in wide.columns]
        wide = wide.reindex(runs["run_id"]).reset_index(drop=True)
    else:
        wide = pd.DataFrame(index=runs.index)
    # an old store opened read-only has no noise table, or only some of its columns
    have = {row[1] for row in conn.execute("PRAGMA table_info(noise)")}
    columns = ", ".join(c if c in have else f"NULL AS {c}" for c in NOISE_COLUMNS)
    query = (f"SELECT run_id, {columns} FROM noise" if have else
             f"SELECT NULL AS run_id, {columns} WHERE 0")
    noise = pd.read_sql_query(query, conn).set_index("run_id").reindex(
        runs["run_id"]).reset_index(drop=True)
    for name, kind in NOISE_COLUMNS.items():
        noise[name] = (noise[name].astype(object).where(noise[name].notna(), "")
                       if kind == "TEXT" else noise[name].astype(float))
    noise.columns = [f"noise.{c}" for c in noise.columns]
    taken = {*runs.columns, *wide.columns, *noise.columns}
    params.columns = [f"param.{c}" if c in taken else c for c in params.columns]
    return pd.concat([runs, params, wide, noise], axis=1)


def _discards(conn: sqlite3.Connection) -> dict[tuple[str, int], str]:
    """(point key, repeat) -> the time of the last discard ``--rerun-disturbed`` noted for it
    in the meta ``discarded_runs``; entries of another shape are passed over."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'discarded_runs'").fetchone()
    try:
        notes: Any = json.loads(row[0]) if row else []
    except ValueError:
        return {}
    out: dict[tuple[str, int], str] = {}
    for note in notes if isinstance(notes, list) else []:
        if not isinstance(note, dict):
            continue
        key, repeat, at = note.get("point"), note.get("repeat"), note.get("at")
        if isinstance(key, str) and type(repeat) is int and isinstance(at, str):
            out[(key, repeat)] = max(at, out.get((key, repeat), ""))
    return out
