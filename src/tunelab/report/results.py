"""A study's results, computed once from its runs: what ``tunelab compare|best|report`` show.

:func:`results_from_frame` is the pure step (runs table + objective + baseline in, frozen
:class:`StudyResults` out); :func:`tunelab.report.load.load_results` reads them from a study
directory's store.
The bottom of the report package: views (:mod:`tunelab.report.views`) and renderers build on
it; :func:`tunelab.report.writer.write_report` draws the plots and writes the HTML file.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from tunelab.report.formats import detectable_text, fmt_number, point_label
from tunelab.stats import (
    TEST_WELCH_DIFF,
    BestResult,
    Disturbance,
    NoiseLevel,
    PairingBreak,
    PointComparison,
    PointSummary,
    SequentialPlan,
    StatsError,
    Verdict,
    best,
    compare_to_baseline,
    disturbance,
    fom_column,
    noise_level,
    pairing_breaks,
    summarize,
    verdict_label,
)
from tunelab.workload import Objective

if TYPE_CHECKING:
    import pandas as pd


__all__ = [
    "Exclusion",
    "FailedRun",
    "StudyResults",
    "busy_line",
    "exclusions_from_frame",
    "failed_runs",
    "pairing_line",
    "results_from_frame",
]


class FailedRun(NamedTuple):
    """A run that was not ok, as the report lists it."""

    run_id: str
    point: str
    repeat: str
    status: str
    rc: str
    reason: str


@dataclass(frozen=True)
class Exclusion:
    """A point whose runs a physics check (an invariant) marked ``invalid``.

    ``value`` is the mean of the objective over those runs (NaN without one); ``leading``
    is True when the point has no valid run and that mean beats every valid point, i.e. the
    point would have been the best; ``line`` says it in one sentence, e.g. ``np=2 npool=1:
    fastest (pwscf_wall_s 6.2 s), but excluded: total_energy_ry differs by 2.4e-05 > 1e-05
    from the study's reference (…)``.
    """

    point: str
    params: dict[str, Any]
    n_invalid: int
    n_runs: int
    value: float
    reason: str
    leading: bool
    line: str


@dataclass(frozen=True)
class StudyResults:
    """Everything the tables and reports of one study need.

    ``comparisons`` is empty when the study has no baseline or the baseline has no
    successful run (``notes`` then says why); ``summaries`` always lists every point, also
    when no run succeeded; ``failures`` lists every run that was not ok (failed, timeout,
    invalid) with its reason, ``exclusions`` every point a physics check excluded.
    ``noise`` is the study's run-to-run noise with its power hint and the median minimum
    detectable change (None without two runs of a point); ``disturbance`` is what the noise
    watch recorded (None for runs without a sample); ``exclude_disturbed`` says whether runs
    flagged disturbed were left out of every statistic; ``plan`` is the ``repeats: auto``
    plan whose looks decided the verdicts (None: fixed repeats). ``notes`` also say how the
    verdicts were decided (test, adjustment), how busy the machine was, and what the study
    could have detected.
    """

    name: str
    objective: Objective
    baseline: str | None
    runs: pd.DataFrame = field(repr=False)
    summaries: tuple[PointSummary, ...]
    comparisons: tuple[PointComparison, ...]
    notes: tuple[str, ...] = ()
    spec: Mapping[str, Any] = field(default_factory=dict, repr=False)
    sysinfo: Mapping[str, Any] = field(default_factory=dict, repr=False)
    noise_threshold: float = 0.02
    confidence: float = 0.95
    directory: Path | None = None
    noise: NoiseLevel | None = None
    trust: tuple[str, ...] = ()
    """The notes on how far the verdicts can be trusted (also in ``notes``): the machine's
    load, the test and its adjustment, the minimum detectable change and the power hint."""
    disturbance: Disturbance | None = None
    exclude_disturbed: bool = False
    plan: SequentialPlan | None = None
    spec_yaml: str = ""
    study_file: str = ""
    failures: tuple[FailedRun, ...] = ()
    exclusions: tuple[Exclusion, ...] = ()
    fom_units: Mapping[str, str] = field(default_factory=dict, repr=False)
    """The unit of each figure of merit the workload declared (``throughput``: ``B/s``)."""
    unpaired: tuple[PairingBreak, ...] = ()
    """The rounds whose runs were not all made side by side (split across ``tunelab run``
    sessions, or with runs made again by ``--rerun-disturbed``): paired only within each of
    their blocks (:mod:`tunelab.stats.blocks`); ``trust`` says so in one sentence."""

    @property
    def has_failures(self) -> bool:
        """True when some run of the study was not ok."""
        return bool(self.failures)

    def best_result(self) -> BestResult:
        """The best point and its runner-up (raises :class:`StatsError` without a
        successful run)."""
        return best(
            self.runs,
            self.objective.fom,
            self.objective.direction,
            noise_threshold=self.noise_threshold,
            confidence=self.confidence,
            exclude_disturbed=self.exclude_disturbed,
        )


def results_from_frame(
    runs: pd.DataFrame,
    objective: Objective,
    baseline: str | None = None,
    *,
    name: str = "study",
    spec: Mapping[str, Any] | None = None,
    sysinfo: Mapping[str, Any] | None = None,
    noise_threshold: float = 0.02,
    confidence: float = 0.95,
    directory: Path | None = None,
    spec_yaml: str = "",
    study_file: str = "",
    exclude_disturbed: bool = False,
    plan: SequentialPlan | None = None,
    planned: int = 0,
    fom_units: Mapping[str, str] | None = None,
) -> StudyResults:
    """Summaries of every point and, with a baseline, every point compared with it.

    A baseline without successful runs, or a figure of merit whose ratio is meaningless
    (non-positive mean), becomes a note rather than an error; an unknown figure of merit
    raises :class:`StatsError`. ``exclude_disturbed`` leaves runs flagged disturbed out of
    every statistic; ``plan`` decides the verdicts look by look (``repeats: auto``).
    ``planned`` is the number of runs the study makes (0: not known in advance, as for an
    adaptive search): fewer stored runs add a first note that the study is not finished.
    ``fom_units`` are the workload's units of its figures of merit.
    """
    notes: list[str] = []
    column = fom_column(objective.fom)
    if len(runs) and column not in runs.columns:  # no run produced it: every run failed
        runs = runs.assign(**{column: math.nan})
    summaries = (tuple(summarize(runs, objective.fom, exclude_disturbed=exclude_disturbed))
                 if len(runs) else ())
    comparisons: tuple[PointComparison, ...] = ()
    if not len(runs):
        notes.append("No runs yet.")
    elif baseline:
        try:
            comparisons = tuple(
                compare_to_baseline(
                    runs,
                    objective.fom,
                    objective.direction,
                    baseline,
                    noise_threshold=noise_threshold,
                    confidence=confidence,
                    plan=plan,
                    exclude_disturbed=exclude_disturbed,
                )
            )
        except StatsError as exc:
            notes.append(f"No comparison with the baseline: {exc}.")
    else:
        notes.append("The study names no baseline: points are ranked by mean only.")
    noise = None
    if len(runs):
        others = [pc.comparison for pc in comparisons if not pc.is_baseline]
        detectable = [c.detectable for c in others if math.isfinite(c.detectable)]
        try:
            noise = noise_level(runs, objective.fom, confidence=confidence,
                                comparisons=max(1, len(others)),
                                detectable=(statistics.median(detectable) if detectable
                                            else math.nan),
                                exclude_disturbed=exclude_disturbed)
        except StatsError:
            noise = None
    watched = disturbance(runs, left_out=exclude_disturbed) if len(runs) else None
    trust = _trust_notes(comparisons, summaries, noise, watched, plan,
                         objective.fom.removeprefix('fom.'))
    unpaired = pairing_breaks(runs, column) if len(runs) else ()
    if unpaired:  # after the machine's load: it says why the pairs below are fewer
        trust.insert(1 if watched is not None and watched.disturbed else 0,
                     pairing_line(unpaired))
    unfinished = _unfinished_line(runs, planned)
    if unfinished:
        trust.insert(0, unfinished)
    launcher = (spec or {}).get("launcher")
    if isinstance(launcher, dict) and launcher.get("isolation") == "shared":
        shared = watched.shared_nodes if watched is not None else 0
        trust.insert(0, "Isolation: the study let its jobs share nodes with other jobs "
                        f"(launcher isolation: shared); {shared} run(s) did, and were flagged.")
    notes.extend(trust)
    if summaries and all(s.n == 0 for s in summaries):
        left = sum(s.left_out for s in summaries)
        notes.append(f"No run left to judge: the {left} ok runs were disturbed and are left "
                     "out (--exclude-disturbed)." if left else
                     f"No run produced {objective.fom.removeprefix('fom.')}: "
                     f"{len(runs)} runs, none ok (see the failures).")
    return StudyResults(
        name=name,
        objective=objective,
        baseline=baseline or None,
        runs=runs,
        summaries=summaries,
        comparisons=comparisons,
        notes=tuple(notes),
        spec=dict(spec or {}),
        sysinfo=dict(sysinfo or {}),
        noise_threshold=noise_threshold,
        confidence=confidence,
        directory=directory,
        noise=noise,
        trust=tuple(trust),
        spec_yaml=spec_yaml,
        study_file=study_file,
        failures=tuple(failed_runs(runs)),
        exclusions=tuple(exclusions_from_frame(runs, objective, summaries)),
        disturbance=watched,
        exclude_disturbed=exclude_disturbed,
        plan=plan,
        fom_units=dict(fom_units or {}),
        unpaired=unpaired,
    )


def pairing_line(breaks: tuple[PairingBreak, ...]) -> str:
    """The one sentence on the rounds that are not paired as a whole: "Round r2 was split
    across 2 'tunelab run' sessions (2.0 days apart): runs of different sessions are not
    paired." and/or how many runs ``--rerun-disturbed`` made again."""
    parts = []
    split = [b for b in breaks if b.split]
    if split:
        pauses = [b.apart_s for b in split if math.isfinite(b.apart_s)]
        apart = (f" ({'up to ' if len(pauses) > 1 else ''}{_duration(max(pauses))} apart)"
                 if pauses else "")
        sessions = (f"{split[0].sessions} 'tunelab run' sessions" if len(split) == 1
                    else "'tunelab run' sessions")
        parts.append(f"{_rounds(split).capitalize()} {'was' if len(split) == 1 else 'were'} "
                     f"split across {sessions}{apart}: runs of different sessions are not "
                     "paired")
    again = [b for b in breaks if b.reruns]
    if again:
        n = sum(b.reruns for b in again)
        whose = ("their rounds" if len(again) > 1 else "their round" if n > 1
                 else "its round")
        parts.append(f"{'the' if parts else 'The'} {n} run{'s' if n > 1 else ''} made again "
                     f"by --rerun-disturbed ({_rounds(again)}) {'are' if n > 1 else 'is'} "
                     f"not paired with the other runs of {whose}")
    return "; ".join(parts) + "."


