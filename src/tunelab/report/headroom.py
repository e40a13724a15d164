"""Every point beside the machine's limit: the fraction of bound in ``compare``, ``best`` and
the HTML report.

:func:`headroom_of` joins a study to the bounds profile of the machine its snapshot names
(:mod:`tunelab.bounds`) through its workload's account of what a run did
(:meth:`Workload.work <tunelab.workload.Workload.work>`). :func:`with_headroom` appends an
``of bound`` column to ``compare``'s table (and the fractions to its JSON and CSV) the way
:func:`~tunelab.report.appendices.with_storage` appends the storage table;
:func:`with_best_headroom` adds the headroom sentence to ``best``. A study whose machine has
no stored profile is never refused: the views say how to measure one. The fractions the runs
measured themselves (the figure of merit ``bound_fraction``, :mod:`tunelab.report.inrun`)
are shown beside these, labelled as measured in the run, with or without a profile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunelab.report.formats import point_label
from tunelab.report.inrun import (
    inrun_best_lines,
    inrun_bounds,
    inrun_cell,
    inrun_doc,
    inrun_point_lines,
)
from tunelab.report.output import Block, Cell, Column, Lines, Summary, TextTable, View

if TYPE_CHECKING:
    from tunelab.bounds.headroom import Headroom, HeadroomItem
    from tunelab.report.results import StudyResults
    from tunelab.stats import BestResult

__all__ = ["headroom_doc", "headroom_lines", "headroom_of", "headroom_report",
           "with_best_headroom", "with_headroom"]

_LIMIT_WORDS = {"gemm": "arithmetic", "memory": "memory's", "storage": "storage's"}
_CSV_FIELDS = ("fraction_of_bound", "bound_kind", "bound")
_INRUN_WORDS = ("each run's rate / the limit it timed itself while it ran (figure of merit "
                "bound_fraction): the mean over the point's runs (lowest-highest)")


def _workload_and_options(results: StudyResults) -> tuple[Any, dict[str, Any]] | None:
    from tunelab.errors import WorkloadError
    from tunelab.workload import get_workload

    spec = results.spec.get("workload") if isinstance(results.spec, Mapping) else None
    if not isinstance(spec, Mapping) or not spec.get("name"):
        return None
    try:
        cls = get_workload(str(spec["name"]))
    except WorkloadError:
        return None
    given = dict(spec.get("options") or {})
    try:  # the defaults the runs ran with
        options = cls.Options.model_validate(given).model_dump()
    except ValueError:
        options = given
    return cls, options


def headroom_of(results: StudyResults) -> tuple[Headroom | None, str]:
    """The study's headroom and a line on where its bounds come from (or how to measure
    them); ``(None, "")`` when the workload declares no work."""
    from tunelab.bounds.headroom import study_headroom
    from tunelab.bounds.profile import load_profile
    from tunelab.errors import TunelabError
    from tunelab.sysinfo import fingerprint

    found = _workload_and_options(results)
    if found is None or not len(results.runs):
        return None, ""
    cls, options = found
    machine = fingerprint(results.sysinfo) if results.sysinfo else ""
    problem = ""
    profile = None
    if machine:
        try:
            profile = load_profile(machine)
        except TunelabError as exc:
            problem = f" ({exc})"
    data = study_headroom(results.runs, cls, options, profile)
    if data is None:
        return None, ""
    host = results.sysinfo.get("host", "this machine") if results.sysinfo else "its machine"
    if profile is None:
        where = (f"{host} (machine {machine})" if machine else "the machine (the study stored "
                 "no snapshot of it)")
        if inrun_bounds(results.runs):
            return data, (f"Fraction of bound: no `tunelab bounds` profile for {where}"
                          f"{problem}, so the fractions shown are the runs' own, measured in "
                          "the run; `tunelab bounds` there measures a profile to judge them "
                          "against as well (`--quick`: under a minute).")
        return data, (f"Fraction of bound: no bounds measured for {where}{problem}; run "
                      "`tunelab bounds` there to measure them (`--quick`: under a minute).")
    load = " -> ".join(f"{x:.2f}" for x in profile.loadavg)
    return data, (f"Fraction of bound: each point's rate / the limit `tunelab bounds` measured "
                  f"on {host} (machine {machine}, {profile.taken_at}, load average {load})"
                  + (" (the in-run fraction is the runs' own figure, not this profile's)."
                     if inrun_bounds(results.runs) else "."))


def _rate(value: float, unit: str) -> str:
    from tunelab.report.bounds import rate_text

    return rate_text(value, unit) if math.isfinite(value) else "–"


def _item_doc(i: HeadroomItem) -> dict[str, Any]:
    b = i.bound
    return {"kind": i.kind, "what": i.what, "rate": i.rate, "amount": i.amount,
            "fraction": i.fraction, "fraction_min": i.low, "fraction_max": i.high, "n": i.n,
            "bound": None if b is None else {"label": i.label, "value": b.value,
                                             "unit": b.unit, "variant": dict(b.variant)},
            "approximations": list(i.approx),
            "oneway_fraction": i.oneway if i.oneway_bound is not None else None,
            "oneway_bound": None if i.oneway_bound is None else i.oneway_bound.value}


def headroom_doc(data: Headroom | None, line: str) -> dict[str, Any]:
    """The ``headroom`` key of a JSON document."""
    profile = data.profile if data else None
    return {"profile": None if profile is None else {
                "fingerprint": profile.fingerprint, "taken_at": profile.taken_at,
                "machine": dict(profile.machine), "quick": profile.quick},
            "line": line or None,
            "points": [] if data is None else [
                {"point": dict(p.params), "label": point_label(dict(p.params)),
                 "items": [_item_doc(i) for i in p.items]} for p in data.points.values()]}


def _cell(items: tuple[HeadroomItem, ...], kinds: int) -> str:
    judged = [i for i in items if i.bound is not None and math.isfinite(i.fraction)]
    if not judged:
        return ""
    top = max(judged, key=lambda i: i.fraction)
    return f"{top.fraction:.2f}" + (f" {top.kind}" if kinds > 1 else "")


def _bound_notes(data: Headroom) -> list[str]:
    """One line per bound the study's points are judged against."""
    seen: dict[str, str] = {}
    missing: dict[str, None] = {}
    for p in data.points.values():
        for i in p.items:
            if i.bound is None:
                size = (i.variant or {}).get("message_bytes") if i.kind == "link" else None
                hint = (f" (`tunelab bounds --only link --stacks {(i.variant or {}).get('stack')}"
                        f" --sizes {int(float(size))}` measures it)" if size else "")
                missing.setdefault(f"{i.what}: no measured bound fits {i.label}{hint}", None)
                continue
            text = f"of bound: {i.what} / {i.label} = {_rate(i.bound.value, i.bound.unit)}"
            if i.bound.disturbed:
                text += f" (measured while {i.bound.disturbed}: it may be low)"
            if i.oneway_bound is not None:
                text += f" (one way: {_rate(i.oneway_bound.value, i.oneway_bound.unit)})"
            if i.approx:
                text += f"; nearest measured: {', '.join(i.approx)}"
            seen.setdefault(i.label + i.what, text)
    return list(seen.values()) + list(missing) + _above_notes(data)


