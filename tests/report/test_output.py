"""The output layer: plain lines never wrap, terminals drop columns instead of cutting values,
JSON/CSV/Markdown are well formed."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest

from tunelab.errors import TunelabError
from tunelab.report.output import TERMINAL_ROWS, Column, Lines, TextTable, View, emit, render

LONG = "np=16 npool=8 ndiag=4 env=a_rather_long_environment_set_name threads=4"


def sample_view() -> View:
    columns = (
        Column("rank", "#", "right", drop=3),
        Column("point", "point", wrap=True),
        Column("mean", "mean ± sd", "right", drop=2),
        Column("median", "median", "right", drop=1),
        Column("speedup", "speedup", "right"),
        Column("verdict", "verdict"),
    )
    rows = (
        {"rank": "1", "point": LONG, "mean": "0.2067 ± 0.021", "median": "0.2031",
         "speedup": "1.645×", "verdict": ("faster", "bold green")},
        {"rank": "2", "point": "np=1", "mean": "0.34 ± 0.01", "median": "0.3399",
         "speedup": "1 (baseline)", "verdict": "baseline"},
        {"rank": "3", "point": "np=2 npool=2", "mean": "0.5 ± 0.2", "median": "",
         "speedup": "0.628×", "verdict": ("indistinguishable", "yellow")},
    )
    table = TextTable("wall_s (minimize)", columns, rows, ("a note | with a pipe",))
    return View((Lines(("headline sentence",)), table),
                {"points": [{"mean": 0.2067, "sd": math.nan}], "inf": math.inf},
                ({"point": "np=1", "mean": 0.34, "extra": {"a": 1}}, {"point": "np=2"}))


def test_plain_text_is_one_record_per_line_whatever_the_content():
    text = render(sample_view(), "text")
    lines = text.splitlines()
    row = next(line for line in lines if "faster" in line)
    # the whole record is on one line: point, mean ± sd, speedup and verdict together
    assert LONG in row and "0.2067 ± 0.021" in row and "1.645×" in row
    assert all(line == line.rstrip() for line in lines), "no trailing padding"
    assert "\x1b[" not in text, "no colour codes"
    # columns are aligned by content: every row's verdict starts under the header's
    header = next(line for line in lines if line.startswith("#"))
    column = header.index("verdict")
    for verdict in ("faster", "indistinguishable"):
        assert next(line for line in lines if verdict in line).index(verdict) == column
    assert next(line for line in lines if "np=1 " in line).rindex("baseline") == column


def test_plain_text_leaves_out_columns_that_are_empty_everywhere():
    view = View((TextTable("t", (Column("a", "A"), Column("b", "B")),
                           ({"a": "x", "b": ""},)),), {})
    assert render(view, "text").splitlines()[1] == "A"


@pytest.mark.parametrize("width", [40, 60, 80, 200])
def test_terminal_never_cuts_a_value_and_names_dropped_columns(width):
    out = io.StringIO()
    emit(sample_view(), "text", stream=out, terminal=True, width=width)
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width
    for value in ("1.645×", "1 (baseline)", "indistinguishable", "faster"):
        assert value in text, f"{value!r} was cut at width {width}"
    # the point wraps only between its k=v words, never inside one
    for word in LONG.split():
        assert word in text
    if width == 80:  # the table still fits without the least useful columns
        assert "left out at this width: median, mean ± sd;" in text
    if width < 73:  # too narrow for point + speedup + verdict: a record per block, all kept
        assert "speedup: 1.645×" in text and "mean ± sd: 0.2067 ± 0.021" in text
    if width == 200:
        assert "left out" not in text and "0.2067 ± 0.021" in text


def test_json_writes_nan_and_infinity_as_null():
    doc = json.loads(render(sample_view(), "json"))
    assert doc["points"][0]["sd"] is None and doc["inf"] is None


def test_csv_has_one_row_per_record_and_nested_values_as_json():
    rows = list(csv.DictReader(io.StringIO(render(sample_view(), "csv"))))
    assert [r["point"] for r in rows] == ["np=1", "np=2"]
    assert json.loads(rows[0]["extra"]) == {"a": 1} and rows[1]["mean"] == ""


def test_markdown_escapes_pipes_and_aligns_numbers_right():
    text = render(sample_view(), "markdown")
    assert "| # | point | mean ± sd | median | speedup | verdict |" in text
    assert "|---:|---|---:|---:|---:|---|" in text
    assert "a note \\| with a pipe" in text


def test_unknown_format_is_a_one_line_error():
    with pytest.raises(TunelabError, match="valid: text, json, csv, markdown"):
        render(sample_view(), "yaml")


@pytest.mark.parametrize("width", [40, 200])
def test_terminal_shows_the_first_rows_of_a_long_table_and_says_how_to_see_all(width):
    """A study of thousands of points printed every row to a terminal (52,000 lines of
    records for 4,000 points at 120 columns, 14 s of rich), with no word of it."""
    columns = (Column("rank", "#", "right"), Column("point", "point", wrap=True),
               Column("verdict", "verdict"))
    rows = tuple({"rank": str(i), "point": f"np={i} {LONG}", "verdict": "faster"}
                 for i in range(1, 1001))
    view = View((TextTable("t", columns, rows, ("a note",)),), {})
    out = io.StringIO()
    emit(view, "text", stream=out, terminal=True, width=width)
    text = out.getvalue()
    assert f"np={TERMINAL_ROWS} " in text and f"np={TERMINAL_ROWS + 1} " not in text
    assert (f"({1000 - TERMINAL_ROWS:,} more rows not shown on a terminal: a pipe (| less), "
            "a file or --format csv|json|markdown gives all 1,000)") in " ".join(text.split())
    assert "a note" in text
    plain = render(view, "text")  # a pipe or a file: every row
    assert "np=1000 " in plain and "more rows" not in plain
