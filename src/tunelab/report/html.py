"""One self-contained HTML report: inline CSS, images as base64 data URIs, no external asset.

Every value is escaped by jinja2's autoescape, so a parameter value such as
``<script>`` prints as text.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from tunelab.errors import TunelabError
from tunelab.report.output import Block, TextTable
from tunelab.report.results import failed_runs
from tunelab.report.table import (
    against_baseline,
    baseline_line,
    best_lines,
    table_rows,
)
from tunelab.stats import BestResult, PointComparison, PointSummary

if TYPE_CHECKING:
    import pandas as pd

    from tunelab.crossstudy import StudyComparison
    from tunelab.workload import Objective

__all__ = ["Image", "ImageSource", "render_html_report", "write_html_report"]

_MIME = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}


class Image(NamedTuple):
    """An embedded image: its caption (a sentence), alternative text and ``data:`` URI."""

    caption: str
    alt: str
    data_uri: str


ImageSource = str | Path | tuple[str | Path, str]
"""An image file, or ``(file, caption)``: without a caption, one is made from the file name."""


def _embed(source: ImageSource) -> Image:
    if isinstance(source, tuple):
        path, caption = Path(source[0]), source[1]
    else:
        path, caption = Path(source), ""
    mime = _MIME.get(path.suffix.lower())
    if mime is None:
        raise TunelabError(
            f"cannot embed {path}: image type {path.suffix or '(none)'} is not one of "
            f"{', '.join(sorted(_MIME))}"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TunelabError(f"cannot read image {path}: {exc.strerror}") from exc
    alt = path.stem.replace("_", " ").replace("-", " ")
    return Image(caption or alt.capitalize() + ".", alt,
                 f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}")


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=False, default=str, ensure_ascii=False)


def _flat(snapshot: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Snapshot rows; a mapping value (package and program versions) as ``name: version``
    lines, programs first so the workload's own version (pw.x, torch, UCX) is easy to find."""
    rows = []
    order = sorted(snapshot, key=lambda k: (k not in ("tools", "packages"), k != "tools"))
    for key in order:
        value = snapshot[key]
        if isinstance(value, Mapping):
            text = "\n".join(f"{k}: {v}" for k, v in value.items())
        elif isinstance(value, str):
            text = value
        else:
            text = _pretty(value)
        title = {"tools": "programs", "packages": "Python packages"}.get(str(key), str(key))
        rows.append((title, text))
    return rows


_CSS_OF_STYLE = {"bold green": "v-better", "bold red": "v-worse", "yellow": "v-indistinguishable",
                 "dim": "v-insufficient", "bold": "v-baseline", "red": "notok"}


def _html_tables(blocks: Sequence[Block]) -> list[dict[str, Any]]:
    """The text tables among ``blocks`` (a :class:`~tunelab.report.output.View`'s) as
    template data."""
    tables = []
    for block in blocks:
        if not isinstance(block, TextTable):
            continue
        columns = [c for c in block.columns if any(r.get(c.key) for r in block.rows)]
        rows = []
        for row in block.rows:
            cells = []
            for col in columns:
                cell = row.get(col.key, "")
                text, style = (cell, "") if isinstance(cell, str) else cell
                css = " ".join(filter(None, ["text" if col.align == "left" else "",
                                             _CSS_OF_STYLE.get(style, "")]))
                cells.append({"text": text, "css": css})
            rows.append(cells)
        tables.append({"title": block.title, "columns": columns, "rows": rows,
                       "notes": list(block.notes)})
    return tables


def _cross_section(cross: StudyComparison | None) -> dict[str, Any] | None:
    if cross is None:
        return None
    from tunelab.report.views import cross_compare_view

    tables = _html_tables(cross_compare_view(cross).blocks)
    title = tables[0]["title"]
    tables[0]["title"] = ""
    return {"heading": f"Against study {cross.name_a!r}", "title": title, "tables": tables}


def _p_header(comparisons: Sequence[PointComparison]) -> str:
    """The tests and adjustment behind the p column, e.g. ``paired t, pooled noise;
    adjusted: Holm``."""
    from tunelab.report.views import p_header

    tests, adjustment = p_header([pc.comparison for pc in comparisons if not pc.is_baseline])
    return f"{tests}; adjusted: {adjustment}" if tests else "no test yet"