def _above_notes(data: Headroom) -> list[str]:
    """One line per kind of work some points did faster than its bound allows (a fraction
    above :data:`~tunelab.bounds.match.ABOVE`): which points, and why the bound may not
    hold for them."""
    from tunelab.bounds.match import ABOVE, headroom_word

    above: dict[str, list[str]] = {}
    for p in data.points.values():
        for i in p.items:
            if i.bound is not None and math.isfinite(i.fraction) and i.fraction > ABOVE:
                above.setdefault(i.kind, []).append(
                    f"{point_label(dict(p.params))} {i.fraction:.2f}")
    return [f"above the {kind} bound: {', '.join(points)}: {headroom_word(ABOVE + 1, kind)}"
            for kind, points in above.items()]


def with_headroom(view: View, results: StudyResults) -> View:
    """``compare``'s view with an ``of bound`` column, the fractions in its JSON document
    (``headroom``, and ``bounds`` per point) and CSV records, and the notes saying which
    bound each fraction divides by; with an ``in-run of bound`` column (``inrun_bound`` in
    JSON, ``inrun_bound_fraction`` in CSV) where the runs measured their own; unchanged for
    a workload that declares neither."""
    data, line = headroom_of(results)
    own = {point_label(dict(i.params)): i for i in inrun_bounds(results.runs).values()}
    if not line and not own:
        return view
    kinds = len(data.kinds) if data else 0
    by_label = ({point_label(dict(p.params)): p for p in data.points.values()}
                if data else {})
    profiled = data is not None and data.profile is not None
    blocks: list[Block] = []
    for n, block in enumerate(view.blocks):
        if n == 0 and isinstance(block, TextTable) and (profiled or own):
            rows: list[Mapping[str, Cell]] = []
            for row in block.rows:
                label = str(row.get("point", ""))
                p = by_label.get(label)
                extra: dict[str, Cell] = {"inrun": inrun_cell(own.get(label))} if own else {}
                if profiled:
                    extra["bound"] = _cell(p.items, kinds) if p else ""
                rows.append({**row, **extra})
            columns = (*block.columns,
                       *((Column("inrun", "in-run of bound", "right"),) if own else ()),
                       *((Column("bound", "of bound", "right"),) if profiled else ()))
            notes: tuple[str, ...] = ((f"in-run of bound: {_INRUN_WORDS}",) if own else ())
            if profiled and data is not None:
                notes += (line, *_bound_notes(data))
            block = TextTable(block.title, columns, tuple(rows), (*block.notes, *notes))
        blocks.append(block)
    if line and not profiled:
        blocks.append(Lines((line,)))
    document = dict(view.document)
    if line:
        document["headroom"] = headroom_doc(data, line)
    if own:
        document["inrun_bound"] = inrun_doc(inrun_bounds(results.runs))
    records = []
    for record in view.records:
        label = str(record.get("label", ""))
        p = by_label.get(label)
        top = p.binding if p else None
        extra_record: dict[str, Any] = {}
        if line:
            extra_record.update(fraction_of_bound=top.fraction if top else None,
                                bound_kind=top.kind if top else None,
                                bound=top.label if top else None)
        if own:
            mine = own.get(label)
            extra_record["inrun_bound_fraction"] = mine.mean if mine and mine.n else None
        records.append({**record, **extra_record})
    wanted = (*(_CSV_FIELDS if line else ()), *(("inrun_bound_fraction",) if own else ()))
    fields = (*view.fields, *(f for f in wanted if f not in view.fields)) \
        if view.fields else ()
    return View(tuple(blocks), document, tuple(records), fields)


