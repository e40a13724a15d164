"""Statistics over a study's runs: summaries, comparisons with confidence, the best point.

Every function here is pure: it takes the runs table of :mod:`tunelab.store` (one row per
run, columns ``point``, ``status``, ``reason``, ``fom.<name>``, …) and returns frozen
records. Only runs with ``status == "ok"`` and a value of the figure of merit count; the
others are counted per point, by status, so a report can show them.

Conventions
-----------
* **Speedup** of B over A is the ratio of means oriented so that ``> 1`` means *B is
  better*: ``mean(A) / mean(B)`` when the objective is minimised (a time),
  ``mean(B) / mean(A)`` when it is maximised (a throughput). Ratios need positive means.
* **Confidence interval**: the hull (the wider ends) of two intervals of that ratio:
  ``scipy.stats.bootstrap`` on the two independent samples (BCa; percentile when BCa
  degenerates, e.g. for constant samples), and the Welch t interval of
  ``log mean(A) - log mean(B)`` (delta method). With 3–10 repeats the bootstrap alone
  under-covers: it called two samples of the *same* distribution different in 8–19 % of
  trials (3–5 % noise, 300 seeded trials per case); the hull does so in 2.5–5 %, the nominal
  rate, while still finding a real 10 % change at n = 3 (power 0.4–0.8) — see
  ``docs/statistics.md``.
* **p-value**: ``scipy.stats.mannwhitneyu``, two-sided, reported beside the interval (it
  cannot go below 0.1 with 3 against 3 runs, so it does not gate the verdict).
* **Verdict**, one vocabulary (:class:`Verdict`): ``better`` / ``worse`` when the interval
  excludes 1 and the change is at least the noise threshold (default 2 %);
  ``indistinguishable`` otherwise; ``insufficient data`` when a side has fewer than two
  values.
* **Paired by round**: when both points were run round by round (the ``repeat`` column) and
  every run of the point with fewer runs has a partner of the same round (at least
  :data:`MIN_PAIRS` pairs), the log ratio is taken within each round and the Student t
  interval of its mean over rounds gives the paired interval: slow drift of the machine,
  which the interleaved design spreads over all points, cancels within a round. The paired
  interval is reported beside the unpaired one and then decides the verdict.
* **Multiple comparisons**: :func:`compare_to_baseline` compares k points with one
  baseline; the p-values of the tests behind the verdicts (paired t, or the Welch t of the
  log ratio) are adjusted with Benjamini–Hochberg (``scipy.stats.false_discovery_control``),
  and a verdict of better / worse also needs an adjusted p under ``1 - confidence``, which
  keeps the false discovery rate at 5 %.
* **Power hint**: :func:`repeats_needed` — from the observed noise, the repeats per point a
  given change (5 %) needs to be seen in 80 % of studies.
* :func:`verdict_label` turns a verdict into the word a reader expects for the figure of
  merit (``faster`` / ``slower`` for a time or a rate, else ``better`` / ``worse``).

Modules, each importing only those above it: :mod:`~tunelab.stats.results` (the records,
:class:`Verdict` and its rule, :class:`StatsError`, the constants),
:mod:`~tunelab.stats.labels` (words for readers), :mod:`~tunelab.stats.summaries` (the runs
table by point, :func:`summarize`), :mod:`~tunelab.stats.power` (:func:`repeats_needed`,
:func:`noise_level`), :mod:`~tunelab.stats.intervals` (bootstrap, Welch and paired
intervals, :func:`compare`), :mod:`~tunelab.stats.multiplicity` (:func:`compare_to_baseline`,
Benjamini–Hochberg) and :mod:`~tunelab.stats.winner` (:func:`best`).
"""

from __future__ import annotations

# The constants are re-exported (``X as X``) without joining ``__all__``, as before the split.
from tunelab.stats.intervals import compare, paired_interval
from tunelab.stats.labels import verdict_label
from tunelab.stats.multiplicity import adjust_for_multiple_comparisons, compare_to_baseline
from tunelab.stats.power import noise_level, repeats_needed
from tunelab.stats.recommend import Posterior, Recommendation, posterior, recommend
from tunelab.stats.results import DEFAULT_RESAMPLES as DEFAULT_RESAMPLES
from tunelab.stats.results import DIRECTIONS as DIRECTIONS
from tunelab.stats.results import MAX_REPEATS_HINT as MAX_REPEATS_HINT
from tunelab.stats.results import MIN_PAIRS as MIN_PAIRS
from tunelab.stats.results import (
    BestResult,
    Comparison,
    NoiseLevel,
    PairedInterval,
    PointComparison,
    PointSummary,
    StatsError,
    Verdict,
)
from tunelab.stats.summaries import DISTURBED_COLUMN as DISTURBED_COLUMN
from tunelab.stats.summaries import fom_column, summarize
from tunelab.stats.winner import best

__all__ = [
    "BestResult",
    "Comparison",
    "NoiseLevel",
    "PairedInterval",
    "PointComparison",
    "PointSummary",
    "Posterior",
    "Recommendation",
    "StatsError",
    "Verdict",
    "adjust_for_multiple_comparisons",
    "best",
    "compare",
    "compare_to_baseline",
    "fom_column",
    "noise_level",
    "paired_interval",
    "posterior",
    "recommend",
    "repeats_needed",
    "summarize",
    "verdict_label",
]
