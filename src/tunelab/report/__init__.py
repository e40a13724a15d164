"""Reports of a study: views for every output format, plots (matplotlib, Agg) and one HTML file.

Each renderer has a pure data step beside it (:func:`table_rows`, :func:`speedup_bars`,
:func:`fom_by_point`, :func:`failed_runs`, the views of :mod:`tunelab.report.views`) so the
numbers are tested without drawing. The names below are imported on first use, so importing
:mod:`tunelab.report.output` (every CLI command does) pulls in neither pandas nor matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "failed_runs": "results",
    "render_html_report": "html",
    "write_html_report": "html",
    "fom_by_point": "plots",
    "fom_by_point_chart": "plots",
    "speedup_axis": "plots",
    "speedup_bar_chart": "plots",
    "speedup_bars": "plots",
    "StudyResults": "results",
    "load_results": "load",
    "results_from_frame": "results",
    "write_report": "writer",
    "TableRow": "table",
    "best_lines": "table",
    "table_rows": "table",
    "View": "output",
    "emit": "output",
    "render": "output",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tunelab.report' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tunelab.report.{module}"), name)
