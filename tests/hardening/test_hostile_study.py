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


def test_a_damaged_run_environment_is_exported_as_its_text(cli):
    """A store whose runs' env text is no JSON object (nested 50,000 deep, cut short)
    exports it as it is, in CSV and JSON: never a RecursionError traceback."""
    import json
    import sqlite3

    ran = cli.run({"s.yaml": command_study(ECHO, params="x: [1, 2]")}, ["run", "s.yaml", "-q"])
    assert_clean(ran, 0)
    deep, cut = "[" * 50_000, '{"A": "1"'
    with sqlite3.connect(f"{ran['dir']}/runs/s/tunelab.db") as conn:
        conn.executemany("UPDATE runs SET env = ? WHERE id = ?", [(deep, 1), (cut, 2)])
    conn.close()
    for fmt in ("csv", "json"):
        answer = cli.run({}, ["export", "runs/s", "-f", fmt, "-o", f"runs.{fmt}"],
                         cwd=ran["dir"])
        assert_clean(answer, 0)
    frame = pd.read_csv(f"{ran['dir']}/runs.csv")
    assert frame["run_env"].tolist() == [deep, cut]
    runs = json.loads(Path(f"{ran['dir']}/runs.json").read_text())
    assert [r["env"] for r in runs] == [deep, cut]


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


# --- values outside the study language: complex numbers, formats that do not fit -------------


@pytest.mark.parametrize("command", EVERY_LOAD)
@pytest.mark.parametrize(("extra", "line", "fragment"), [
    ("derived: {c: '(-1) ** 0.5'}\n", 6, "derived value 'c' cannot be computed: "),
    ("constraints: ['(-1) ** 0.5']\n", 6, "constraint '(-1) ** 0.5' cannot be evaluated: "),
    ("constraints: ['(x, x)']\n", 6, "gives (1, 1), a tuple: an expression's value must be"),
])
def test_an_expression_whose_value_is_complex_is_refused_alike_everywhere(cli, command, extra,
                                                                          line, fragment):
    text = command_study(["echo", "{x}"], params="x: [1, 2]", extra=extra)
    answer = cli.run({"s.yaml": text}, [*command, "s.yaml"])
    assert_clean(answer, 2, f"s.yaml:{line}: no valid point", fragment)
    if "tuple" not in fragment:
        assert "is a complex number" in answer["stderr"]


@pytest.mark.parametrize("command", EVERY_LOAD)
def test_a_format_that_does_not_fit_a_derived_value_is_refused_alike_everywhere(cli, command):
    text = ("name: s\nworkload:\n  name: command\n  options:\n    argv:\n      - echo\n"
            "      - '{c:>5d}'\nparameters: {x: [1, 2]}\nderived: {c: 'x / 2'}\n"
            "repeats: 1\ntimeout: 60\n")
    answer = cli.run({"s.yaml": text}, [*command, "s.yaml"])
    assert_clean(answer, 2, "s.yaml:7: workload 'command': point x=1: argv[1] '{c:>5d}' "
                            "cannot format c=0.5: Unknown format code 'd'")


# --- names expressions cannot read, values that print alike ----------------------------------


@pytest.mark.parametrize("command", EVERY_LOAD)
@pytest.mark.parametrize(("name", "why"), [
    ("True", "expressions read True as the constant, never as the parameter"),
    ("if", "'if' is a Python keyword, which no expression can use as a name"),
])
def test_a_parameter_named_as_a_constant_or_keyword_is_refused(cli, command, name, why):
    text = command_study(["echo", "{x}"], params=f"'{name}': [1, 2], x: [1]",
                         extra=f"constraints: ['{name} > 1']\n" if name == "True" else "")
    answer = cli.run({"s.yaml": text}, [*command, "s.yaml"])
    assert_clean(answer, 2, f"s.yaml:3: parameter {name!r} cannot be named so: {why}")


def test_an_int_and_a_string_of_the_same_digits_print_apart_in_compare_and_best(cli):
    text = command_study(["echo", "{x}"], params="x: [0, '0']")
    ran = cli.run({"s.yaml": text}, ["run", "s.yaml", "-q"])
    assert_clean(ran, 0)
    assert "x=0 " in ran["stdout"] and "x='0' " in ran["stdout"], ran["stdout"]
    best = cli.run({}, ["best", "runs/s"], cwd=ran["dir"])
    assert_clean(best, 0)
    labels = {line.split(": ", 1)[1].split(" —")[0] for line in best["stdout"].splitlines()
              if line.startswith(("Best point: ", "Runner-up: "))}
    assert labels == {"x=0", "x='0'"}, best["stdout"]


# --- the file named as the user named it -----------------------------------------------------


@pytest.mark.parametrize(("options", "fragment"), [
    ("bogus: 1", "s.yaml:2: workload 'command' option 'bogus'"),
    ("foms: {v: '(\\S+)'}", "s.yaml:6: constraint 'y > 1'"),
])
def test_errors_found_after_reading_name_the_file_as_given(cli, options, fragment):
    """Errors found while the file was read and those found later (a workload's options, a
    constraint's names) name the file alike: as the command line gave it, not resolved."""
    text = command_study(ECHO, options=options, extra="constraints: ['y > 1']\n")
    answer = cli.run({"s.yaml": text}, ["space", "s.yaml"])
    assert_clean(answer, 2, fragment)
    assert answer["stderr"].startswith(f"tunelab: error: {fragment}")
