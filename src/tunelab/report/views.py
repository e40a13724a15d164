"""What the result commands show (``compare``, ``compare A B``, ``best``), as data: one
function per command builds a :class:`View`; :mod:`tunelab.report.listings` has the views of
``status``, ``space`` and ``workloads``, :mod:`tunelab.report.appendices` what ``compare``
appends for some studies (layouts, cores, the storage table).

Nothing here prints or knows where the output goes; :mod:`tunelab.report.output` renders a
view as terminal tables, plain lines, JSON, CSV or Markdown. The JSON documents carry a
``schema`` name and a ``version`` (see ``docs/output.md``); bump the version whenever a field
changes meaning or disappears (adding a field keeps it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tunelab.report.formats import (
    VERDICT_STYLES,
    detectable_text,
    fmt_mean_sd,
    fmt_number,
    p_text,
    point_label,
)
from tunelab.report.output import SCHEMA_VERSION, Cell, Column, Lines, TextTable, View
from tunelab.report.table import (
    against_baseline,
    baseline_line,
    best_lines,
    exclusion_lines,
    speedup_cells,
)
from tunelab.stats import (
    TEST_WELCH_DIFF,
    Comparison,
    PointComparison,
    PointSummary,
    verdict_label,
)

if TYPE_CHECKING:
    from tunelab.crossstudy import StudyComparison
    from tunelab.report.results import StudyResults
    from tunelab.stats import BestResult
    from tunelab.workload import Objective

__all__ = [
    "SCHEMA_VERSION",
    "best_view",
    "p_header",
    "compare_view",
    "cross_compare_view",
]



# ---------------------------------------------------------------------------------------
# shared pieces


def _objective_doc(objective: Objective) -> dict[str, str | None]:
    return {"fom": objective.fom.removeprefix("fom."), "direction": objective.direction,
            "unit": objective.unit or None}


def fom_title(objective: Objective) -> str:
    """The objective's name for a title, with its unit when the workload declared one
    (``throughput in B/s``)."""
    fom = objective.fom.removeprefix("fom.")
    return f"{fom} in {objective.unit}" if objective.unit else fom


def _summary_doc(s: PointSummary) -> dict[str, Any]:
    return {
        "point": dict(s.params),
        "label": point_label(s.params),
        "n": s.n,
        "mean": s.mean,
        "sd": s.std,
        "median": s.median,
        "min": s.min,
        "max": s.max,
        "failures": dict(s.failed),
        "disturbed": s.disturbed,
        "left_out": s.left_out,
    }


def _comparison_doc(c: Comparison, objective: Objective) -> dict[str, Any]:
    """One comparison: the deciding test's estimate, interval, raw p and the adjusted p
    its verdict used (``p``), the minimum detectable change and the power hint."""
    return {
        "speedup": _number_or_none(c.speedup),
        "ci_low": _number_or_none(c.ci_low),
        "ci_high": _number_or_none(c.ci_high),
        "p": _number_or_none(c.p_adjusted),
        "p_raw": _number_or_none(c.p_value),
        "test": c.test,
        "adjustment": c.adjustment,
        "verdict": c.verdict.value,
        "verdict_label": verdict_label(c.verdict, objective.fom, objective.direction),
        "verdict_unadjusted": c.verdict_unadjusted.value,
        "ratio_of_means": _number_or_none(c.ratio_of_means),
        "n_rounds": c.n_pairs,
        "detectable": _number_or_none(c.detectable),
        "repeats_needed": c.repeats_needed,
        "decided": c.decided,
        "ci_level": _number_or_none(c.ci_level),
        "difference": _number_or_none(c.difference),
        "difference_low": _number_or_none(c.diff_low),
        "difference_high": _number_or_none(c.diff_high),
    }


def _number_or_none(value: float) -> float | None:
    return None if math.isnan(value) else value


def p_header(comparisons: Sequence[Comparison]) -> tuple[str, str]:
    """The tests and the adjustment behind a table's p column, named for its header
    (``("", "none")`` when no comparison could be tested yet)."""
    tests = sorted({c.test for c in comparisons if not math.isnan(c.p_adjusted)})
    adjustments = sorted({c.adjustment for c in comparisons if not math.isnan(c.p_adjusted)})
    return " / ".join(tests), " / ".join(adjustments) or "none"


def ci_words(confidence: float, adjustment: str) -> tuple[str, str]:
    """The interval column's header and the title's words on it: ``95% CI`` without an
    adjustment; with one, the interval is at the level the adjustment held each p to
    (:attr:`~tunelab.stats.results.Comparison.ci_level`), and the words say so. They claim
    no joint coverage: intervals at Holm's step levels are narrower than Bonferroni's, and
    all of them together need not cover their true values 95 % of the time."""
    conf, alpha = f"{confidence:.0%}", f"{1 - confidence:.0%}"
    if adjustment == "none":
        return f"{conf} CI", f"[{conf} CI]"
    return ("CI (adj.)", f"[CI at the level {adjustment} held each p to: it excludes 1 exactly "
                         f"when p < {alpha}]")


def ci_caption(comparisons: Sequence[PointComparison], confidence: float) -> str:
    """What the intervals of ``comparisons`` are, for a figure's axis or a table's header:
    ``95% CI``, or, when the p values were adjusted, at the level each p was held to."""
    adjustment = p_header([pc.comparison for pc in comparisons if not pc.is_baseline])[1]
    words = ci_words(confidence, adjustment)
    return words[0] if adjustment == "none" else words[1].strip("[]")


def _scale(tests: str) -> str:
    """``" (log scale)"`` unless every test named is on the difference of means."""
    return "" if tests == TEST_WELCH_DIFF else " (log scale)"


def _noise_doc(results: StudyResults) -> dict[str, Any] | None:
    """The study's run-to-run noise and the power hint (None without an estimate)."""
    n = results.noise
    if n is None:
        return None
    return {"sd_log": n.sd_log, "df": n.df, "change": n.change,
            "repeats_needed": n.repeats_needed, "detectable": _number_or_none(n.detectable)}


