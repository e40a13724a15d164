"""Reports of a study: terminal tables (rich), plots (matplotlib, Agg) and one HTML file.

Each renderer has a pure data step beside it (:func:`table_rows`, :func:`speedup_bars`,
:func:`fom_by_point`, :func:`failed_runs`) so the numbers are tested without drawing.
matplotlib and jinja2 are imported only when a plot or an HTML file is made.
"""

from __future__ import annotations

from tunelab.report.html import failed_runs, render_html_report, write_html_report
from tunelab.report.plots import (
    fom_by_point,
    fom_by_point_chart,
    speedup_bar_chart,
    speedup_bars,
)
from tunelab.report.summary import StudyResults, load_results, results_from_frame, write_report
from tunelab.report.table import TableRow, best_lines, best_panel, summary_table, table_rows

__all__ = [
    "StudyResults",
    "TableRow",
    "best_lines",
    "best_panel",
    "failed_runs",
    "fom_by_point",
    "fom_by_point_chart",
    "load_results",
    "render_html_report",
    "results_from_frame",
    "speedup_bar_chart",
    "speedup_bars",
    "summary_table",
    "table_rows",
    "write_html_report",
    "write_report",
]
