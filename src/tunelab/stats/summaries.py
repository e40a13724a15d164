"""The runs table grouped by point, and the descriptive statistics of each point.

Reads the runs table of :mod:`tunelab.store` (columns ``point``, ``status``, ``fom.<name>``,
optionally ``repeat`` and :data:`DISTURBED_COLUMN`): :func:`check_runs` validates it,
:func:`point_groups` splits it into each point's successful values, rounds (and the blocks
they pair in) and failure counts, :func:`point_summary` and :func:`summarize` describe them,
:func:`sort_key` ranks summaries best first.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from tunelab.stats.blocks import pairing_blocks
from tunelab.stats.results import PointSummary, StatsError

if TYPE_CHECKING:
    import pandas as pd

DISTURBED_COLUMN = "noise.disturbed"
"""Runs-table column flagging runs whose cores others took (see :mod:`tunelab.noise`)."""

_FAILED_NO_VALUE = "missing"
"""Status key under which ``ok`` runs without a value of the figure of merit are counted."""


def fom_column(fom: str) -> str:
    """Column of the runs table holding figure of merit ``fom`` (``wall_s`` -> ``fom.wall_s``)."""
    return fom if fom.startswith("fom.") else f"fom.{fom}"


def check_runs(runs: pd.DataFrame, fom: str) -> str:
    """The column of ``fom`` in ``runs``; raises :class:`StatsError` when the table lacks it
    (naming the figures of merit it has) or lacks ``point`` / ``status``."""
    column = fom_column(fom)
    missing = [c for c in ("point", "status") if c not in runs.columns]
    if missing:
        raise StatsError(f"runs table lacks column(s) {', '.join(missing)}")
    if column not in runs.columns:
        have = sorted(c.removeprefix("fom.") for c in runs.columns if c.startswith("fom."))
        raise StatsError(
            f"no figure of merit {column.removeprefix('fom.')!r} in the runs; "
            f"available: {', '.join(have) or 'none'}"
        )
    return column


def point_params(point: str) -> dict[str, Any]:
    """The parameters of a point from its JSON key; raises :class:`StatsError` when the key
    is not a JSON object."""
    try:
        params = json.loads(point)
    except (TypeError, ValueError) as exc:
        raise StatsError(f"point key is not JSON: {point!r}") from exc
    if not isinstance(params, dict):
        raise StatsError(f"point key is not a JSON object: {point!r}")
    return params


class Group(NamedTuple):
    """One point's runs: ok values (finite), their rounds (repeat index, or None when the
    table has no ``repeat`` column), not-ok counts by status, disturbed ok runs, how
    many of those were left out of ``values``, and the block each value pairs in (the
    round made under one set of conditions, :func:`~tunelab.stats.blocks.pairing_blocks`;
    None: its round)."""

    values: np.ndarray
    rounds: np.ndarray | None
    failed: dict[str, int]
    disturbed: int
    left_out: int = 0
    blocks: np.ndarray | None = None

    @property
    def pairs_by(self) -> np.ndarray | None:
        """What the paired tests pair on: the blocks, else the rounds."""
        return self.blocks if self.blocks is not None else self.rounds


def point_groups(runs: pd.DataFrame, column: str, *,
                 exclude_disturbed: bool = False) -> dict[str, Group]:
    """Per point key, in order of first run: its :class:`Group`. With
    ``exclude_disturbed`` the ok runs flagged disturbed are left out of the values (and
    counted in ``left_out``)."""
    out: dict[str, Group] = {}
    points = runs["point"].astype(str).to_numpy()
    statuses = runs["status"].astype(str).to_numpy()
    values = runs[column].to_numpy(dtype=float)
    repeats = runs["repeat"].to_numpy() if "repeat" in runs.columns else None
    blocks = pairing_blocks(runs)
    flags = (runs[DISTURBED_COLUMN].fillna(0).to_numpy(dtype=float) > 0
             if DISTURBED_COLUMN in runs.columns else np.zeros(len(runs), dtype=bool))
    order: dict[str, list[int]] = {}
    for i, point in enumerate(points):
        order.setdefault(point, []).append(i)
    for point, index in order.items():
        idx = np.asarray(index)
        ok = statuses[idx] == "ok"
        ok_values = values[idx][ok]
        failed: dict[str, int] = {}
        for status in statuses[idx][~ok]:
            failed[status] = failed.get(status, 0) + 1
        finite = np.isfinite(ok_values)
        n_missing = int((~finite).sum())
        if n_missing:
            failed[_FAILED_NO_VALUE] = n_missing
        flagged = flags[idx][ok][finite]
        keep = ~flagged if exclude_disturbed else np.ones(flagged.size, dtype=bool)
        rounds = paired = None
        if repeats is not None and blocks is not None:
            rounds = np.asarray(repeats[idx][ok][finite][keep], dtype=np.int64)
            paired = np.asarray(blocks[idx][ok][finite][keep], dtype=np.int64)
        out[point] = Group(ok_values[finite][keep], rounds, dict(sorted(failed.items())),
                           int(flagged.sum()), int((~keep).sum()), paired)
    return out


def point_summary(point: str, group: Group) -> PointSummary:
    """The :class:`PointSummary` of one point's :class:`Group`."""
    values, failed = group.values, group.failed
    n = int(values.size)
    if n == 0:
        nan = math.nan
        return PointSummary(point, point_params(point), 0, nan, nan, nan, nan, nan, failed,
                            group.disturbed, group.left_out)
    return PointSummary(
        point=point,
        params=point_params(point),
        n=n,
        mean=float(np.mean(values)),
        median=float(np.median(values)),
        std=float(np.std(values, ddof=1)) if n > 1 else math.nan,
        min=float(np.min(values)),
        max=float(np.max(values)),
        failed=failed,
        disturbed=group.disturbed,
        left_out=group.left_out,
    )


def sort_key(summary: PointSummary, direction: str) -> tuple[int, float, str]:
    """Best first; points without values last; ties broken by the point key."""
    if summary.n == 0:
        return (1, 0.0, summary.point)
    mean = summary.mean if direction == "minimize" else -summary.mean
    return (0, mean, summary.point)


def summarize(runs: pd.DataFrame, fom: str, *,
              exclude_disturbed: bool = False) -> list[PointSummary]:
    """Summarise every point of ``runs`` for figure of merit ``fom``, in order of first run.

    Points whose runs all failed are included with ``n == 0`` and their failure counts.
    With ``exclude_disturbed`` runs flagged disturbed are left out (and counted).
    Raises :class:`StatsError` when the table lacks the figure of merit.
    """
    column = check_runs(runs, fom)
    groups = point_groups(runs, column, exclude_disturbed=exclude_disturbed)
    return [point_summary(p, g) for p, g in groups.items()]