def _rounds(breaks: list[PairingBreak]) -> str:
    """``round r2`` or ``rounds r2, r5, …`` (the repeat index, as run directories name it)."""
    names = ", ".join(f"r{b.round}" for b in breaks[:5]) + (", …" if len(breaks) > 5 else "")
    return f"round {names}" if len(breaks) == 1 else f"rounds {names}"


def _duration(seconds: float) -> str:
    """A pause in the unit that reads best: ``40 s``, ``12 min``, ``5.5 h``, ``2.0 days``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _trust_notes(comparisons: tuple[PointComparison, ...], summaries: tuple[PointSummary, ...],
                noise: NoiseLevel | None, watched: Disturbance | None,
                plan: SequentialPlan | None, fom: str = "the figure of merit") -> list[str]:
    """Sentences on how far the verdicts can be trusted: the machine's load (first: a busy
    machine makes every other line moot), the test and its adjustment, what the study
    could have detected, and, for ``repeats: auto``, what is still undecided."""
    notes: list[str] = []
    if watched is not None and watched.disturbed:
        notes.append(busy_line(watched))
    others = [pc for pc in comparisons if not pc.is_baseline]
    tested = [pc.comparison for pc in others if not math.isnan(pc.comparison.p_adjusted)]
    if tested:
        tests = sorted({c.test for c in tested})
        adjustment = tested[0].adjustment
        conf = tested[0].confidence
        how = {"none": "nothing (one comparison)",
               "Holm": f"Holm over the {len(tested)} comparisons"}.get(
            adjustment, f"Holm over the {len(tested)} comparisons, each look round by round "
                        "spending its level (O'Brien–Fleming)")
        held = [c for c in tested if c.verdict is Verdict.INDISTINGUISHABLE
                and c.verdict_unadjusted is not Verdict.INDISTINGUISHABLE]
        logs = [t for t in tests if t != TEST_WELCH_DIFF]
        on = " / ".join(logs) + " on the log scale" if logs else ""
        if len(logs) < len(tests):
            on += ("; " if on else "") + TEST_WELCH_DIFF
        notes.append(
            f"Verdicts: {on}; p adjusted by {how}: at most "
            f"{1 - conf:.0%} of studies of equal points call any of them different"
            + (f"; {len(held)} raw p under {1 - conf:.0%} did not survive the adjustment."
               if held else "."))
    no_ratio = [pc for pc in others if pc.comparison.on_difference]
    if no_ratio:
        names = ", ".join(point_label(pc.summary.params) for pc in no_ratio[:3])
        notes.append(
            f"No ratio for {len(no_ratio)} comparison(s) ({names}"
            f"{', …' if len(no_ratio) > 3 else ''}): "
            f"a run of {fom} at or below zero (the point's or the baseline's), so speedup, its "
            "interval and the detectable change are not defined (–); the verdict is Welch's t "
            "on the difference of means, shown as Δ (point − baseline, > 0 better) with its "
            "interval in the unit of the figure of merit, without the noise threshold.")
    if plan is not None and others:
        open_ = [pc for pc in others if pc.comparison.decided is False]
        short = sum(1 for pc in others if pc.comparison.verdict is Verdict.INSUFFICIENT)
        notes.append(
            f"repeats: auto ({plan.min_rounds} to {plan.max_rounds} rounds): "
            + (f"{len(open_)} of {len(others)} comparisons still undecided "
               f"({', '.join(point_label(pc.summary.params) for pc in open_[:3])}"
               f"{', …' if len(open_) > 3 else ''})." if open_
               else f"all {len(others)} comparisons decided." if not short
               else f"{len(others) - short} of {len(others)} comparisons decided, {short} with "
                    "insufficient data (fewer than two successful runs on a side).")
            )
    if noise is not None and not no_ratio:  # a relative noise: no scale where runs cross 0
        need = (f"about {noise.repeats_needed} repeats per point" if noise.repeats_needed
                else "more repeats than is practical")
        have = max((s.n for s in summaries), default=0)
        seen = (f"; the smallest change these runs detect in 80 % of studies is "
                f"{_about(detectable_text(noise.detectable))} (median over the points)"
                if math.isfinite(noise.detectable) else "")
        notes.append(f"Noise: runs of one point vary by about {noise.sd_log:.1%} (sd){seen}; a "
                     f"{noise.change:.0%} change needs {need} to be seen in 80 % of studies "
                     f"(up to {have} here).")
    return notes


def _about(text: str) -> str:
    """``about 12.5%``, or ``more than 1000%`` for a figure shown as ``>1000%``."""
    return f"more than {text[1:]}" if text.startswith(">") else f"about {text}"


def _unfinished_line(runs: pd.DataFrame, planned: int) -> str:
    """The note on a study with fewer stored runs than planned (a ``tunelab run`` still
    adding runs, or one that stopped), else ``""``."""
    stored = (int((runs["status"] != "lost").sum()) if "status" in runs.columns
              else len(runs))
    if not 0 < stored < planned:  # no runs: "No runs yet." says it
        return ""
    return (f"The study is not finished: {stored:,} of its {planned:,} planned runs are "
            "stored (a 'tunelab run' may still be adding runs; the same command resumes one "
            "that stopped); every figure here is from the runs so far.")


def busy_line(watched: Disturbance) -> str:
    """The warning on disturbed runs (the noise watch's evidence, from the runs table; the
    cause is the evidence's: others' processes, a CPU quota, stops, disk traffic, a GPU
    neighbour)."""
    share = (f"; others took a median {watched.others_median:.0%} of their cores "
             f"(up to {watched.others_max:.0%})" if math.isfinite(watched.others_median)
             else "")
    start = ("The machine was busy from the start: " if watched.from_start
             else "Warning: ")
    example = f" (e.g. {watched.evidence[0]})" if watched.evidence else ""
    fate = (f"; the {watched.left_out} disturbed ok runs are left out of every figure"
            if watched.left_out else
            "; they count in the figures below (--exclude-disturbed leaves them out, "
            "'tunelab run --rerun-disturbed' runs them again)")
    return (f"{start}{watched.disturbed} of {watched.watched} runs were disturbed"
            f"{example}{share}{fate}.")


def _value_text(value: float, fom: str) -> str:
    name = fom.removeprefix("fom.")
    unit = " s" if name.endswith("_s") else ""
    return f"{name} {fmt_number(value, 3)}{unit}"


def exclusions_from_frame(runs: pd.DataFrame, objective: Objective,
                          summaries: tuple[PointSummary, ...]) -> list[Exclusion]:
    """The points with ``invalid`` runs, in order of first run, each with its reason and
    whether it would have been the best point (see :class:`Exclusion`)."""
    if not len(runs) or "status" not in runs.columns:
        return []
    column = fom_column(objective.fom)
    minimize = objective.direction == "minimize"
    valid_means = [s.mean for s in summaries if s.n > 0]
    best_valid = ((min if minimize else max)(valid_means) if valid_means else math.nan)
    invalid = runs[runs["status"] == "invalid"]
    rows_of = invalid.groupby(invalid["point"].astype(str), sort=False).indices
    out = []
    for s in summaries:
        if not s.failed.get("invalid"):
            continue
        rows = invalid.iloc[rows_of.get(s.point, [])]
        values = rows[column].astype(float) if column in rows.columns else []
        finite = [float(v) for v in values if math.isfinite(v)]
        value = sum(finite) / len(finite) if finite else math.nan
        reason = str(next((r for r in rows.get("reason", []) if r), "an invariant differs"))
        # a point with no valid run is not among the valid means: it leads when it beats all
        leading = s.n == 0 and math.isfinite(value) and (
            not valid_means or ((value < best_valid) if minimize else (value > best_valid)))
        label = point_label(s.params)
        if leading:
            word = verdict_label("better", objective.fom, objective.direction)
            word = {"faster": "fastest", "better": "best"}[word]
            line = (f"{label}: {word} ({_value_text(value, objective.fom)}), "
                    f"but excluded: {reason}")
        elif s.n == 0:
            line = f"{label}: excluded: {reason}"
        else:
            line = (f"{label}: {s.failed['invalid']} of {s.n_total} runs excluded: {reason}")
        out.append(Exclusion(s.point, s.params, s.failed["invalid"], s.n_total, value, reason,
                             leading, line))
    return out


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def failed_runs(runs: pd.DataFrame | None) -> list[FailedRun]:
    """Runs whose status is not ``ok``, in run order, with their reasons."""
    if runs is None or len(runs) == 0 or "status" not in runs.columns:
        return []
    bad = runs[runs["status"] != "ok"]
    if "run_id" in bad.columns:
        bad = bad.sort_values("run_id")
    out = []
    for row in bad.to_dict("records"):
        try:
            params = json.loads(row.get("point", "{}"))
            label = point_label(params) if isinstance(params, dict) else str(row.get("point"))
        except (TypeError, ValueError):
            label = str(row.get("point"))
        out.append(
            FailedRun(
                _cell(row.get("run_id")),
                label,
                _cell(row.get("repeat")),
                _cell(row.get("status")),
                _cell(row.get("rc")),
                _cell(row.get("reason")),
            )  # fmt: skip
        )
    return out
