"""Statistics over a study's runs: summaries, comparisons with confidence, the best point.

Every function here is pure: it takes the runs table of :mod:`tunelab.store` (one row per
run, columns ``point``, ``status``, ``reason``, ``fom.<name>``, ``repeat``, ``noise.*``, …)
and returns frozen records. Only runs with ``status == "ok"`` and a value of the figure of
merit count (with ``exclude_disturbed``, not those flagged disturbed either); the others
are counted per point, by status, so a report can show them.

Conventions (docs/statistics.md has the measurements behind each choice)
--------------------------------------------------------------------------
* **One test per comparison, on the log scale** (timings vary multiplicatively). The
  estimate, the interval, the p-value and the verdict of a comparison all come from that
  one test (:class:`Comparison`, ``test``): paired by round when the two points share at
  least :data:`MIN_PAIRS` rounds (the machine's drift cancels within a round), else Welch's
  t of the log ratio of means. Runs of one round made in different ``tunelab run`` sessions
  (an interrupted study, resumed), or made again by ``--rerun-disturbed``, are not paired
  (:mod:`~tunelab.stats.blocks`). ``speedup > 1`` means *B is better*.
* **The study's noise is pooled** (:mod:`~tunelab.stats.pooled`): in a study, the paired
  test takes its noise from a two-way model (point + round) fitted to every run of every
  point, unless the comparison's own runs are noisier than that (F test), so it is valid
  and powerful from 3 rounds on.
* **Verdict**, one vocabulary (:class:`Verdict`): ``better`` / ``worse`` when the (adjusted)
  p is under ``1 - confidence`` and the change is at least the noise threshold, both ways
  alike on the log scale (1.02 and 1/1.02); ``indistinguishable`` otherwise;
  ``insufficient data`` when a side has fewer than two values.
* **Many comparisons** (:func:`compare_to_baseline`): Holm's step-down over the study's
  comparisons with the baseline keeps the share of studies with *any* false verdict at
  ``1 - confidence``; ``p_adjusted`` is the p the verdict used.
* **Looking again** (``repeats: auto``, :mod:`~tunelab.stats.sequential`): rounds are added
  until each comparison is decided or the budget is spent; each look spends its level by
  the O'Brien–Fleming function, so looking again does not inflate the error.
* **Power**: every comparison carries its minimum detectable change (``detectable``): the
  smallest true change its test, at its noise, runs and adjustment, calls in 80 % of
  studies; :func:`repeats_needed` says how many repeats a change needs.
* :func:`verdict_label` turns a verdict into the word a reader expects for the figure of
  merit (``faster`` / ``slower`` for a time or a rate, else ``better`` / ``worse``).

Modules, each importing only those above it: :mod:`~tunelab.stats.results` (the records,
:class:`Verdict` and its rule, :class:`StatsError`, the constants),
:mod:`~tunelab.stats.labels`, :mod:`~tunelab.stats.blocks` (which runs of a round may be
paired: a round split across sessions, runs made again), :mod:`~tunelab.stats.summaries`
(the runs table by point),
:mod:`~tunelab.stats.power` (detectable change, repeats needed),
:mod:`~tunelab.stats.intervals` (the paired and Welch tests, :func:`compare`),
:mod:`~tunelab.stats.pooled` (the study's pooled noise, :func:`noise_level`),
:mod:`~tunelab.stats.sequential` (Holm, spending, :class:`SequentialPlan`),
:mod:`~tunelab.stats.multiplicity` (:func:`compare_to_baseline`),
:mod:`~tunelab.stats.winner` (:func:`best`) and :mod:`~tunelab.stats.disturbance`
(what the noise watch recorded, for the whole study).
"""

from __future__ import annotations

# The constants are re-exported (``X as X``) without joining ``__all__``.
from tunelab.stats.blocks import PairingBreak, pairing_breaks
from tunelab.stats.disturbance import Disturbance, disturbance
from tunelab.stats.intervals import compare, comparison_at_level, paired_interval
from tunelab.stats.labels import verdict_label
from tunelab.stats.multiplicity import compare_to_baseline, still_undecided
from tunelab.stats.pooled import noise_level
from tunelab.stats.power import detectable_change, repeats_needed
from tunelab.stats.recommend import Posterior, Recommendation, posterior, recommend
from tunelab.stats.results import DIRECTIONS as DIRECTIONS
from tunelab.stats.results import MAX_REPEATS_HINT as MAX_REPEATS_HINT
from tunelab.stats.results import MIN_PAIRS as MIN_PAIRS
from tunelab.stats.results import POWER as POWER
from tunelab.stats.results import TEST_WELCH_DIFF as TEST_WELCH_DIFF
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
from tunelab.stats.sequential import (
    SequentialPlan,
    holm_adjust,
    holm_family,
    holm_levels,
    spending_levels,
)
from tunelab.stats.summaries import DISTURBED_COLUMN as DISTURBED_COLUMN
from tunelab.stats.summaries import fom_column, summarize
from tunelab.stats.winner import best

__all__ = [
    "BestResult",
    "Comparison",
    "Disturbance",
    "NoiseLevel",
    "PairedInterval",
    "PairingBreak",
    "PointComparison",
    "PointSummary",
    "SequentialPlan",
    "Posterior",
    "Recommendation",
    "StatsError",
    "Verdict",
    "best",
    "compare",
    "comparison_at_level",
    "compare_to_baseline",
    "detectable_change",
    "disturbance",
    "fom_column",
    "holm_adjust",
    "holm_family",
    "holm_levels",
    "noise_level",
    "paired_interval",
    "pairing_breaks",
    "posterior",
    "recommend",
    "repeats_needed",
    "spending_levels",
    "still_undecided",
    "summarize",
    "verdict_label",
]
