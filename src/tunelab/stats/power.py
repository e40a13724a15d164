"""The power hint: how many repeats a change needs to be seen, and a study's run-to-run noise.

:func:`repeats_needed` inverts the noncentral t power of a two-sided t test (unpaired or
paired); :func:`noise_level` pools the within-point noise of a study and gives the hint.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from tunelab.stats.results import MAX_REPEATS_HINT, NoiseLevel
from tunelab.stats.summaries import check_runs, point_groups

if TYPE_CHECKING:
    import pandas as pd


def repeats_needed(sd_log: float, change: float = 0.05, *, power: float = 0.8,
                   confidence: float = 0.95, paired: bool = False) -> int | None:
    """Repeats per point for a true ``change`` (0.05 = 5 %) to give a verdict with
    probability ``power``, for run-to-run noise ``sd_log`` (sd of the log figure of merit, ≈
    relative sd; for ``paired``: of the per-round log ratio). Two-sided t test at
    ``confidence``, noncentral t power. None when more than :data:`MAX_REPEATS_HINT`, or
    ``sd_log`` is not a finite number."""
    from scipy import stats

    if not (math.isfinite(sd_log) and sd_log >= 0) or change <= 0:
        return None
    if sd_log == 0:
        return 2
    delta = math.log1p(change)
    k = 1.0 if paired else 2.0
    z = stats.norm.ppf(0.5 + confidence / 2) + stats.norm.ppf(power)
    n = max(2, math.ceil(k * (z * sd_log / delta) ** 2) - 1)
    while n <= MAX_REPEATS_HINT:
        df = n - 1 if paired else 2 * n - 2
        shift = delta / (sd_log * math.sqrt(k / n))
        crit = stats.t.ppf(0.5 + confidence / 2, df)
        if stats.nct.sf(crit, df, shift) + stats.nct.cdf(-crit, df, shift) >= power:
            return n
        n += 1 if n < 100 else max(1, n // 50)
    return None


def noise_level(runs: pd.DataFrame, fom: str, change: float = 0.05,
                confidence: float = 0.95) -> NoiseLevel | None:
    """The study's run-to-run noise and its power hint (see :class:`NoiseLevel`); None
    when no point has two successful positive values."""
    column = check_runs(runs, fom)
    ss, df = 0.0, 0
    for group in point_groups(runs, column).values():
        v = group.values[group.values > 0]
        if v.size >= 2:
            logs = np.log(v)
            ss += float(((logs - logs.mean()) ** 2).sum())
            df += v.size - 1
    if df == 0:
        return None
    sd = math.sqrt(ss / df)
    return NoiseLevel(sd, df, change, repeats_needed(sd, change, confidence=confidence))
