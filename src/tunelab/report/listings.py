"""What the listing commands show (``status``, ``space``, ``workloads``), as data: one function
per command builds a :class:`View` (see :mod:`tunelab.report.views` for the result commands).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tunelab.report.formats import point_label
from tunelab.report.output import (
    SCHEMA_VERSION,
    Block,
    Cell,
    Column,
    Lines,
    Summary,
    TextTable,
    View,
)
from tunelab.spec import value_text
from tunelab.store import STATUSES

if TYPE_CHECKING:
    from tunelab.space import SpaceSummary

__all__ = ["FailureLine", "SpaceView", "StatusData", "space_view", "status_view",
           "workloads_view"]


# ---------------------------------------------------------------------------------------
# status


@dataclass(frozen=True)
class FailureLine:
    """A run that was not ok: its point, repeat, status and reason."""

    params: dict[str, Any]
    repeat: int
    status: str
    reason: str


@dataclass(frozen=True)
class LostAttempt:
    """An attempt of a run that the infrastructure lost (a node failure, a cancellation
    from outside, a killed launcher…): the run was submitted again or stored ``lost``."""

    params: dict[str, Any]
    repeat: int
    state: str
    node: str
    reason: str


@dataclass(frozen=True)
class StatusData:
    """How far a study is: planned and stored runs, counts per status, latest failures."""

    name: str
    directory: str
    planned: int
    counts: dict[str, int]
    failures: tuple[FailureLine, ...]
    jobs: str = ""
    """A line on the study's open batch jobs (empty without any)."""
    lost_total: int = 0
    """Attempts the infrastructure lost, in all."""
    lost: tuple[LostAttempt, ...] = ()
    """The latest of them, newest first."""

    @property
    def done(self) -> int:
        """Runs stored, whatever their status."""
        return sum(self.counts.values())


def status_view(data: StatusData) -> View:
    """``study 'x' in DIR: 4/6 runs done (…)`` and the latest failures; in CSV one row of
    progress (runs per status, every status a column), in Markdown its table."""
    detail = ", ".join(f"{n} {s}" for s, n in sorted(data.counts.items())) or "no runs yet"
    headline = (f"study {data.name!r} in {data.directory}: {data.done}/{data.planned} runs "
                f"done ({detail})")
    progress: dict[str, Any] = {"study": data.name, "directory": data.directory,
                                "planned": data.planned, "done": data.done,
                                **{s: data.counts.get(s, 0) for s in STATUSES},
                                **{s: n for s, n in sorted(data.counts.items())
                                   if s not in STATUSES},
                                "jobs": data.jobs}
    figures = {k: str(v) for k, v in progress.items() if k != "jobs"}
    details = tuple(line for line in (data.jobs, _lost_line(data)) if line)
    blocks: list[Block] = [Summary(headline, figures, details)]
    if data.failures:
        blocks.append(TextTable(
            f"latest runs that were not ok ({len(data.failures)})",
            (Column("status", "status"), Column("point", "point", wrap=True),
             Column("repeat", "repeat", "right", drop=1), Column("reason", "reason", wrap=True)),
            tuple({"status": (f.status, "red"), "point": point_label(f.params),
                   "repeat": str(f.repeat), "reason": f.reason} for f in data.failures)))
    if data.lost:
        blocks.append(TextTable(
            f"latest attempts the infrastructure lost ({len(data.lost)} of {data.lost_total})",
            (Column("state", "state"), Column("point", "point", wrap=True),
             Column("repeat", "repeat", "right", drop=1), Column("node", "node", drop=2),
             Column("reason", "reason", wrap=True)),
            tuple({"state": (a.state, "yellow"), "point": point_label(a.params),
                   "repeat": str(a.repeat), "node": a.node, "reason": a.reason}
                  for a in data.lost)))
    failures = [{"point": f.params, "label": point_label(f.params), "repeat": f.repeat,
                 "status": f.status, "reason": f.reason} for f in data.failures]
    lost = [{"point": a.params, "label": point_label(a.params), "repeat": a.repeat,
             "state": a.state, "node": a.node or None, "reason": a.reason} for a in data.lost]
    document = {"schema": "tunelab.status", "version": SCHEMA_VERSION, "study": data.name,
                "directory": data.directory, "planned": data.planned, "done": data.done,
                "counts": dict(sorted(data.counts.items())), "jobs": data.jobs or None,
                "failures": failures,
                "lost_attempts": {"total": data.lost_total, "latest": lost}}
    return View(tuple(blocks), document, (progress,))


def _lost_line(data: StatusData) -> str:
    """What the infrastructure lost, in a line ("" when nothing): a lost attempt is never a
    result, and its run was submitted again (or, its retries spent, stored ``lost``)."""
    if not data.lost_total:
        return ""
    states = sorted({a.state for a in data.lost})
    s = "" if data.lost_total == 1 else "s"
    return (f"the infrastructure lost {data.lost_total} attempt{s} ({', '.join(states)}"
            f"{', …' if data.lost_total > len(data.lost) else ''}): a lost attempt never "
            "counts as a result; its run is submitted again (launcher.retries), then stored "
            "'lost'")


