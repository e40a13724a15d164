"""Byte rates at a glance: every figure of merit a workload declares in bytes per second
(its ``fom_units`` say ``B/s``: the merge benchmark's ``throughput``, ``bandwidth``, …; the
ddp workload's all-reduce bandwidths), per point, in decimal GB/s, MB/s or kB/s.

:func:`byte_rates` is the data step (a :class:`RateTable`, raw B/s); :func:`rates_table`
renders it as one text table with a single prefix for all its cells, so that columns and
rows compare at a glance; :func:`with_rates` appends it to ``compare`` (and its document to
the JSON) and the HTML report shows the same table. Spreads and per-worker order statistics
of a rate (``bandwidth_std``, ``bandwidth_min``, …) are not columns of their own.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, NamedTuple

from tunelab.report.formats import byte_rate_prefix, point_label
from tunelab.report.output import Cell, Column, TextTable, View

if TYPE_CHECKING:
    from tunelab.report.results import StudyResults

__all__ = ["BYTE_RATE", "RateRow", "RateTable", "byte_rates", "rates_document", "rates_table",
           "with_rates"]

BYTE_RATE = "B/s"
"""The unit (in a workload's ``fom_units``) that makes a figure of merit a byte rate."""

_NOT_OWN_COLUMN = ("_std", "_min", "_median", "_max")
"""Name endings of a rate's spread and per-worker order statistics: no column of their own."""


class RateRow(NamedTuple):
    """One point: its parameters, label, ok runs and each rate's median over them (B/s;
    NaN where the point has no value of that rate)."""

    params: dict[str, Any]
    label: str
    n: int
    medians: dict[str, float]


class RateTable(NamedTuple):
    """The byte rates of a study: the rate names (the objective first) and one row per
    point, in the order of the compare table (best first)."""

    foms: tuple[str, ...]
    rows: tuple[RateRow, ...]


def byte_rates(results: StudyResults) -> RateTable | None:
    """The per-point medians of the study's byte-rate figures of merit over its ok runs
    (with ``exclude_disturbed``, the undisturbed ones), or None when the workload declares
    no byte rate or no run measured one."""
    from tunelab.report.table import table_rows
    from tunelab.stats import StatsError, summarize

    objective = results.objective.fom.removeprefix("fom.")
    declared = [f for f, unit in results.fom_units.items()
                if unit == BYTE_RATE and not f.endswith(_NOT_OWN_COLUMN)]
    declared.sort(key=lambda f: f != objective)
    medians: dict[str, dict[str, float]] = {}
    counts: dict[str, int] = {}
    for fom in declared:
        if f"fom.{fom}" not in results.runs.columns:
            continue
        try:
            summaries = summarize(results.runs, fom, exclude_disturbed=results.exclude_disturbed)
        except StatsError:
            continue
        medians[fom] = {s.point: s.median for s in summaries}
        for s in summaries:
            counts[s.point] = max(counts.get(s.point, 0), s.n)
    if not any(math.isfinite(v) for m in medians.values() for v in m.values()):
        return None
    items = results.comparisons or results.summaries
    order = [r.point for r in table_rows(items, results.objective)] if items else list(counts)
    params = {s.point: s.params for s in results.summaries}
    foms = tuple(medians)
    rows = tuple(RateRow(params.get(p, {}), point_label(params.get(p, {})), counts.get(p, 0),
                         {f: medians[f].get(p, math.nan) for f in foms}) for p in order)
    return RateTable(foms, rows)


def _cell(value: float, divisor: float) -> Cell:
    return "–" if not math.isfinite(value) else f"{value / divisor:,.3g}"


def rates_table(data: RateTable) -> TextTable:
    """``data`` as one table, every cell in the same decimal unit (GB = 10^9 bytes)."""
    divisor, unit = byte_rate_prefix([v for r in data.rows for v in r.medians.values()])
    columns = (Column("point", "point", wrap=True), Column("n", "n", "right", drop=1),
               *(Column(f, f"{f} {unit}", "right") for f in data.foms))
    rows = tuple({"point": r.label, "n": str(r.n),
                  **{f: _cell(r.medians[f], divisor) for f in data.foms}} for r in data.rows)
    size = (f"{unit[:-2]} = 10^{round(math.log10(divisor))} bytes" if divisor > 1
            else "B = bytes")
    note = (f"Median of each point's ok runs, in {unit} ({size}); × 8 for "
            f"{unit.replace('B/s', 'bit/s')}.")
    return TextTable(f"Byte rates per point, in {unit}", columns, rows, (note,))


def rates_document(data: RateTable) -> dict[str, Any]:
    """``data`` for a JSON document (raw B/s, NaN as null once rendered)."""
    return {"unit": BYTE_RATE, "foms": list(data.foms),
            "points": [{"point": r.params, "label": r.label, "n": r.n, "median": r.medians}
                       for r in data.rows]}


def with_rates(view: View, results: StudyResults) -> View:
    """``view`` with the byte-rate table appended (and a ``rates`` key in the JSON
    document), or unchanged for a study whose workload declares no byte rate."""
    data = byte_rates(results)
    if data is None:
        return view
    return dataclasses.replace(view, blocks=(*view.blocks, rates_table(data)),
                               document={**view.document, "rates": rates_document(data)})
