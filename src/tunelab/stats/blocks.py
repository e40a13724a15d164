"""Which runs may be paired: the blocks of a round, and the rounds that were broken up.

The paired tests compare two points within a round (the repeat index): each round runs every
point once, side by side in a shuffled order, so the machine's drift between rounds cancels
in the pair. Two things break that premise, and the runs table says when (the store's
``session`` and ``rerun`` columns, :mod:`tunelab.store.frame`):

* a round **split across sessions**: the study was interrupted in the middle of a round
  (Ctrl-C, a kill, a batch allocation that ended) and resumed later — hours or days, maybe a
  reboot, a busier or quieter machine — so the round's runs before the break and after it
  were not made side by side;
* a run **made again** by ``--rerun-disturbed``, after the study's rounds, in place of its
  round's disturbed run.

A **block** is the runs of one round made under the same conditions: the same round, the
same ``tunelab run`` session, and the same rerun pass (none, or the time of the discard).
Runs are paired only within a block (:func:`pairing_blocks`); a round of one block pairs as
before, so a study never interrupted and never rerun is judged exactly as it was.
:func:`pairing_breaks` describes each round of more than one block, for the notes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["PairingBreak", "pairing_blocks", "pairing_breaks"]

SESSION_COLUMN = "session"
"""Runs-table column: the ``tunelab run`` session a run started in (a number)."""
RERUN_COLUMN = "rerun"
"""Runs-table column: for a run made again by ``--rerun-disturbed``, when its earlier run was
discarded (text; empty for any other run)."""


@dataclass(frozen=True)
class PairingBreak:
    """One round whose runs were not all made side by side: ``sessions`` is how many
    ``tunelab run`` sessions made them (1: not split), ``apart_s`` the longest pause
    between two of them within the round (NaN: unknown or not split), ``reruns`` how many of
    its runs ``--rerun-disturbed`` made again later."""

    round: int
    sessions: int
    apart_s: float
    reruns: int

    @property
    def split(self) -> bool:
        """Whether the round was split across sessions."""
        return self.sessions > 1


def _conditions(runs: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The session (a number, -1 unknown) and rerun pass ("" none) of every row."""
    import pandas as pd

    n = len(runs)
    session = (pd.to_numeric(runs[SESSION_COLUMN], errors="coerce").to_numpy(dtype=float)
               if SESSION_COLUMN in runs.columns else np.zeros(n))
    session = np.where(np.isfinite(session), session, -1.0)
    rerun = (runs[RERUN_COLUMN].fillna("").astype(str).to_numpy() if RERUN_COLUMN in
             runs.columns else np.full(n, "", dtype=object))
    return session, rerun


def pairing_blocks(runs: pd.DataFrame) -> np.ndarray | None:
    """Per row of ``runs``, the block (module docstring) it pairs in, as an integer that
    orders blocks by round: the round itself where no round has more than one block (so the
    tests see exactly the repeat indices), else a number per (round, session, rerun pass).
    None when the table has no ``repeat`` column."""
    if "repeat" not in runs.columns:
        return None
    repeats = runs["repeat"].to_numpy()
    session, rerun = _conditions(runs)
    keys = list(zip(repeats.tolist(), session.tolist(), rerun.tolist(), strict=True))
    per_round: dict[object, set[tuple[float, str]]] = {}
    for r, s, again in keys:
        per_round.setdefault(r, set()).add((s, again))
    if all(len(v) == 1 for v in per_round.values()):
        return repeats
    number = {key: i for i, key in enumerate(sorted(set(keys)))}
    return np.array([number[k] for k in keys], dtype=np.int64)


def pairing_breaks(runs: pd.DataFrame, column: str | None = None) -> tuple[PairingBreak, ...]:
    """The rounds of ``runs`` (their ok runs with a finite ``column``, the ``fom.<name>``
    of the figure of merit; all ok runs without one) that are more than one block, in
    order: empty for a study never interrupted in a round and never rerun."""
    if "repeat" not in runs.columns or not len(runs):
        return ()
    keep = np.ones(len(runs), dtype=bool)
    if "status" in runs.columns:
        keep &= (runs["status"].astype(str) == "ok").to_numpy()
    if column is not None and column in runs.columns:
        keep &= np.isfinite(runs[column].to_numpy(dtype=float))
    rows = runs[keep]
    session, rerun = _conditions(rows)
    repeats = rows["repeat"].to_numpy()
    out = []
    for r in sorted(set(repeats.tolist())):
        here = repeats == r
        if len(set(zip(session[here].tolist(), rerun[here].tolist(), strict=True))) < 2:
            continue  # one block: paired as ever
        own = here & (rerun == "")  # the round's own runs, not those made again
        sessions = int(np.unique(session[own]).size)
        apart = _longest_pause(rows[own], session[own]) if sessions > 1 else math.nan
        out.append(PairingBreak(int(r), sessions, apart, int(np.sum(here & (rerun != "")))))
    return tuple(out)


def _longest_pause(rows: pd.DataFrame, session: np.ndarray) -> float:
    """Seconds from the last end of one session's runs to the first start of the next's
    (the longest such pause); NaN when the times cannot be read."""
    if "started_at" not in rows.columns or "ended_at" not in rows.columns:
        return math.nan
    starts = np.array([_seconds(v) for v in rows["started_at"]])
    ends = np.array([_seconds(v) for v in rows["ended_at"]])
    order = sorted(set(session.tolist()))
    gaps = []
    for earlier, later in zip(order, order[1:], strict=False):
        a, b = ends[session == earlier], starts[session == later]
        if np.isfinite(a).any() and np.isfinite(b).any():
            gaps.append(max(float(np.nanmin(b) - np.nanmax(a)), 0.0))
    return max(gaps, default=math.nan)


def _seconds(value: object) -> float:
    """An ISO 8601 time as seconds since the epoch; NaN for anything else."""
    try:
        when = datetime.fromisoformat(str(value))
        if when.tzinfo is None:
            return math.nan  # tunelab writes UTC with its offset; a bare time is not its own
        return when.timestamp()
    except (ValueError, OverflowError):  # not a time; or one before the year 1 in UTC
        return math.nan
