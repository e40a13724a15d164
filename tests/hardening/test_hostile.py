"""The hostile inputs of issue 9, one by one: each ends in exit 1 or 2 with one clear line,
within the CPU and memory limits, and leaves no half-written store behind.

Every case runs the real command line (in the worker process, see ``worker.py``); cases that
start programs start real ones.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path

import pytest

from tests.hardening.conftest import PY, assert_clean, command_study, printing, store_rows
from tunelab.limits import LIMITS

ECHO = ["echo", "{x}"]


def alias_bomb(levels: int = 9) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "name: s\nworkload: {name: command, options: {argv: [echo]}}\n" + "\n".join(lines)


# --- study files that are too big, too deep or self-referencing ---------------------------


@pytest.mark.parametrize("command", [["space"], ["run", "--dry-run"], ["run"]])
def test_yaml_alias_bomb_is_refused_before_it_expands(cli, command):
    answer = cli.run({"s.yaml": alias_bomb()}, [*command, "s.yaml"])
    assert_clean(answer, 2, "s.yaml:", "YAML nodes once its aliases are expanded")


@pytest.mark.parametrize(("text", "fragment"), [
    ("name: s\nworkload: &w {name: command, <<: *w}\n", "a structure that contains itself"),
    ("name: s\nworkload: &w [1, *w]\n", "a structure that contains itself"),
    ("name: s\nworkload: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than 64 levels"),
    ("name: s\nworkload: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n",
     "nested more than 64 levels"),
    ("name: s\n" + "".join(f"a{i}: &a{i} [1]\n" for i in range(1001))
     + "b: [" + ", ".join(f"*a{i % 1001}" for i in range(1001)) + "]\n",
     "more than 1,000 alias references"),
])
def test_self_referencing_and_deep_yaml_is_one_line(cli, text, fragment):
    assert_clean(cli.run({"s.yaml": text}, ["space", "s.yaml"]), 2, fragment)


def test_huge_and_special_study_files_are_refused_before_reading(cli, tmp_path):
    big = "name: s\n#" + "x" * LIMITS.study_file_bytes + "\n"
    assert_clean(cli.run({"s.yaml": big}, ["space", "s.yaml"]), 2, "larger than 1 MiB")
    items = (LIMITS.study_file_bytes - 100) // 2  # as many nodes as 1 MiB holds: 524,238
    flat = "name: s\nx: [" + ",".join(["1"] * items) + "]\n"
    assert_clean(cli.run({"s.yaml": flat}, ["space", "s.yaml"]), 2,
                 f"s.yaml:2: more than {LIMITS.yaml_nodes:,} YAML nodes")
    assert_clean(cli.run({}, ["space", "/dev/zero"]), 2, "not a regular file")
    assert_clean(cli.run({"d/x": ""}, ["space", "d"]), 2, "is a directory")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    assert_clean(cli.run({}, ["space", str(fifo)]), 2, "not a regular file")


@pytest.mark.parametrize(("text", "fragment"), [
    ("name: s\nname: t\nworkload: {name: command, options: {argv: [echo]}}\n",
     "s.yaml:2: key 'name' is given twice"),
    (command_study(ECHO, params="x: [1], x: [2]"), "key 'x' is given twice"),
    (command_study(ECHO).replace("timeout: 60", "timeout: true"), "'timeout' must be a duration"),
    (command_study(ECHO, extra="repeats: true\n"), "key 'repeats' is given twice"),
    (command_study(ECHO).replace("repeats: 1", "repeats: true"), "'repeats'"),
    ("name: s\x00\nworkload: {name: command}\n", "malformed YAML"),
    ("name: &a s\nworkload: &a {name: command}\n",
     "s.yaml:2: malformed YAML: found duplicate anchor 'a' (first on line 1)"),
    (command_study(ECHO, params='x: ["a\\0b"]'), "s.yaml:3: a NUL character"),
    (command_study(ECHO, name="a" * 300), "must be at most 100 characters"),
])
def test_strict_yaml(cli, text, fragment):
    assert_clean(cli.run({"s.yaml": text}, ["space", "s.yaml"]), 2, fragment)


def test_a_study_file_named_dots_without_a_name_is_refused(cli):
    answer = cli.run({"...yaml": command_study(ECHO, name=None)}, ["run", "...yaml"])
    assert_clean(answer, 2, "has no 'name:'", "'..' cannot name it")
    assert not Path(answer["dir"], "tunelab.db").exists()


# --- counts and sizes -----------------------------------------------------------------


@pytest.mark.parametrize("repeats", ["1000000000", "0", str(LIMITS.repeats + 1)])
def test_repeats_on_the_command_line_are_bounded_like_the_files(cli, repeats):
    answer = cli.run({"s.yaml": command_study(ECHO)}, ["run", "s.yaml", "--repeats", repeats])
    assert_clean(answer, 2, f"--repeats must be between 1 and {LIMITS.repeats:,}")
    assert not Path(answer["dir"], "runs").exists()


BIG = "a: {type: int, min: 1, max: 100000}, b: {type: int, min: 1, max: 100000}"


@pytest.mark.parametrize("extra", ["", "constraints: ['a < b']\n",
                                   "constraints: ['a < 3']\n"])
@pytest.mark.parametrize("command", [["space"], ["run", "--dry-run"], ["run"]])
def test_a_grid_too_large_to_enumerate_is_refused_with_its_size(cli, extra, command):
    text = command_study(["echo", "{a}", "{b}"], params=BIG, extra=extra)
    answer = cli.run({"s.yaml": text}, [*command, "s.yaml"])
    assert_clean(answer, 2, "10,000,000,000 combinations (100,000 a x 100,000 b)",
                 "strategy: random")


def test_a_huge_space_is_sampled_without_enumeration(cli):
    text = command_study(["echo", "{a}", "{b}"], params=BIG,
                         extra="constraints: ['a < b']\nsearch: {strategy: random, samples: 5}\n")
    answer = cli.run({"s.yaml": text}, ["space", "s.yaml", "--format", "json"])
    assert_clean(answer, 0)
    doc = json.loads(answer["stdout"])
    assert doc["total"] == 10**10 and doc["valid"] is None and len(doc["points"]) == 5
    assert all(p["a"] < p["b"] for p in doc["points"])


def test_random_samples_are_bounded(cli):
    text = command_study(ECHO, params="x: [1, 2]",
                         extra="search: {strategy: random, samples: 1000000000}\n")
    assert_clean(cli.run({"s.yaml": text}, ["space", "s.yaml"]), 2,
                 "'search.samples'", f"less than or equal to {LIMITS.samples}")


@pytest.mark.parametrize(("argv", "fragment"), [
    (["echo", "{x:>3000000000}"], "width larger than 1,000"),
    (["echo", "{x:.99999999f}"], "precision larger than 1,000"),
    (["echo", "{x:{x}}"], "nested placeholders"),
    (["echo", "{x.__class__}"], "must be a plain name"),
    (["echo", "{x[0]}"], "must be a plain name"),
    (["echo", "{}"], "must be a plain name"),
    (["echo", "{x!z}"], "unknown conversion"),
    (["echo", "{y}"], "argv placeholder {y} is not a parameter or derived value"),
])
@pytest.mark.parametrize("command", [["space"], ["run", "--dry-run"]])
def test_argv_templates_are_checked_when_the_study_loads(cli, argv, fragment, command):
    assert_clean(cli.run({"s.yaml": command_study(argv)}, [*command, "s.yaml"]), 2, fragment)


@pytest.mark.parametrize(("expr", "fragment"), [
    ("((((10**64)**64)**64)**64)**64 > x", "larger than 4096 bits"),
    ("((2**64)**60) * ((2**64)**60) > x", "a product larger than 4096 bits"),
    ("'a' * (4*10**9) == x", "longer than 10,000"),
    ("'a' * 10**11 == x", "longer than 10,000"),
    ("(1, 2) * 10**9 == x", "longer than 10,000"),
    ("'%0999999999d' % x == x", "string formatting with % is not allowed"),
    ("max(" + ", ".join(["x"] * 600) + ") > 0", "more than 500 terms"),
    ("+".join(["x"] * 800) + " > 0", "nested more than 50 levels"),
    ("+".join(["x"] * 1600) + " > 0", "longer than 2,000 characters"),
    ("-" * 100_000 + "x > 0", "longer than 2,000 characters"),
    ("abs(" * 60 + "x" + ")" * 60 + " > 0", "nested more than 50 levels"),
    ("not " * 400 + "x", "nested more than 50 levels"),
])
def test_expressions_are_bounded(cli, expr, fragment):
    text = command_study(ECHO, extra=f"constraints: [{json.dumps(expr)}]\n")
    assert_clean(cli.run({"s.yaml": text}, ["space", "s.yaml"]), 2, fragment)


def test_a_derived_value_that_would_be_huge_fails_quickly(cli):
    text = command_study(["echo", "{s}"], extra="derived: {s: \"'a' * (4*10**9)\"}\n")
    assert_clean(cli.run({"s.yaml": text}, ["run", "--dry-run", "s.yaml"]), 2,
                 "derived value 's' cannot be computed", "longer than 10,000")


# --- values a program cannot be started with --------------------------------------------


def test_env_names_with_equals_are_refused_at_load(cli):
    text = command_study(ECHO, options="env: {'A=B': c}")
    assert_clean(cli.run({"s.yaml": text}, ["space", "s.yaml"]), 2,
                 "'A=B' is not an environment variable name")


def test_a_nul_made_by_an_expression_fails_that_run_and_the_study_goes_on(cli):
    text = command_study(["echo", "{s}"], params="x: [1, 2]",
                         extra="derived: {s: \"'a\\\\x00b' if x == 1 else 'ok'\"}\n")
    first = cli.run({"s.yaml": text}, ["run", "s.yaml"])
    assert_clean(first, 1, "holds a NUL character")
    rows = store_rows(Path(first["dir"], "runs/s/tunelab.db"))
    assert sorted(status for _, _, status, _ in rows) == ["failed", "ok"]


def test_a_missing_working_directory_is_named(cli):
    text = command_study(ECHO, options="cwd: /no/such/dir")
    assert_clean(cli.run({"s.yaml": text}, ["run", "s.yaml"]), 2,
                 "working directory (cwd) /no/such/dir does not exist")


# --- figures of merit -------------------------------------------------------------------


@pytest.mark.parametrize(("output", "options", "shown"), [
    ("v=nan\n", "foms: {v: 'v=(?P<value>\\S+)'}", "nan"),
    ("v=-inf\n", "foms: {v: 'v=(?P<value>\\S+)'}", "-inf"),
    ('{"v": NaN}\n', "json_line: true", "nan"),
    ('{"v": Infinity}\n', "json_line: true", "inf"),
    ("v=" + "9" * 400 + "\n", "foms: {v: 'v=(?P<value>\\S+)'}", "inf"),
    ('{"v": 1' + "0" * 400 + "}\n", "json_line: true", "inf"),
    ('{"v": -' + "9" * 5000 + "}\n", "json_line: true", "-inf"),
])
def test_a_non_finite_fom_is_a_failed_run_never_a_crash(cli, output, options, shown):
    text = command_study(printing(output), options=options, extra="objective: {fom: v}\n")
    answer = cli.run({"s.yaml": text}, ["run", "s.yaml"])
    assert_clean(answer, 1, f"figure of merit 'v' is not finite: {shown}")
    again = cli.run({}, ["run", "s.yaml", "-q"], cwd=answer["dir"])  # resumes, runs nothing
    assert_clean(again, 1, "0 runs now, 1 done before")
    rows = store_rows(Path(answer["dir"], "runs/s/tunelab.db"))
    assert [r[2:] for r in rows] == [("failed", f"figure of merit 'v' is not finite: {shown}")]


def test_a_huge_integer_in_another_member_of_the_json_line_fails_the_run(cli):
    text = command_study(printing('{"v": 1, "w": 1' + "0" * 400 + "}\n"),
                         options="json_line: true", extra="objective: {fom: v}\n")
    answer = cli.run({"s.yaml": text}, ["run", "s.yaml", "-q"])
    assert_clean(answer, 1)
    rows = store_rows(Path(answer["dir"], "runs/s/tunelab.db"))
    assert [r[2:] for r in rows] == [("failed", "figure of merit 'w' is not finite: inf")]


def test_a_json_line_nested_too_deep_fails_the_run_and_resume_skips_it(cli):
    code = """print('{"v": 1}'); print('{"v": 2, "a": ' + '[' * 10**5 + ']' * 10**5 + '}')"""
    text = command_study([PY, "-c", code.replace("{", "{{").replace("}", "}}")],
                         options="json_line: true", extra="objective: {fom: v}\n")
    answer = cli.run({"s.yaml": text}, ["run", "s.yaml", "-q"])
    assert_clean(answer, 1)
    again = cli.run({}, ["run", "s.yaml", "-q"], cwd=answer["dir"])
    assert_clean(again, 1, "0 runs now, 1 done before")
    rows = store_rows(Path(answer["dir"], "runs/s/tunelab.db"))
    assert [r[2:] for r in rows] == [("failed", "unparsable output: JSON line: nested too deep "
                                                "to read")]


@pytest.mark.parametrize(("code", "reason"), [
    ("print('{' + ','.join('\"k%d\": %d' % (i, i) for i in range(1000)) + ', \"v\": 1}')",
     f"1,001 members, more than the {LIMITS.json_members:,} tunelab reads"),
    ("print('{\"v\": 1, \"s\": \"' + 'x' * 10**6 + '\"}')",
     f"1,000,017 characters, more than the {LIMITS.json_line_chars:,} tunelab reads"),
])
def test_a_json_line_too_large_fails_the_run_naming_the_bound(cli, code, reason):
    text = command_study([PY, "-c", code.replace("{", "{{").replace("}", "}}")],
                         options="json_line: true", extra="objective: {fom: v}\n")
    answer = cli.run({"s.yaml": text}, ["run", "s.yaml", "-q"])
    assert_clean(answer, 1)
    rows = store_rows(Path(answer["dir"], "runs/s/tunelab.db"))
    assert [r[2] for r in rows] == ["failed"]
    assert (rows[0][3] or "").startswith(f"unparsable output: JSON line: {reason}"), rows


def test_only_the_numeric_members_of_a_json_line_are_figures_of_merit():
    from tunelab.workloads.command import read_json_foms

    line = '{"v": 2, "f": 1.5, "b": true, "s": "3", "n": null, "l": [4], "o": {"p": 5}}'
    assert read_json_foms("{not json\n" + line + "\nplain\n") == {"v": 2.0, "f": 1.5}


def test_a_catastrophically_backtracking_fom_regex_fails_the_run_in_bounded_time(cli):
    text = command_study(printing("a" * 5000 + "!\n"),
                         options="foms: {v: '^(?P<value>(a|aa)+)$'}",
                         extra="objective: {fom: v}\n")
    answer = cli.run({"s.yaml": text}, ["run", "s.yaml"])
    assert_clean(answer, 1, "the regex", f"took more than {LIMITS.regex_timeout_s:g} s of CPU")


def test_huge_output_is_parsed_within_the_memory_limit(cli):
    prog = "import sys\nfor _ in range(64):\n    sys.stdout.write('x' * (1 << 20))\nprint()\n" \
           "print('v=1.5')\n"
    text = command_study([PY, "-c", prog], options="foms: {v: 'v=(?P<value>\\S+)'}",
                         extra="objective: {fom: v}\n")
    assert_clean(cli.run({"s.yaml": text}, ["run", "s.yaml", "-q"]), 0)


def test_escape_sequences_a_failed_run_printed_are_stored_and_shown_escaped(cli):
    code = ("import sys; sys.stderr.write('\\x1b]0;PWNED\\x07\\x1b[31mred\\x1b[0m all ok\\n'); "
            "sys.exit(3)")
    answer = cli.run({"s.yaml": command_study([PY, "-c", code])}, ["run", "s.yaml"])
    assert_clean(answer, 1, r"exit code 3: \x1b]0;PWNED\x07\x1b[31mred\x1b[0m all ok")
    assert "\x1b" not in answer["stderr"] + answer["stdout"]
    rows = store_rows(Path(answer["dir"], "runs/s/tunelab.db"))
    assert [r[3] for r in rows] == [r"exit code 3: \x1b]0;PWNED\x07\x1b[31mred\x1b[0m all ok"]
    status = cli.run({}, ["status", "runs/s"], cwd=answer["dir"])
    assert "\x1b" not in status["stdout"] + status["stderr"]
    assert r"\x1b]0;PWNED" in status["stdout"]


def test_millions_of_matches_of_a_fom_regex_are_not_walked(cli):
    prog = "import sys\nsys.stdout.write('v=1\\n' * (4 << 20) + 'v=2.5\\n')\n"
    text = command_study([PY, "-c", prog], options="foms: {v: 'v=(?P<value>\\S+)'}",
                         extra="objective: {fom: v}\n")
    answer = cli.run({"s.yaml": text}, ["run", "s.yaml", "-q"])
    assert_clean(answer, 0)
    assert [r[2:] for r in store_rows(Path(answer["dir"], "runs/s/tunelab.db"))] == \
        [("ok", None)]


# --- the study directory ----------------------------------------------------------------


@pytest.mark.parametrize(("setup", "fragment"), [
    ("lock-dir", ".tunelab.lock: is not a regular file"),
    ("runs-file", "runs: is not a directory"),
    ("dir-file", "exists and is not a directory"),
    ("jobs-file", "jobs: is not a directory"),
])
def test_a_broken_study_directory_is_named_at_start(cli, setup, fragment):
    files = {"s.yaml": command_study(ECHO)}
    if setup == "lock-dir":
        files["d/.tunelab.lock/x"] = ""
    elif setup == "runs-file":
        files["d/runs"] = "not a directory"
    elif setup == "jobs-file":
        files["d/jobs"] = "not a directory"
    else:
        files["d"] = "a file"
    assert_clean(cli.run(files, ["run", "s.yaml", "--dir", "d"]), 2, fragment)


def test_corrupt_pseudopotential_names_pw_x_s_message_not_mpirun_s_banner():
    from tunelab.errors import RunReportedError
    from tunelab.workloads.qe.parser import parse_pw_output

    out = Path(__file__).parents[1] / "workloads/qe/data/crash/si_bad_upf.out"
    with pytest.raises(RunReportedError,
                       match="pw.x stopped: end of file reached, tag PP_HEADER not found"):
        parse_pw_output(out.read_text())


@pytest.mark.slow
def test_corrupt_pseudopotential_real_pw_x(cli, tmp_path):
    import shutil

    if shutil.which("pw.x") is None:
        pytest.skip("pw.x is not installed")
    si = Path(__file__).parents[2] / "examples/qe/si.in"
    study = textwrap.dedent("""\
        name: bad
        workload: {name: qe, options: {input: si.in, pseudo_dir: pp}}
        parameters: {np: [1]}
        repeats: 1
        timeout: 120
        """)
    (tmp_path / "pp").mkdir()
    (tmp_path / "pp" / "Si.pz-vbc.UPF").write_text(
        '<UPF version="2.0.1">\n<PP_INFO>x</PP_INFO>\n</UPF>\n')  # no PP_HEADER
    text = re.sub(r"pseudo_dir\s*=\s*'[^']*'", f"pseudo_dir = '{tmp_path / 'pp'}'",
                  si.read_text())
    answer = cli.run({"s.yaml": study, "si.in": text}, ["run", "s.yaml", "-q"],
                     cwd=str(tmp_path))
    assert_clean(answer, 1)
    rows = store_rows(Path(answer["dir"], "runs/bad/tunelab.db"))
    assert "tag PP_HEADER not found" in (rows[0][3] or ""), rows


@pytest.mark.parametrize(("control", "pseudo", "fragment"), [
    (", pseudo_dir = '" + "x" * 5000 + "'", "Si.pz-vbc.UPF", "is not a directory"),
    ("", "S" * 5000 + ".UPF", "is in none of the places searched"),
])
def test_qe_names_too_long_for_the_file_system(cli, control, pseudo, fragment):
    """A pseudo_dir or pseudopotential name over the file system's limit (ENAMETOOLONG)
    escaped as an OSError traceback from the pseudopotential search."""
    si = textwrap.dedent(f"""\
        &control
          calculation = 'scf' {control}
        /
        &system
          ibrav = 2, celldm(1) = 10.26, nat = 2, ntyp = 1, ecutwfc = 12.0
        /
        &electrons
        /
        ATOMIC_SPECIES
        Si 28.086 {pseudo}
        ATOMIC_POSITIONS alat
        Si 0.00 0.00 0.00
        Si 0.25 0.25 0.25
        K_POINTS automatic
        2 2 2 0 0 0
        """)
    study = "name: q\nworkload: {name: qe, options: {input: si.in, nk: 2}}\nparameters: {np: [1]}\n"
    assert_clean(cli.run({"s.yaml": study, "si.in": si}, ["space", "s.yaml"]), 2, fragment)