def _disturbance_doc(results: StudyResults) -> dict[str, Any] | None:
    """What the noise watch recorded over the study (None without a sample)."""
    d = results.disturbance
    if d is None:
        return None
    return {"watched": d.watched, "disturbed": d.disturbed,
            "others_median": _number_or_none(d.others_median),
            "others_max": _number_or_none(d.others_max), "from_start": d.from_start,
            "evidence": list(d.evidence), "left_out": d.left_out,
            "excluded_from_verdicts": results.exclude_disturbed}


def _unpaired_doc(results: StudyResults) -> list[dict[str, Any]]:
    """The rounds not paired as a whole (split across sessions, runs made again)."""
    return [{"round": b.round, "sessions": b.sessions, "apart_s": _number_or_none(b.apart_s),
             "reruns": b.reruns} for b in results.unpaired]


def _exclusions_doc(results: StudyResults) -> list[dict[str, Any]]:
    return [{"point": dict(e.params), "label": point_label(e.params), "n_invalid": e.n_invalid,
             "n_runs": e.n_runs, "mean": e.value, "reason": e.reason, "leading": e.leading,
             "line": e.line} for e in results.exclusions]


def _mean_sd(s: PointSummary) -> str:
    if s.n == 0:
        return "–"
    return fmt_mean_sd(s.mean, s.std)


