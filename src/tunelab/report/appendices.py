"""What ``compare`` appends to its view (:mod:`tunelab.report.views`) when a study's runs
carry it: the scale-out vs scale-up comparison at equal workers (:func:`with_layouts`), the
points whose threads outnumbered the cores others left them (:func:`with_cores`) and the
storage sizing of ddp studies with an input pipeline (:func:`with_storage`, built by
:func:`storage_blocks`). Each returns the view unchanged for runs without those figures.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tunelab.report.output import Cell, Column, Lines, TextTable, View

__all__ = ["storage_blocks", "with_cores", "with_layouts", "with_storage"]


def storage_blocks(runs: Any) -> tuple[tuple[TextTable | Lines, ...], dict[str, Any] | None]:
    """The storage analysis of ``runs`` (:mod:`tunelab.storage`) as a table and lines, and
    its JSON document; nothing for runs without input-pipeline figures."""
    from tunelab.report.storage import storage_lines
    from tunelab.stats import StatsError
    from tunelab.storage import storage_analysis

    try:
        data = storage_analysis(runs)
    except StatsError:
        return (), None
    mb = 1e6
    rows: list[dict[str, Cell]] = []
    for p in data.points:
        rows.append({
            "series": p.series or "-", "workers": str(p.workers), "nodes": str(p.nodes),
            "n": str(p.n), "au": f"{p.au:.1%}",
            "au_ci": "" if math.isnan(p.au_low) else f"[{p.au_low:.1%}, {p.au_high:.1%}]",
            "read": f"{p.read_Bps / mb:,.1f}", "per": f"{p.read_per_worker / mb:,.1f}",
            "need": "" if math.isnan(p.needed) else f"{p.needed / mb:,.1f}",
            "wait": f"{p.wait_share:.1%}", "comm": f"{p.comm_share:.1%}",
            "bound": ("input-bound", "red") if p.input_bound >= 0.5 else ""})
    columns = (Column("series", "series", wrap=True), Column("workers", "workers", "right"),
               Column("nodes", "nodes", "right"), Column("n", "n", "right", drop=4),
               Column("au", "AU", "right"), Column("au_ci", "95% CI", "right", drop=3),
               Column("read", "read MB/s", "right"),
               Column("per", "MB/s per worker", "right", drop=2),
               Column("need", "needed per worker", "right", drop=2),
               Column("wait", "data wait", "right", drop=1),
               Column("comm", "all-reduce", "right", drop=1), Column("bound", "label"))
    notes = storage_lines(data)
    table = TextTable("Storage: AU (compute / step) and data read per second (MB = 10^6 bytes)",
                      columns, tuple(rows), tuple(notes))
    doc = {"target_au": data.target,
           "points": [dict(p.__dict__) for p in data.points],
           "needed_per_accelerator": [dict(r.__dict__) for r in data.needed],
           "sustained": [dict(s.__dict__) for s in data.sustained],
           "bottlenecks": [{"series": b.series, "nodes": b.nodes,
                            "labels": [list(x) for x in b.labels], "shift_at": b.shift_at,
                            "shift": b.shift} for b in data.bottlenecks]}
    return (table,), doc


def with_layouts(view: View, runs: Any, fom: str, direction: str = "maximize") -> View:
    """``view`` with the scale-out vs scale-up comparison at equal workers appended (lines
    and a ``layout_gaps`` key in the JSON document), or unchanged for runs with no worker
    count measured on several node counts."""
    from tunelab.report.scaling import gap_lines
    from tunelab.scaling import layout_gaps
    from tunelab.stats import StatsError

    try:
        gaps = layout_gaps(runs, fom, direction)
    except (StatsError, ValueError):  # no worker count, or one that is not a number
        return view
    if not gaps:
        return view
    doc = [{**g.__dict__, "verdict": str(g.verdict)} for g in gaps]
    return dataclasses.replace(view, blocks=(*view.blocks, Lines(tuple(gap_lines(gaps)))),
                               document={**view.document, "layout_gaps": doc})


def with_cores(view: View, runs: Any, fom: str, direction: str = "maximize") -> View:
    """``view`` with the points whose threads outnumbered the cores others left them, and the
    speedups above the ideal resting on them, appended (lines and a ``short_of_cores`` key
    in the JSON document), or unchanged when no run was short of cores."""
    from tunelab.report.scaling import cores_lines

    lines, records = cores_lines(runs, fom, direction)
    if not lines:
        return view
    return dataclasses.replace(view, blocks=(*view.blocks, Lines(tuple(lines),
                                                                 style="yellow")),
                               document={**view.document, "short_of_cores": records})


def with_storage(view: View, runs: Any) -> View:
    """``view`` with the storage analysis of ``runs`` appended (blocks and a ``storage``
    key in the JSON document), or unchanged for runs without input-pipeline figures."""
    blocks, doc = storage_blocks(runs)
    if doc is None:
        return view
    return View((*view.blocks, *blocks), {**view.document, "storage": doc}, view.records)
