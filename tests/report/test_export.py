"""``tunelab export``'s Parquet table: every valid study's runs can be written."""

from __future__ import annotations

import io

import pandas as pd
import pytest

from tunelab.report.export import parquet_frame


@pytest.mark.parametrize(("values", "text"), [
    ([1, "fast", None], ["1", "fast", None]),          # a parameter of mixed types
    ([99999999999999999999999999, 2], ["99999999999999999999999999", "2"]),  # beyond int64
    ([0, True], ["0", "True"]),                          # an integer and a boolean
    ([1.5, "x", float("nan")], ["1.5", "x", None]),
])
def test_a_column_parquet_cannot_type_is_written_as_strings(values, text):
    frame = pd.DataFrame({"x": pd.Series(values, dtype=object), "fom.v": [1.0] * len(values)})
    buffer = io.BytesIO()
    parquet_frame(frame).to_parquet(buffer, index=False)
    back = pd.read_parquet(io.BytesIO(buffer.getvalue()))
    assert [None if v is None or v != v else v for v in back["x"]] == text
    assert back["fom.v"].tolist() == [1.0] * len(values)  # other columns keep their type


def test_columns_of_one_type_keep_it():
    frame = pd.DataFrame({"n": pd.Series([1, 2**62], dtype=object),
                          "s": pd.Series(["a", None], dtype=object)})
    buffer = io.BytesIO()
    parquet_frame(frame).to_parquet(buffer, index=False)
    back = pd.read_parquet(io.BytesIO(buffer.getvalue()))
    assert back["n"].tolist() == [1, 2**62] and back["s"].tolist()[0] == "a"