# ---------------------------------------------------------------------------------------
# space


DERIVED_SOURCE = "study (derived)"
"""Where a row of :attr:`SpaceView.exclusions` comes from when it is a derived value that
the workload never takes (or whose expression fails), not a constraint."""


@dataclass(frozen=True)
class SpaceView:
    """What ``tunelab space`` found, as plain data."""

    study: str
    names: tuple[str, ...]
    total: int
    valid: int | None
    """None when the space is too large to enumerate (a sampling search draws from it)."""
    exclusions: tuple[tuple[str, int, str, str], ...]
    """(constraint, points excluded, source, why) per constraint, most first."""
    points: tuple[Mapping[str, Any], ...]
    """The first points shown (``shown`` of ``valid``)."""
    plan: str
    plan_doc: Mapping[str, Any]
    facts: tuple[str, ...] = ()
    """Workload facts worth showing (e.g. the k-point count and where it came from)."""
    estimate: SpaceSummary | None = None
    """Of a space too large to enumerate: what random draws from it found; ``exclusions``
    then count draws (:meth:`~tunelab.space.SpaceSummary.estimated` says them)."""


def space_view(data: SpaceView) -> View:
    """The valid points of a study's space and what each constraint excluded."""
    names = ", ".join(data.names) or "no parameters"
    estimate = data.estimate
    if data.valid is not None:
        counted = (f"{data.valid} valid point{'' if data.valid == 1 else 's'} of {data.total} "
                   f"combinations ({names})")
    elif estimate is not None:
        counted = (f"{data.total:,} combinations ({names}): too many to enumerate; "
                   f"{estimate.estimated(estimate.valid)} of them are valid; the search "
                   "samples them")
    else:
        counted = (f"{data.total:,} combinations ({names}): too many to enumerate, so the "
                   "valid ones are not counted; the search samples them")
    figures = {"combinations": f"{data.total:,}",
               "valid": (f"{data.valid:,}" if data.valid is not None else "not counted"
                         if estimate is None else estimate.estimated(estimate.valid)),
               "parameters": names}
    blocks: list[Block] = [Summary(counted, figures, data.facts)]
    if data.exclusions:
        derived = any(source == DERIVED_SOURCE for _, _, source, _ in data.exclusions)
        blocks.append(TextTable(
            "excluded by constraint" + (" or derived value" if derived else ""),
            (Column("count", "excluded", "right"), Column("constraint", "rule"),
             Column("source", "from", drop=2), Column("why", "why", wrap=True, drop=1)),
            tuple({"count": str(n) if estimate is None else estimate.about(n),
                   "constraint": label, "source": source, "why": why}
                  for label, n, source, why in data.exclusions),
            () if estimate is None else (
                f"estimated: each rule's share of {estimate.drawn:,} combinations drawn at "
                "random",)))
    if data.points:
        more = (data.valid or 0) - len(data.points)
        notes = (f"… and {more} more (--show N to list them)",) if more > 0 else ()
        blocks.append(TextTable(
            f"valid points (first {len(data.points)})" if more > 0 else "valid points",
            tuple(Column(n, n, "right") for n in data.names),
            tuple({n: value_text(p[n]) if n in p else "" for n in data.names}
                  for p in data.points), notes))
    blocks.append(Lines((f"will run {data.plan}",)))
    document = {
        "schema": "tunelab.space", "version": SCHEMA_VERSION, "study": data.study,
        "parameters": list(data.names), "total": data.total, "valid": data.valid,
        "drawn": estimate.drawn if estimate is not None else 0,
        "valid_drawn": estimate.valid if estimate is not None else None,
        "excluded": [{"constraint": c, "count": None if estimate else n,
                      "drawn": n if estimate else None, "source": s, "why": w or None}
                     for c, n, s, w in data.exclusions],
        "points": [dict(p) for p in data.points], "shown": len(data.points),
        "plan": dict(data.plan_doc), "facts": list(data.facts),
    }
    return View(tuple(blocks), document, tuple(dict(p) for p in data.points),
                fields=tuple(data.names))


# ---------------------------------------------------------------------------------------
# workloads


def workloads_view(entries: Mapping[str, Any]) -> View:
    """Installed workloads: name, whether they load, and what each is for (or why not)."""
    rows: list[dict[str, Cell]] = []
    docs = []
    for name, entry in entries.items():
        if isinstance(entry, str):
            rows.append({"name": name, "status": ("unavailable", "red"), "about": entry})
            docs.append({"name": name, "available": False, "description": None,
                         "reason": entry})
        else:
            rows.append({"name": name, "status": "ok", "about": entry.description})
            docs.append({"name": name, "available": True, "description": entry.description,
                         "reason": None})
    table = TextTable("installed workloads",
                      (Column("name", "name"), Column("status", "status", drop=1),
                       Column("about", "description", wrap=True)), tuple(rows))
    document = {"schema": "tunelab.workloads", "version": SCHEMA_VERSION, "workloads": docs}
    return View((table,), document, tuple(docs),
                fields=("name", "available", "description", "reason"))