def headroom_lines(data: Headroom | None, line: str, best: BestResult | None) -> list[str]:
    """The headroom sentence of the best point and ``line`` (where the bounds come from),
    from :func:`headroom_of`."""
    if not line:
        return []
    if data is None or data.profile is None or best is None:
        return [line]
    p = data.points.get(best.best.point)
    top = p.binding if p else None
    if top is None or top.bound is None:
        return [f"Headroom: the best point's work fits no measured bound. {line}"]
    limit = _limit_words(top)
    text = (f"Headroom: the best point ({point_label(best.best.params)}) is at "
            f"{top.fraction:.2f} of the {limit} ({top.label}: "
            f"{_rate(top.bound.value, top.bound.unit)}")
    if top.oneway_bound is not None and math.isfinite(top.oneway):
        text += (f"; {top.oneway:.2f} of the one-way "
                 f"{_rate(top.oneway_bound.value, top.oneway_bound.unit)}")
    from tunelab.bounds.match import headroom_word

    return [f"{text}): {headroom_word(top.fraction, top.kind)}.", line]


def _limit_words(item: HeadroomItem) -> str:
    if item.kind == "link" and item.bound is not None:
        pattern = str(item.bound.variant.get("pattern"))
        return {"alltoall": "link's all-to-all (both ways) limit",
                "bothways": "link's both-ways limit",
                "oneway": "link's one-way limit"}.get(pattern, "link's limit")
    if item.kind == "gemm" and item.bound is not None:
        return f"{item.bound.variant.get('precision')} arithmetic limit"
    return f"{_LIMIT_WORDS.get(item.kind, item.kind)} limit"


