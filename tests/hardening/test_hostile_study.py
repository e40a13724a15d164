"""The study-file defects of field test s38 (hostile inputs): parameter values Parquet
cannot type, FOM names that are reserved, empty or unknown, expressions whose value is no
value of the study language, parameter names expressions cannot read, and point labels that
read alike. Each ends in one line naming the file and line, the same in ``space``,
``run --dry-run`` and ``run`` — or, for the export and the labels, in a correct output.

Every case runs the real command line (in the worker process, see ``worker.py``).
"""

from __future__ import annotations

from pathlib import Path

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


# --- FOM names: reserved, empty, unknown -----------------------------------------------------


@pytest.mark.parametrize("command", EVERY_LOAD)
@pytest.mark.parametrize(("foms", "fragment"), [
    ("{wall_s: 'wall_s=(?P<value>\\S+)'}", "FOM 'wall_s': the name is reserved"),
    ("{'': 'wall_s=(?P<value>\\S+)'}", "FOM '': a FOM name must not be empty"),
])
def test_a_fom_the_engine_records_itself_or_an_empty_name_is_refused(cli, command, foms,
                                                                     fragment):
    text = command_study(["echo", "wall_s=1e40"], options=f"foms: {foms}")
    answer = cli.run({"s.yaml": text}, [*command, "s.yaml"])
    assert_clean(answer, 2, "s.yaml:2: workload 'command' option 'foms'", fragment)


@pytest.mark.parametrize("command", EVERY_LOAD)
def test_an_objective_the_workload_never_produces_is_refused_before_any_run(cli, command):
    text = command_study(["echo", "v=5"], options="foms: {v: 'v=(?P<value>\\d)'}",
                         extra="objective: {fom: nosuch}\n")
    answer = cli.run({"s.yaml": text}, [*command, "s.yaml"])
    assert_clean(answer, 2, "s.yaml:6: 'objective.fom' 'nosuch': workload 'command' produces "
                            "no such figure of merit; it produces v, wall_s")
    assert not (Path(answer["dir"]) / "runs").exists()  # nothing ran, no store was made