def _failed_text(failed: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {status}" for status, n in failed.items())


def _disturbed_cell(s: PointSummary) -> Cell:
    if not s.disturbed:
        return ""
    return (f"{s.disturbed} left out" if s.left_out else str(s.disturbed), "yellow")


def _verdict_cell(c: Comparison, objective: Objective) -> Cell:
    return (verdict_label(c.verdict, objective.fom, objective.direction),
            VERDICT_STYLES.get(c.verdict, ""))


def _param_record(params: Mapping[str, Any], taken: Sequence[str]) -> dict[str, Any]:
    """Parameters as CSV columns, prefixed ``param.`` only where a name is already used."""
    return {(f"param.{k}" if k in taken else k): v for k, v in params.items()}


_SUMMARY_COLUMNS = (
    Column("rank", "#", "right", drop=6),
    Column("point", "point", wrap=True),
    Column("n", "n", "right", drop=4),
    Column("mean", "mean ± sd", "right", drop=5),
    Column("median", "median", "right", drop=2),
    Column("min", "min", "right", drop=1),
)


# ---------------------------------------------------------------------------------------
# compare (one study against its baseline)


def compare_view(results: StudyResults) -> View:
    """Every point against the study's baseline, best first (summaries only without one)."""
    objective = results.objective
    compared = bool(results.comparisons)
    items: Sequence[PointComparison | PointSummary] = (
        results.comparisons if compared else _ranked(results.summaries, objective))
    columns = list(_SUMMARY_COLUMNS)
    conf = f"{results.confidence:.0%}"
    others = [pc.comparison for pc in results.comparisons if not pc.is_baseline]
    tests, adjustment = p_header(others)
    if compared:
        columns += [Column("speedup", "speedup", "right"),
                    Column("ci", ci_words(results.confidence, adjustment)[0], "right", drop=7),
                    Column("p", f"p ({adjustment})", "right", drop=3),
                    Column("verdict", "verdict"),
                    Column("detectable", "detectable", "right", drop=8)]
    if any(s.disturbed for s in results.summaries):
        columns.append(Column("disturbed", "disturbed", "right", drop=9))
    columns.append(Column("failed", "not ok"))
    rows: list[dict[str, Cell]] = []
    points_doc: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    for rank, item in enumerate(items, start=1):
        s = _summary_of(item)
        row: dict[str, Cell] = {
            "rank": str(item.rank if isinstance(item, PointComparison) else rank),
            "point": point_label(s.params), "n": str(s.n), "mean": _mean_sd(s),
            "median": fmt_number(s.median), "min": fmt_number(s.min),
            "failed": (_failed_text(s.failed), "red") if s.failed else "",
            "disturbed": _disturbed_cell(s),
        }
        doc = {"rank": int(row["rank"]), **_summary_doc(s)}  # type: ignore[arg-type]
        if isinstance(item, PointComparison):
            doc["is_baseline"] = item.is_baseline
            if item.is_baseline:
                row.update(speedup="1 (baseline)", verdict=("baseline", "bold"))
                doc.update({k: None for k in _comparison_doc(item.comparison, objective)})
                doc.update(speedup=1.0, verdict="baseline", verdict_label="baseline")
            else:
                speedup, ci = speedup_cells(item.comparison)
                row.update(speedup=speedup, ci=ci, p=p_text(item.comparison.p_adjusted),
                           verdict=_verdict_cell(item.comparison, objective),
                           detectable=detectable_text(item.comparison.detectable))
                doc.update(_comparison_doc(item.comparison, objective))
        rows.append(row)
        points_doc.append(doc)
        record = {"rank": doc["rank"], "label": doc["label"]}
        record.update(_param_record(s.params, _FLAT_FIELDS))
        record.update({k: doc.get(k) for k in _FLAT_FIELDS if k not in ("rank", "label")})
        record["failures"] = _failed_text(s.failed)
        records.append(record)
    if compared:
        baseline = next((pc for pc in results.comparisons if pc.is_baseline), None)
        against = f" against {point_label(baseline.summary.params)}" if baseline else ""
        tested = (f"{ci_words(results.confidence, adjustment)[1]} and p of the {tests}"
                  f"{_scale(tests)}, p adjusted by {adjustment}" if tests
                  else f"[{conf} CI] and p: none yet (a test needs two ok runs of a point and "
                  "of the baseline)")
        title = (f"{fom_title(objective)} ({objective.direction}){against}: speedup > 1 is "
                 f"better, {tested}; "
                 "detectable: the smallest change seen in 80 % of studies")
    else:
        title = f"{fom_title(objective)} ({objective.direction}), best first"
    document = {
        "schema": "tunelab.compare",
        "version": SCHEMA_VERSION,
        "study": results.name,
        "directory": str(results.directory) if results.directory else None,
        "objective": _objective_doc(objective),
        "baseline": json.loads(results.baseline) if results.baseline else None,
        "confidence": results.confidence,
        "noise_threshold": results.noise_threshold,
        "noise": _noise_doc(results),
        "disturbance": _disturbance_doc(results),
        "unpaired": _unpaired_doc(results),
        "points": points_doc,
        "excluded": _exclusions_doc(results),
        "notes": list(results.notes),
    }
    notes = (*results.notes, *exclusion_lines(results.exclusions))
    table = TextTable(title, tuple(columns), tuple(rows), notes)
    return View((table,), document, tuple(records))


_FLAT_FIELDS = ("rank", "label", "n", "mean", "sd", "median", "min", "max", "speedup",
                "ci_low", "ci_high", "difference", "difference_low", "difference_high", "p",
                "p_raw", "test", "adjustment", "verdict", "verdict_label", "detectable",
                "decided", "disturbed", "left_out", "failures")


def _summary_of(item: PointComparison | PointSummary) -> PointSummary:
    return item.summary if isinstance(item, PointComparison) else item


def _ranked(summaries: Sequence[PointSummary], objective: Objective) -> list[PointSummary]:
    sign = 1.0 if objective.direction == "minimize" else -1.0
    return sorted(summaries, key=lambda s: (s.n == 0, sign * s.mean if s.n else 0.0, s.point))


# ---------------------------------------------------------------------------------------
# compare A B (two studies)


def cross_compare_view(sc: StudyComparison, *, directory_a: str = "",
                       directory_b: str = "") -> View:
    """Study B against study A on the points both measured, and the points only one did."""
    objective = sc.objective
    conf = f"{sc.confidence:.0%}"
    tests, adjustment = p_header([cp.comparison for cp in sc.points])
    columns = (
        Column("rank", "#", "right", drop=5),
        Column("point", "point", wrap=True),
        Column("a", f"{sc.name_a} (A) mean ± sd", "right", drop=3),
        Column("b", f"{sc.name_b} (B) mean ± sd", "right", drop=4),
        Column("speedup", "B/A speedup", "right"),
        Column("ci", ci_words(sc.confidence, adjustment)[0], "right", drop=6),
        Column("p", f"p ({adjustment})", "right", drop=2),
        Column("verdict", "verdict"),
        Column("failed", "not ok (A; B)", drop=1),
    )
    rows: list[dict[str, Cell]] = []
    docs: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    for cp in sc.points:
        speedup, ci = speedup_cells(cp.comparison)
        failed = "; ".join(filter(None, [_failed_text(cp.a.failed), _failed_text(cp.b.failed)]))
        rows.append({
            "rank": str(cp.rank), "point": point_label(cp.params),
            "a": f"{_mean_sd(cp.a)} (n={cp.a.n})", "b": f"{_mean_sd(cp.b)} (n={cp.b.n})",
            "speedup": speedup, "ci": ci, "p": p_text(cp.comparison.p_adjusted),
            "verdict": _verdict_cell(cp.comparison, objective),
            "failed": (failed, "red") if failed else "",
        })
        doc = {"rank": cp.rank, "point": dict(cp.params), "label": point_label(cp.params),
               "a": _summary_doc(cp.a), "b": _summary_doc(cp.b),
               **_comparison_doc(cp.comparison, objective)}
        docs.append(doc)
        record = {"rank": cp.rank, "label": doc["label"]}
        record.update(_param_record(cp.params, _CROSS_FIELDS))
        record.update(n_a=cp.a.n, mean_a=cp.a.mean, sd_a=cp.a.std, n_b=cp.b.n,
                      mean_b=cp.b.mean, sd_b=cp.b.std)
        record.update({k: doc[k] for k in ("speedup", "ci_low", "ci_high", "difference",
                                           "difference_low", "difference_high", "p", "p_raw",
                                           "test", "adjustment", "verdict", "verdict_label")})
        records.append(record)
    tested = (f"{ci_words(sc.confidence, adjustment)[1]} and p of the {tests}{_scale(tests)}"
              f", p adjusted by {adjustment}"
              if tests else f"[{conf} CI] and p: none yet (a test needs two ok runs of a "
              "point in each study)")
    title = (f"{fom_title(objective)} ({objective.direction}): study {sc.name_b!r} (B) against "
             f"{sc.name_a!r} "
             f"(A), speedup > 1: B is better, {tested}")
    notes: list[str] = []
    if not sc.points:
        notes.append("The two studies measured no point in common.")
    notes.extend(sc.notes)
    blocks: list[TextTable | Lines] = [TextTable(title, columns, tuple(rows), tuple(notes))]
    for side, name, only in (("A", sc.name_a, sc.only_a), ("B", sc.name_b, sc.only_b)):
        if only:
            blocks.append(TextTable(
                f"only in {name!r} ({side}), not compared",
                (Column("point", "point", wrap=True), Column("n", "n", "right"),
                 Column("mean", "mean ± sd", "right"), Column("failed", "not ok")),
                tuple({"point": point_label(s.params), "n": str(s.n), "mean": _mean_sd(s),
                       "failed": _failed_text(s.failed)} for s in only)))
    document = {
        "schema": "tunelab.compare-studies",
        "version": SCHEMA_VERSION,
        "a": {"study": sc.name_a, "directory": directory_a or None},
        "b": {"study": sc.name_b, "directory": directory_b or None},
        "objective": _objective_doc(objective),
        "confidence": sc.confidence,
        "noise_threshold": sc.noise_threshold,
        "points": docs,
        "only_a": [_summary_doc(s) for s in sc.only_a],
        "only_b": [_summary_doc(s) for s in sc.only_b],
        "notes": notes,
    }
    return View(tuple(blocks), document, tuple(records))


_CROSS_FIELDS = ("rank", "label", "n_a", "mean_a", "sd_a", "n_b", "mean_b", "sd_b", "speedup",
                 "ci_low", "ci_high", "p", "p_raw", "test", "adjustment", "verdict",
                 "verdict_label")


# ---------------------------------------------------------------------------------------
# best


def best_view(results: StudyResults, best: BestResult | None, problem: str = "") -> View:
    """The best point, its runner-up and the verdict between them; ``problem`` says why
    there is no best point when ``best`` is None."""
    objective = results.objective
    excluded = tuple(exclusion_lines(results.exclusions))
    if best is None:
        text = problem or "no point has a successful run"
        document = {"schema": "tunelab.best", "version": SCHEMA_VERSION,
                    "study": results.name, "objective": _objective_doc(objective),
                    "best": None, "runner_up": None, "comparison": None,
                    "p_beats_runner_up": None, "p_best": None, "top_by_mean": None,
                    "p_top_by_mean": None, "baseline": None,
                    "versus_baseline": None, "versus_baseline_line": None,
                    "excluded": _exclusions_doc(results),
                    "noise": _noise_doc(results), "disturbance": _disturbance_doc(results),
                    "unpaired": _unpaired_doc(results), "notes": [text, *results.trust]}
        return View((Lines((f"No best point: {text}.", *results.trust, *excluded)),),
                    document, ())
    c = best.comparison
    style = VERDICT_STYLES.get(c.verdict, "") if c is not None else "green"
    mine, base = against_baseline(best, results.comparisons)
    versus = baseline_line(mine, base, objective.fom, objective.direction)
    document = {
        "schema": "tunelab.best",
        "version": SCHEMA_VERSION,
        "study": results.name,
        "objective": _objective_doc(objective),
        "best": _summary_doc(best.best),
        "runner_up": _summary_doc(best.runner_up) if best.runner_up else None,
        "comparison": _comparison_doc(c, objective) if c is not None else None,
        "p_beats_runner_up": best.p_beats_runner_up,
        "p_best": best.p_best,
        "top_by_mean": _summary_doc(best.top_by_mean) if best.top_by_mean else None,
        "p_top_by_mean": best.p_top_by_mean,
        "baseline": (_summary_doc(base.summary) if base is not None else None),
        "versus_baseline": (_comparison_doc(mine.comparison, objective)
                            if mine is not None and not mine.is_baseline else None),
        "versus_baseline_line": versus or None,
        "excluded": _exclusions_doc(results),
        "noise": _noise_doc(results),
        "disturbance": _disturbance_doc(results),
        "unpaired": _unpaired_doc(results),
        "notes": list(results.notes),
    }
    records = [{"role": "best", **_summary_doc(best.best)}]
    if best.runner_up is not None:
        records.append({"role": "runner_up", **_summary_doc(best.runner_up)})
    if c is not None:
        records[0].update(_comparison_doc(c, objective))
    blocks: list[TextTable | Lines] = [Lines(tuple(best_lines(best, versus, objective.unit)),
                                             style=style)]
    if results.trust:
        blocks.append(Lines(results.trust))
    if excluded:
        blocks.append(Lines(excluded, style="yellow"))
    return View(tuple(blocks), document, tuple(records))
