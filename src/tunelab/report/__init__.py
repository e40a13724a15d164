"""Reports of a study: terminal tables (rich), plots (matplotlib, Agg) and one HTML file.

Each renderer has a pure data step beside it (:func:`table_rows`, :func:`speedup_bars`,
:func:`fom_by_point`, :func:`failed_runs`) so the numbers are tested without drawing.
matplotlib and jinja2 are imported only when a plot or an HTML file is made.
"""

from __future__ import annotations

from tunelab.report.build import ReportFiles, write_study_report
from tunelab.report.html import failed_runs, render_html_report, write_html_report
from tunelab.report.plots import (
    fom_by_point,
    fom_by_point_chart,
    speedup_bar_chart,
    speedup_bars,
)
from tunelab.report.table import TableRow, best_lines, best_panel, summary_table, table_rows

__all__ = [
    "ReportFiles",
    "TableRow",
    "best_lines",
    "best_panel",
    "failed_runs",
    "fom_by_point",
    "fom_by_point_chart",
    "render_html_report",
    "speedup_bar_chart",
    "speedup_bars",
    "summary_table",
    "table_rows",
    "write_html_report",
    "write_study_report",
]