def with_best_headroom(view: View, results: StudyResults, best: BestResult | None) -> View:
    """``best``'s view with the headroom sentence (a :class:`Summary`: Markdown shows its
    figures as a table) and a ``headroom`` key; before it, the best point's in-run fraction
    of bound (an ``inrun_bound`` key) where its runs measured one."""
    data, line = headroom_of(results)
    lines = headroom_lines(data, line, best)
    view = _with_best_inrun(view, results, best)
    if not lines:
        return view
    document = {**view.document, "headroom": {**headroom_doc(data, line),
                                              "sentence": lines[0]}}
    records = view.records
    p = data.points.get(best.best.point) if best is not None and data is not None else None
    top = p.binding if p else None
    block: Block = Lines(tuple(lines))
    if top is not None and top.bound is not None:
        block = Summary(lines[0], {"of bound": f"{top.fraction:.2f}", "bound": top.label,
                                   "limit": _rate(top.bound.value, top.bound.unit)},
                        tuple(lines[1:]))
        if records:
            records = ({**records[0], "fraction_of_bound": top.fraction,
                        "bound": top.label}, *records[1:])
    return View((*view.blocks, block), document, records, view.fields)


def _with_best_inrun(view: View, results: StudyResults, best: BestResult | None) -> View:
    """``view`` with the best point's in-run fraction of bound (a :class:`Summary`), or
    unchanged when its runs recorded none."""
    own = inrun_bounds(results.runs)
    lines = inrun_best_lines(own, best)
    if not lines or best is None:
        return view
    item = own[best.best.point]
    block = Summary(lines[0], {"in-run of bound": item.mean_text,
                               **({"lowest": f"{item.low:.2f}", "highest": f"{item.high:.2f}"}
                                  if item.n else {}),
                               "runs": str(item.n),
                               **({"above 1, left out": str(len(item.above))}
                                  if item.above else {})})
    document = {**view.document, "inrun_bound": {**inrun_doc(own), "sentence": lines[0]}}
    records = view.records
    if records:
        records = ({**records[0], "inrun_bound_fraction": item.mean if item.n else None},
                   *records[1:])
    return View((*view.blocks, block), document, records, view.fields)


def headroom_report(results: StudyResults, best: BestResult | None,
                    path: Path) -> tuple[list[str], tuple[Path, str] | None]:
    """The HTML report's headroom: its sentences (the best point's, where the bounds come
    from, which bound each fraction divides by) and a figure with its caption beside
    ``path`` (``<stem>-headroom.png``: a roofline, else fractions of bound), or None."""
    from tunelab.report.roofline import headroom_plot, roofline_data

    data, line = headroom_of(results)
    own = inrun_bounds(results.runs)
    lines = [*inrun_best_lines(own, best), *inrun_point_lines(own),
             *headroom_lines(data, line, best)]
    if data is None or data.profile is None:
        return lines, None
    lines += _bound_notes(data)
    png = headroom_plot(data, path.with_name(f"{path.stem}-headroom.png"))
    if png is None:
        return lines, None
    if roofline_data(data):
        caption = ("Roofline: each point's FLOP/s against its FLOPs per byte, under the "
                   "machine's roofs (the GEMM bound, flat; the byte bound x intensity, "
                   "slanted), as `tunelab bounds` measured them.")
    else:
        caption = ("Each point's mean rate as a fraction of the machine's limit it leans on "
                   "most (1 = the limit `tunelab bounds` measured; 0.8 and above: little room "
                   "left).")
    return lines, (png, caption)
