"""The study-file defects of field test s38 (hostile inputs): parameter values Parquet
cannot type, FOM names that are reserved, empty or unknown, expressions whose value is no
value of the study language, parameter names expressions cannot read, and point labels that
read alike. Each ends in one line naming the file and line, the same in ``space``,
``run --dry-run`` and ``run`` — or, for the export and the labels, in a correct output.

Every case runs the real command line (in the worker process, see ``worker.py``).
"""

from __future__ import annotations

import pandas as pd
import pytest

from tests.hardening.conftest import assert_clean, command_study

ECHO = ["echo", "{x}"]
EVERY_LOAD = [["space"], ["run", "--dry-run"], ["run", "-q"]]


@pytest.mark.parametrize(("params", "text"), [
    ("x: [1, fast]", ["1", "fast"]),
    ("x: [99999999999999999999999999, 2]", ["99999999999999999999999999", "2"]),
])
def test_parquet_export_writes_a_column_of_mixed_or_huge_values_as_strings(cli, params,
                                                                         text):
    ran = cli.run({"s.yaml": command_study(ECHO, params=params)}, ["run", "s.yaml", "-q"])
    assert_clean(ran, 0)
    answer = cli.run({}, ["export", "runs/s", "-f", "parquet", "-o", "runs.parquet"],
                     cwd=ran["dir"])
    assert_clean(answer, 0)
    frame = pd.read_parquet(f"{ran['dir']}/runs.parquet")
    assert sorted(frame["x"]) == sorted(text) and frame["status"].tolist() == ["ok", "ok"]