def render_html_report(
    *,
    title: str,
    objective: Objective | None = None,
    study_spec: Mapping[str, Any] | str | None = None,
    study_file: str = "",
    sysinfo: Mapping[str, Any] | None = None,
    summaries: Sequence[PointSummary] = (),
    comparisons: Sequence[PointComparison] = (),
    best: BestResult | None = None,
    images: Sequence[ImageSource] = (),
    runs: pd.DataFrame | None = None,
    notes: Sequence[str] = (),
    cross: StudyComparison | None = None,
    tables: Sequence[TextTable] = (),
) -> str:
    """The report as an HTML string (see :func:`write_html_report`)."""
    import jinja2

    from tunelab.report.views import ci_caption, fom_title
    from tunelab.workload import Objective

    if objective is None:
        objective = (
            Objective(best.fom, best.direction)  # type: ignore[arg-type]
            if best is not None
            else Objective("wall_s", "minimize")
        )
    items: Sequence[PointComparison] | Sequence[PointSummary] = comparisons or summaries
    rows = table_rows(items, objective) if items else []
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("tunelab.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    template = env.get_template("report.html.j2")
    n_runs = len(runs) if runs is not None else sum(s.n_total for s in summaries)
    failed = failed_runs(runs)
    return template.render(
        title=title,
        fom=fom_title(objective),
        direction=objective.direction,
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        best_lines=best_lines(best, unit=objective.unit) if best is not None else [],
        # the sentence best_lines would say after the best point leads the section instead
        headline=(baseline_line(*against_baseline(best, comparisons), best.fom,
                                best.direction) if best is not None else ""),
        best_verdict=(best.comparison.verdict.value if best and best.comparison else ""),
        compared=bool(comparisons),
        confidence=comparisons[0].comparison.confidence if comparisons else 0.95,
        p_header=_p_header(comparisons),
        ci_header=ci_caption(
            comparisons, comparisons[0].comparison.confidence if comparisons else 0.95),
        any_disturbed=any(row.disturbed for row in rows),
        noise=comparisons[0].comparison.noise_threshold if comparisons else 0.02,
        rows=rows,
        images=[_embed(source) for source in images],
        failed=failed,
        n_runs=n_runs,
        sysinfo=_flat(sysinfo or {}),
        study_spec=(study_spec if isinstance(study_spec, str)
                    else _pretty(dict(study_spec)) if study_spec else ""),
        study_file=study_file,
        notes=list(notes),
        cross=_cross_section(cross),
        tables=_html_tables(tables),
    )


def write_html_report(
    path: str | Path,
    *,
    title: str,
    study_spec: Mapping[str, Any] | str | None = None,
    study_file: str = "",
    sysinfo: Mapping[str, Any] | None = None,
    summaries: Sequence[PointSummary] = (),
    comparisons: Sequence[PointComparison] = (),
    best: BestResult | None = None,
    images: Sequence[ImageSource] = (),
    runs: pd.DataFrame | None = None,
    objective: Objective | None = None,
    notes: Sequence[str] = (),
    cross: StudyComparison | None = None,
    tables: Sequence[TextTable] = (),
) -> Path:
    """Write one self-contained HTML report and return its path.

    Sections: the verdict (from ``best``), the ranked table (``comparisons`` if given,
    else ``summaries``), the plots (``images``, embedded), failed runs with their reasons
    (from ``runs``), the machine snapshot (``sysinfo``) and the study (``study_spec``: the
    user's YAML text, or the parsed mapping). ``notes`` are shown under the verdict;
    ``objective`` defaults to the one of ``best``; ``cross`` adds a section judging this
    study against another one; ``tables`` (e.g. the byte rates per point) follow the
    ranked table, each a section of its own.
    """
    html = render_html_report(
        title=title,
        objective=objective,
        study_spec=study_spec,
        study_file=study_file,
        cross=cross,
        sysinfo=sysinfo,
        summaries=summaries,
        comparisons=comparisons,
        best=best,
        images=images,
        runs=runs,
        notes=notes,
        tables=tables,
    )
    path = Path(path)
    try:
        path.write_text(html, encoding="utf-8")
    except OSError as exc:
        raise TunelabError(f"cannot write report {path}: {exc.strerror}") from exc
    return path
