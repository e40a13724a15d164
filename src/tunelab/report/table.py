"""Ranked result tables as formatted strings (:func:`table_rows`, :func:`best_lines`,
:func:`exclusion_lines`), in the shared formats of :mod:`tunelab.report.formats`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from tunelab.report.formats import (
    byte_rate_prefix,
    detectable_text,
    fmt_mean_sd,
    fmt_number,
    fmt_ratio,
    fmt_spread,
    p_text,
    point_label,
)
from tunelab.stats import (
    BestResult,
    Comparison,
    PointComparison,
    PointSummary,
    Verdict,
    verdict_label,
)

if TYPE_CHECKING:
    from tunelab.report.results import Exclusion
    from tunelab.workload import Objective

__all__ = ["TableRow", "against_baseline", "baseline_line", "best_lines",
           "exclusion_lines", "speedup_cells", "table_rows"]

class TableRow(NamedTuple):
    """One ranked line of a result table, every cell already formatted.

    ``speedup`` (with the deciding test's interval), ``p_value`` (the adjusted p the
    verdict used), ``verdict`` and ``detectable`` (the minimum detectable change) are empty
    strings when the rows were built from summaries only; ``verdict_kind`` is the raw
    :class:`Verdict` value (or ``"baseline"``) for colouring; ``disturbed`` counts the
    point's disturbed runs.
    """

    rank: int
    point: str
    label: str
    n: str
    mean_std: str
    median: str
    min: str
    speedup: str
    p_value: str
    verdict: str
    verdict_kind: str
    failed: str
    detectable: str = ""
    disturbed: str = ""


def _failed_text(summary: PointSummary) -> str:
    if not summary.failed:
        return ""
    return ", ".join(f"{count} {status}" for status, count in summary.failed.items())


def _mean_std(summary: PointSummary) -> str:
    if summary.n == 0:
        return "–"
    return fmt_mean_sd(summary.mean, summary.std)


def table_rows(
    items: Sequence[PointComparison] | Sequence[PointSummary], objective: Objective
) -> list[TableRow]:
    """Rows of the ranked table, best first.

    ``items`` are either :func:`tunelab.stats.compare_to_baseline` results (kept in their
    rank) or :func:`tunelab.stats.summarize` results (ranked here by mean, points without
    values last).
    """
    rows: list[TableRow] = []
    if items and isinstance(items[0], PointSummary):
        summaries = [s for s in items if isinstance(s, PointSummary)]
        sign = 1.0 if objective.direction == "minimize" else -1.0
        ranked = sorted(summaries, key=lambda s: (s.n == 0, sign * s.mean if s.n else 0.0, s.point))
        for rank, s in enumerate(ranked, start=1):
            rows.append(
                TableRow(
                    rank,
                    s.point,
                    point_label(s.params),
                    str(s.n),
                    _mean_std(s),
                    fmt_number(s.median),
                    fmt_number(s.min),
                    "",
                    "",
                    "",
                    "",
                    _failed_text(s),
                )  # fmt: skip
            )
        return rows
    for pc in items:
        if not isinstance(pc, PointComparison):
            raise TypeError(f"expected PointComparison or PointSummary items, got {type(pc)}")
        s, c = pc.summary, pc.comparison
        if pc.is_baseline:
            speedup, verdict, kind = "1 (baseline)", "baseline", "baseline"
            p = ""
        else:
            speedup = " ".join(filter(None, speedup_cells(c)))
            verdict = verdict_label(c.verdict, objective.fom, objective.direction)
            kind = c.verdict.value
            p = p_text(c.p_adjusted)
        rows.append(
            TableRow(
                pc.rank,
                s.point,
                point_label(s.params),
                str(s.n),
                _mean_std(s),
                fmt_number(s.median),
                fmt_number(s.min),
                speedup,
                p,
                verdict,
                kind,
                _failed_text(s),
                detectable_text(c.detectable) if not pc.is_baseline else "",
                str(s.disturbed) if s.disturbed else "",
            )  # fmt: skip
        )
    return rows


def speedup_cells(c: Comparison) -> tuple[str, str]:
    """The speedup (``1.234×``) and its interval (``[1.1, 1.3]``), as every renderer shows
    them; without a ratio (a run <= 0), ``–`` and the difference of means with its
    interval (``Δ +0.09 [-0.1, 0.3]``, > 0 better); dashes and ``""`` when unknown."""
    if c.on_difference:
        return "–", (f"Δ {c.difference:+.4g} [{c.diff_low:.4g}, {c.diff_high:.4g}]"
                     if math.isfinite(c.difference) else "")
    speedup = "–" if math.isnan(c.speedup) else f"{fmt_ratio(c.speedup)}×"
    ci = "" if math.isnan(c.ci_low) else f"[{fmt_ratio(c.ci_low)}, {fmt_ratio(c.ci_high)}]"
    return speedup, ci


def against_baseline(result: BestResult, comparisons: Sequence[PointComparison]
                     ) -> tuple[PointComparison | None, PointComparison | None]:
    """The best point's comparison with the baseline and the baseline's own row, both as
    ``compare`` shows them (None: no baseline, or the best point was not compared)."""
    base = next((pc for pc in comparisons if pc.is_baseline), None)
    mine = next((pc for pc in comparisons if pc.point == result.best.point), None)
    return (mine, base) if base is not None else (None, None)


def baseline_line(mine: PointComparison | None, base: PointComparison | None,
                  fom: str, direction: str) -> str:
    """One sentence: whether the best point beats the baseline, by the comparison (test,
    interval, adjusted p) ``compare`` shows for it; ``""`` without a baseline."""
    if mine is None or base is None:
        return ""
    label = point_label(base.summary.params)
    if mine.is_baseline:
        return f"The best point is the baseline ({label})."
    c = mine.comparison
    if c.verdict is Verdict.INSUFFICIENT:
        return (f"Against the baseline ({label}): insufficient data (fewer than 2 successful "
                "runs on one side).")
    speedup, interval = speedup_cells(c)
    estimate = interval if c.on_difference else f"{speedup} {interval}".strip()
    how = f"p {p_text(c.p_adjusted)} ({c.test}, adjusted: {c.adjustment}, as in compare)"
    if c.verdict is Verdict.INDISTINGUISHABLE:
        return (f"Against the baseline ({label}): not distinguishable from it, "
                f"{estimate}, {how}.")
    word = verdict_label(c.verdict, fom, direction)
    return f"Against the baseline ({label}): {word} than it, {estimate}, {how}."


def best_lines(result: BestResult, baseline: str = "", unit: str = "") -> list[str]:
    """Plain sentences on the best point and how sure we are (terminal and HTML);
    ``baseline`` is :func:`baseline_line`'s sentence, said after the best point; ``unit``
    the objective's, when known (bytes per second, ``B/s``, shown in GB/s, MB/s or kB/s)."""
    b, fom = result.best, result.fom
    scale = 1.0
    if unit == "B/s":  # bytes per second in GB/s, MB/s or kB/s, read at a glance
        scale, unit = byte_rate_prefix([b.mean])
    lines = [
        f"Best point: {point_label(b.params)} — mean {fom} {fmt_number(b.mean / scale)}"
        + (f" ± {fmt_spread(b.std / scale, b.mean / scale)}" if not math.isnan(b.std) else "")
        + (f" {unit}" if unit else "")
        + f" (n={b.n}, {result.direction})."
    ]
    per = f" {unit}" if scale != 1.0 else ""  # the other means and differences, when scaled
    if result.p_best is not None:
        lines.append(f"Probability that it is the best, given all runs: {result.p_best:.0%}.")
    top = result.top_by_mean
    if top is not None:
        shown = ".0%" if result.p_best is None or result.p_top_by_mean is None or \
            f"{result.p_best:.0%}" != f"{result.p_top_by_mean:.0%}" else ".1%"
        chance = (f" (probability {result.p_top_by_mean:{shown}}"
                  + (f" against the best's {result.p_best:{shown}})" if result.p_best is not None
                     else ")")
                  if result.p_top_by_mean is not None else "")
        lines.append(
            f"{point_label(top.params)} has the better mean ({fmt_number(top.mean / scale)}"
            f"{per}, n={top.n}; compare lists it first) but is less likely the best{chance}: "
            "the best is judged on the log scale, from every point's runs and the noise they "
            "share, and means this close can change places by chance.")
    if baseline:
        lines.append(baseline)
    if result.runner_up is None or result.comparison is None:
        lines.append("It is the only point with successful runs: nothing to compare it with.")
        return lines
    r, c = result.runner_up, result.comparison
    lines.append(f"Runner-up: {point_label(r.params)} — mean {fmt_number(r.mean / scale)}{per}"
                 f" (n={r.n}).")
    verdict = verdict_label(c.verdict, fom, result.direction)
    if c.verdict is Verdict.INSUFFICIENT:
        lines.append(
            f"Best vs runner-up: {fmt_ratio(c.speedup)}× — insufficient data "
            "(fewer than 2 successful runs on one side)."
        )
        return lines
    if c.on_difference:
        lines.append(
            f"Best vs runner-up: difference of means {c.difference / scale:+.4g} "
            f"[{c.diff_low / scale:.4g}, {c.diff_high / scale:.4g}]{per} ({c.ci_level:.0%} CI), "
            f"p = {p_text(c.p_adjusted)} "
            f"({c.test}): {verdict}. No speedup or detectable change: a run of {fom} is at "
            "or below zero, so ratios are not defined.")
    else:
        lines.append(
            f"Best vs runner-up: {fmt_ratio(c.speedup)}× [{fmt_ratio(c.ci_low)}, "
            f"{fmt_ratio(c.ci_high)}] ({c.ci_level:.0%} CI), p = {p_text(c.p_adjusted)} "
            f"({c.test}, log scale): {verdict}; it detects a change of "
            f"{detectable_text(c.detectable) or 'unknown size'} in 80 % of studies."
        )
    if c.verdict is Verdict.BETTER:
        beyond = "" if c.on_difference else ", beyond the noise threshold"
        lines.append(f"The best point beats the runner-up ({verdict}{beyond}).")
    else:
        lines.append("The best point cannot be told apart from the runner-up: pick either.")
    p = result.p_beats_runner_up
    if p is not None:
        lines.append(
            f"Confidence that it beats the runner-up: {p:.1%} (one-sided, same test; "
            "optimistic: the best was chosen for looking the best)."
        )
    return lines


def exclusion_lines(exclusions: Sequence[Exclusion]) -> list[str]:
    """One sentence per point a physics check excluded (leading ones first)."""
    ordered = sorted(exclusions, key=lambda e: not e.leading)
    return [e.line for e in ordered]
