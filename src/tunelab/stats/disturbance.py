"""What the noise watch recorded over a whole study: how many runs others disturbed, how
much of their cores others took, and whether the machine was busy from the start.

Read from the runs table's ``noise.*`` columns (see :mod:`tunelab.noise` and the store's
``noise`` table); views show it, never recompute it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tunelab.stats.summaries import DISTURBED_COLUMN

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["FROM_START_RUNS", "Disturbance", "disturbance"]

FROM_START_RUNS = 3
"""The machine counts as busy from the start when the study's first this many watched runs
(or all, if fewer) were all disturbed."""

_SHARE = "noise.others_share"
_EVIDENCE = "noise.evidence"
_SHARED = "noise.shared_with"


@dataclass(frozen=True)
class Disturbance:
    """The study's runs as the noise watch saw them.

    ``watched``: runs with a noise sample; ``disturbed``: those flagged; ``others_median``
    and ``others_max``: the share of their cores others took (NaN where not measured);
    ``from_start``: the first :data:`FROM_START_RUNS` watched runs were all disturbed (the
    machine was busy when the study began); ``evidence``: up to three distinct reasons
    recorded with flagged runs; ``left_out``: disturbed runs left out of the verdicts."""

    watched: int
    disturbed: int
    others_median: float
    others_max: float
    from_start: bool
    evidence: tuple[str, ...]
    left_out: int = 0
    shared_nodes: int = 0
    """Runs of batch jobs that had other jobs on their nodes (``noise.shared_with``)."""

    @property
    def share(self) -> float:
        """Share of watched runs flagged disturbed (0 without any)."""
        return self.disturbed / self.watched if self.watched else 0.0


def disturbance(runs: pd.DataFrame, *, left_out: bool = False) -> Disturbance | None:
    """The :class:`Disturbance` of ``runs`` (None when no run carries a noise sample);
    ``left_out`` says the disturbed ok runs were left out of the verdicts."""
    if DISTURBED_COLUMN not in runs.columns or not len(runs):
        return None
    order = runs.sort_values("run_id") if "run_id" in runs.columns else runs
    flags = order[DISTURBED_COLUMN].to_numpy(dtype=float)
    watched = ~np.isnan(flags)
    if not watched.any():
        return None
    flagged = flags[watched] > 0
    shares = (order[_SHARE].to_numpy(dtype=float)[watched] if _SHARE in order.columns
              else np.full(int(watched.sum()), math.nan))
    finite = shares[np.isfinite(shares)]
    first = flagged[:FROM_START_RUNS]
    evidence: list[str] = []
    if _EVIDENCE in order.columns:
        for text in order[_EVIDENCE].astype(str).to_numpy()[watched][flagged]:
            if text and text not in evidence and text != "nan":
                evidence.append(text)
            if len(evidence) == 3:
                break
    n_left = 0
    if left_out and "status" in order.columns:
        n_left = int(((order["status"] == "ok").to_numpy() & (np.nan_to_num(flags) > 0)).sum())
    shared = 0
    if _SHARED in order.columns:
        shared = int(sum(bool(t) and t != "nan"
                         for t in order[_SHARED].astype(str).to_numpy()[watched]))
    return Disturbance(
        watched=int(watched.sum()), disturbed=int(flagged.sum()),
        others_median=float(np.median(finite)) if finite.size else math.nan,
        others_max=float(np.max(finite)) if finite.size else math.nan,
        from_start=bool(first.size and first.all()), evidence=tuple(evidence),
        left_out=n_left, shared_nodes=shared)
