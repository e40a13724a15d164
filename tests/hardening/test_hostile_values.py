"""The hostile inputs of issue 21, one by one: values that used to run for minutes, grow to
gigabytes, end in a traceback or be silently accepted — each now ends in one line naming the
file and line, within the CPU and memory limits (``assert_clean``), or, where a run's output
is at fault, in a failed run with its reason.

Every case runs the real command line (in the worker process, see ``worker.py``).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from pathlib import Path

import pytest

from tests.hardening.conftest import (
    PY,
    assert_clean,
    command_study,
    finished_two_run_study,
    printing,
    store_rows,
)
from tunelab.limits import LIMITS
from tunelab.store.schema import SCHEMA

ECHO = ["echo", "{x}"]
EVERY_LOAD = [["space"], ["run", "--dry-run"], ["run"]]


def line_of(text: str, fragment: str) -> int:
    """The 1-based line of ``text`` that holds ``fragment``."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if fragment in line)


# --- values that grow without bound -------------------------------------------------------


@pytest.mark.parametrize("command", EVERY_LOAD)
@pytest.mark.parametrize("expr", ["round(x, -10**9)", "round(x * 1.5, 10**12) + 1",
                                  "round(x * 7, 3 - 10**12)"])
def test_round_to_a_huge_number_of_digits_is_refused_at_once(cli, command, expr):
    text = command_study(["echo", "{y}"], extra=f'derived: {{y: "{expr}"}}\n')
    assert_clean(cli.run({"s.yaml": text}, [*command, "s.yaml"]), 2,
                 f"s.yaml:{line_of(text, 'derived')}:", "round(): ndigits", "beyond ±1,233")


@pytest.mark.parametrize("pattern", [
    "((((a{1000}){1000}){1000}){1000})(?P<value>x)",
    "(?:(?:(?:(?P<value>a)|b){100}){100}){100}",
    "(?P<value>(x|y){65535})",
    "(?P<value>a{99999999999999999999999})",
])
def test_a_fom_regex_that_expands_beyond_the_limit_is_refused_before_it_compiles(cli,
                                                                                 pattern):
    text = command_study(ECHO, options=f"foms: {{v: '{pattern}'}}")
    assert_clean(cli.run({"s.yaml": text}, ["space", "s.yaml"]), 2, "s.yaml:2:",
                 f"grows larger than {LIMITS.regex_size:,}")


def test_fom_regexes_share_one_budget(cli):
    foms = ", ".join(f"v{i}: '(?P<value>(ab){{9000}})'" for i in range(8))
    text = command_study(ECHO, options=f"foms: {{{foms}}}")
    assert_clean(cli.run({"s.yaml": text}, ["space", "s.yaml"]), 2, "FOM 'v3'",
                 "with the study's other FOM regexes")


def test_a_plain_fom_regex_with_counted_repeats_still_works(cli):
    text = command_study(printing("took 12.5 s\n"),
                         options="foms: {v: 'took (?P<value>[0-9]{1,6}[.][0-9]{0,3}) s'}",
                         extra="objective: {fom: v}\n")
    assert_clean(cli.run({"s.yaml": text}, ["run", "s.yaml", "-q"]), 0)


@pytest.mark.parametrize(("where", "value"), [
    ("repeats", "9" * 5000), ("repeats", "0x" + "f" * 2000), ("parameters", "9" * 1300),
])
def test_integers_with_thousands_of_digits_are_refused_at_their_line(cli, where, value):
    text = command_study(ECHO)
    if where == "repeats":
        text = text.replace("repeats: 1", f"repeats: {value}")
    else:
        text = text.replace("x: [1]", f"x: [1, {value}]")
    digits = sum(ch.isalnum() for ch in value)
    assert_clean(cli.run({"s.yaml": text}, ["space", "s.yaml"]), 2,
                 f"s.yaml:{line_of(text, value[:20])}:", f"an integer of {digits:,} digits")


@pytest.mark.parametrize("strategy", ["optuna", "random", "grid"])
@pytest.mark.parametrize("seed", [2**32, 10**30, -1])
def test_a_seed_beyond_32_bits_is_refused_for_every_strategy(cli, strategy, seed):
    text = command_study(ECHO, params="x: [1, 2, 3]",
                         extra=f"search: {{strategy: {strategy}, samples: 2, seed: {seed}}}\n")
    assert_clean(cli.run({"s.yaml": text}, ["run", "--dry-run", "s.yaml"]), 2,
                 f"s.yaml:{line_of(text, 'seed')}:", "'search.seed'")


@pytest.mark.parametrize("timeout", ["1.0e+300", '"99999999999999999999h"', ".inf", "1e300",
                                     '"1e300"', "-5", '"8761h"', "31536001"])
def test_every_timeout_beyond_the_bound_is_refused_alike(cli, timeout):
    text = command_study(ECHO).replace("timeout: 60", f"timeout: {timeout}")
    answer = cli.run({"s.yaml": text}, ["space", "s.yaml"])
    assert_clean(answer, 2, f"s.yaml:{line_of(text, 'timeout')}: 'timeout' must be a")


def test_the_longest_timeout_is_accepted(cli):
    text = command_study(ECHO).replace("timeout: 60", f"timeout: {LIMITS.duration_s}")
    assert_clean(cli.run({"s.yaml": text}, ["space", "s.yaml"]), 0)


# --- names that are one name to Python ------------------------------------------------------


@pytest.mark.parametrize(("params", "derived", "fragment"), [
    ("fi: [1], ﬁ: [2]", "", "parameter 'ﬁ' reads as 'fi'"),
    ("ﬁ: [2], fi: [1]", "", "parameter 'ﬁ' reads as 'fi'"),
    ("fi: [1]", 'derived: {ﬁ: "fi + 1"}\n', "derived value 'ﬁ' reads as 'fi'"),
    ("x: [1], Ｘ: [2]", "", "parameter 'Ｘ' reads as 'X'"),
])
def test_names_equal_once_unicode_normalized_are_refused(cli, params, derived, fragment):
    text = command_study(["echo", "{fi}" if "fi" in params else "{x}"], params=params,
                         extra=derived)
    answer = cli.run({"s.yaml": text}, ["space", "s.yaml"])
    assert_clean(answer, 2, fragment, "NFKC")
    assert re.search(r"s\.yaml:\d+:", answer["stderr"])


# --- figures of merit the statistics cannot hold ------------------------------------------


def test_foms_near_the_largest_float_fail_their_runs_and_every_reader_copes(cli):
    argv = [PY, "-c", "import sys; print('v=' + sys.argv[1])", "{x}"]
    text = command_study(argv, params="x: ['1.7e308', '1.79e308', '9e307', '1.5', '2.5']",
                         options="foms: {v: 'v=(?P<value>\\S+)'}",
                         extra="objective: {fom: v}\nbaseline: {x: '1.5'}\n"
                               ).replace("repeats: 1", "repeats: 2")
    answer = cli.run({"s.yaml": text}, ["run", "s.yaml", "-q"])
    assert_clean(answer, 1)
    rows = store_rows(Path(answer["dir"], "runs/s/tunelab.db"))
    bad = [why for key, _, status, why in rows if "e30" in key]
    assert len(bad) == 6 and all("is out of range" in (why or "") for why in bad), rows
    for command in (["compare"], ["best"], ["report"], ["compare", "--format", "json"]):
        read = cli.run({}, [*command, "runs/s"], cwd=answer["dir"])
        assert_clean(read, 1)
        for stream in ("stdout", "stderr"):
            assert "inf" not in read[stream].replace("info", ""), read[stream]
            # no Python warning (RuntimeWarning: overflow …); the disturbed-runs note that
            # starts "Warning:" depends on the machine's load and is not one
            assert not re.search(r"[A-Za-z]+Warning", read[stream]), read[stream]
    assert Path(answer["dir"], "runs/s/report.html").is_file()


def test_a_zero_spread_prints_as_zero(cli):
    text = command_study(printing("v=0.7\n"), params="x: [1, 2]",
                         options="foms: {v: 'v=(?P<value>\\S+)'}",
                         extra="objective: {fom: v}\nbaseline: {x: 1}\n"
                         ).replace("repeats: 1", "repeats: 3")
    answer = cli.run({"s.yaml": text}, ["run", "s.yaml", "-q"])
    assert_clean(answer, 0)
    assert "0.7 ± 0" in answer["stdout"] and "e-1" not in answer["stdout"], answer["stdout"]


# --- a damaged results database --------------------------------------------------------------

READERS = [["status"], ["compare"], ["best"], ["export", "-o", "-"], ["export", "-f", "csv"],
           ["report"], ["status", "--format", "json"]]


@pytest.fixture(scope="module")
def finished(cli) -> dict[str, str]:
    """A finished study large enough that garbage in its middle hits more than one page:
    20 runs, each storing a 3,000-character command line."""
    text = command_study([*printing("v=1.5\n"), "x" * 3000], params="x: " + str(
        list(range(10))), options="foms: {v: 'v=(?P<value>\\S+)'}",
                         extra="objective: {fom: v}\n").replace("repeats: 1", "repeats: 2")
    answer = cli.run({"s.yaml": text}, ["run", "s.yaml", "-q"], timeout_s=600)
    assert_clean(answer, 0)
    return {"dir": answer["dir"], "text": text}


def _copy_study(src: str, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("offset", [0.5, 0.25, 0.9])
def test_garbage_in_the_middle_of_the_store_is_refused_by_every_command(cli, finished,
                                                                        tmp_path, offset):
    study = _copy_study(finished["dir"], tmp_path / "copy")
    db = study / "runs/s/tunelab.db"
    for extra in ("-wal", "-shm"):
        Path(f"{db}{extra}").unlink(missing_ok=True)
    size = db.stat().st_size
    assert size > 10 * 4096, size
    with db.open("r+b") as f:
        f.seek(int(size * offset) - 2048)
        f.write(os.urandom(4096))
    before = db.read_bytes()
    for command in [*READERS, ["run", "s.yaml", "-q"]]:
        target = [] if command[0] == "run" else ["runs/s"]
        answer = cli.run({}, [command[0], *target, *command[1:]], cwd=str(study))
        assert_clean(answer, 2, "tunelab.db: the results database is damaged", ".recover")
    assert db.read_bytes() == before  # nothing wrote to it


def test_a_store_truncated_to_zero_bytes_is_not_a_new_study(cli, finished, tmp_path):
    study = _copy_study(finished["dir"], tmp_path / "copy")
    db = study / "runs/s/tunelab.db"
    for extra in ("-wal", "-shm"):
        Path(f"{db}{extra}").unlink(missing_ok=True)
    db.write_bytes(b"")
    assert_clean(cli.run({}, ["run", "s.yaml", "-q"], cwd=str(study)), 2,
                 "is empty (0 bytes)", "truncated")
    assert db.stat().st_size == 0  # not made into a new, empty study
    for command in READERS:
        answer = cli.run({}, [command[0], "runs/s", *command[1:]], cwd=str(study))
        assert_clean(answer, 2, "is empty (0 bytes)")


def test_a_new_study_still_starts_in_an_empty_database_file(cli, tmp_path):
    """A 0-byte file with no runs beside it (a controller killed while creating it) is
    nothing lost: the study starts."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "tunelab.db").write_bytes(b"")
    answer = cli.run({"s.yaml": command_study(ECHO)}, ["run", "s.yaml", "--dir",
                                                       str(tmp_path / "d"), "-q"])
    assert_clean(answer, 0)
    conn = sqlite3.connect(tmp_path / "d" / "tunelab.db")
    assert conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 1
    conn.close()



@pytest.mark.parametrize(("sql", "fragment"), [
    ("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);"
     "INSERT INTO users VALUES (1, 'alice')", "it holds the tables users, and no foms"),
    ("CREATE TABLE meta (a); CREATE TABLE points (a); CREATE TABLE runs (a);"
     "CREATE TABLE foms (a); INSERT INTO runs VALUES (1)", "its table meta has no column key"),
    (SCHEMA + "ALTER TABLE runs RENAME TO runs_real; CREATE VIEW runs AS SELECT * FROM runs_real",
     "its runs is a view, not a table"),
])
def test_another_program_s_database_is_refused_by_every_command_before_any_write(
        cli, tmp_path, sql, fragment):
    """``run`` used to add tunelab's tables to another program's database (and start the
    study over beside earlier runs' files); tables of tunelab's names with other columns
    made every reader print a traceback."""
    study = tmp_path / "d"
    (study / "runs" / "1").mkdir(parents=True)
    db = study / "tunelab.db"
    conn = sqlite3.connect(db)
    conn.executescript(sql)
    conn.close()
    before = db.read_bytes()
    for command in [*READERS, ["run", "s.yaml", "--dir", str(study), "-q"]]:
        where = [] if command[0] == "run" else [str(study)]
        answer = cli.run({"s.yaml": command_study(ECHO)}, [command[0], *where, *command[1:]])
        assert_clean(answer, 2, f"{db}: is not a tunelab results database", fragment)
    assert db.read_bytes() == before and sorted(p.name for p in study.iterdir()) == [
        ".tunelab.lock", "runs", "tunelab.db"]  # no -wal, no -shm: nothing was written



@pytest.fixture(scope="module")
def tiny(cli) -> str:
    """A finished study of two runs, whose store the tests below damage (copies of it)."""
    return str(finished_two_run_study(cli))


def _damaged(tiny: str, tmp_path: Path, *sql: str) -> Path:
    """A copy of the tiny study whose store ``sql`` changed; its database."""
    study = _copy_study(tiny, tmp_path / "copy")
    db = study / "runs/s/tunelab.db"
    for extra in ("-wal", "-shm"):
        Path(f"{db}{extra}").unlink(missing_ok=True)
    conn = sqlite3.connect(db, isolation_level=None)
    for statement in sql:
        conn.execute(statement)
    conn.close()
    return db


INFLIGHT = "INSERT OR REPLACE INTO meta VALUES ('inflight', '{{\"pid\": {}, \"start\": 1}}')"


@pytest.mark.parametrize(("sql", "fragment"), [
    ("UPDATE meta SET value = '{' WHERE key = 'spec'", "meta.value of key 'spec' holds '{'"),
    ("UPDATE meta SET value = '[1,2]' WHERE key = 'spec'", "key 'spec' holds '[1,2]'"),
    ("UPDATE meta SET value = '[1]' WHERE key = 'objective'", "key 'objective' holds '[1]'"),
    ("UPDATE meta SET value = 'abc' WHERE key = 'noise_threshold'",
     "key 'noise_threshold' holds 'abc' (expected a finite number"),
    ("UPDATE foms SET value = 'abc' WHERE rowid = 1", "foms.value of run 1, figure 'v' holds "
                                                      "'abc'"),
    ("UPDATE foms SET value = x'00ff' WHERE rowid = 1", "figure 'v' holds x'00ff'"),
    # a store written before the bound the runner applies (report died in numpy's arange)
    ("UPDATE foms SET value = 1e308", "figure 'v' holds 1e+308 (expected a number of "
                                      "magnitude 1e-50 to 1e+50, or 0"),
    ("UPDATE runs SET repeat = 'abc' WHERE id = 1", "runs.repeat of run 1 holds 'abc'"),
    ("UPDATE points SET params = '{' WHERE id = 1", "points.params of point 1 holds '{'"),
    ("UPDATE sysinfo SET snapshot = '{'", "sysinfo.snapshot of snapshot 1 holds '{'"),
    ("INSERT OR REPLACE INTO noise (run_id, load_before, cpu_list, disturbed) "
     "VALUES (1, 'abc', 5, 'yes')", "noise.load_before of run 1 holds 'abc'"),
    ("INSERT INTO jobs VALUES ('t', 'nosuch', 'x', 'active', NULL, 'x', '{')",
     "jobs.runs of job 't' holds '{'"),
    (INFLIGHT.format('"abc"'), "key 'inflight' holds '{\"pid\": \"abc\""),
    (INFLIGHT.format("[1]"), "key 'inflight' holds '{\"pid\": [1]"),
    (INFLIGHT.format("1e999"), "key 'inflight' holds '{\"pid\": 1e999"),
    ("PRAGMA ignore_check_constraints = 1; UPDATE runs SET status = 'weird' WHERE id = 1",
     "runs.status of run 1 holds 'weird' (expected one of ok, failed"),
])
def test_a_value_tunelab_never_writes_is_refused_by_every_command(cli, tiny, tmp_path, sql,
                                                                  fragment):
    """Stores that pass quick_check but hold what tunelab never writes gave tracebacks (or
    were shown with exit 0 by the readers and called damaged by run alone)."""
    db = _damaged(tiny, tmp_path, *sql.split("; "))
    before = db.read_bytes()
    for command in [["status"], ["compare"], ["export", "-o", "-"], ["report"],
                    ["run", "s.yaml", "-q"]]:
        target = [] if command[0] == "run" else ["runs/s"]
        answer = cli.run({}, [command[0], *target, *command[1:]], cwd=str(db.parents[2]))
        assert_clean(answer, 2, "runs/s/tunelab.db: the results database is damaged: ",
                     fragment, "nothing was read or changed")
    assert db.read_bytes() == before  # nothing wrote to it


# --- old and misshapen study files -----------------------------------------------------------


@pytest.mark.parametrize(("section", "fragment"), [
    ("workload: command", "'workload' must be a mapping with the fields name, options"),
    ("objective: pwscf_wall_s", "'objective' must be a mapping with the fields fom, direction"),
    ("search: grid", "'search' must be a mapping with the fields strategy, seed"),
    ("constraints: [{x: 1}]", "missing required field 'constraints.0.expr'"),
])
def test_old_schema_sections_are_named_by_their_shape_not_a_class(cli, section, fragment):
    text = command_study(ECHO)
    if section.startswith("workload"):
        text = re.sub(r"workload: \{.*\}\}\n", section + "\n", text)
    else:
        text += section + "\n"
    answer = cli.run({"s.yaml": text}, ["space", "s.yaml"])
    assert_clean(answer, 2, f"s.yaml:{line_of(text, section.split(':')[0] + ':')}:", fragment)
    assert not re.search(r"\b_[A-Z]\w+", answer["stderr"]), answer["stderr"]


# --- every error names the file and the line ---------------------------------------------------


@pytest.mark.parametrize(("text", "line", "fragment"), [
    ("name: s\nworkload: {name: nosuch}\nparameters: {x: [1]}\n", 2, "unknown workload"),
    (command_study(ECHO, extra="derived: {d: 'y + 1'}\n"), 6, "derived value 'd'"),
    (command_study(ECHO, extra="constraints:\n  - x > 0\n  - x > 5\n"), 8, "no valid point"),
    (command_study(ECHO, extra="constraints:\n  - y > 0\n"), 7, "constraint 'y > 0'"),
    (command_study(ECHO, extra="derived: {d: 'round(x, -10**9)'}\n"), 6, "no valid point"),
    (command_study(ECHO, extra="search: {strategy: hierarchical, groups: [[y]]}\n"), 6,
     "search groups: y is not a parameter"),
    (command_study(ECHO, params="x: [1], y: {type: int, min: 1, max: 100000}, "
                                "z: {type: int, min: 1, max: 100000}"), 3,
     "10,000,000,000 combinations"),
    ("name: s\nworkload: {name: qe, options: {input: nosuch.in}}\nparameters: {np: [1]}\n", 2,
     "nosuch.in"),
])
@pytest.mark.parametrize("command", [["space"], ["run", "--dry-run"]])
def test_errors_found_while_the_study_is_prepared_name_file_and_line(cli, text, line, fragment,
                                                                     command):
    answer = cli.run({"s.yaml": text}, [*command, "s.yaml"])
    assert_clean(answer, 2, fragment)
    assert re.search(rf"s\.yaml:{line}: ", answer["stderr"]), answer["stderr"]


def test_a_missing_program_names_file_and_line_at_run(cli):
    text = command_study(["no-such-program-here", "{x}"])
    assert_clean(cli.run({"s.yaml": text}, ["run", "s.yaml"]), 2, "s.yaml:2:",
                 "'no-such-program-here' not found")


@pytest.mark.parametrize(("text", "fragment"), [
    (command_study(ECHO, extra="# a comment\n1: 2\n"), "1: 2"),
    (command_study(ECHO, extra="yes: 2\n"), "yes: 2"),
    ("name: s\nworkload: {name: command, options: {argv: [echo]}}\nparameters:\n  x: [1]\n"
     "  on: [2]\n", "on:"),
    ("name: s\nworkload: {name: command, options: {argv: [echo]}}\nparameters:\n  x: [1]\n"
     "  3: [2]\n", "3:"),
    (command_study(ECHO).replace("repeats: 1", "repeats: !!int 'abc'"), "!!int"),
    (command_study(ECHO).replace("repeats: 1", "repeats: !!timestamp 'x'"), "!!timestamp"),
    (command_study(ECHO, extra="noise_threshold: !!float 'abc'\n"), "!!float"),
    ("o: &o {fom: v, direction: up}\n" + command_study(ECHO, extra="objective:\n  <<: *o\n"),
     "direction: up"),
    (command_study(ECHO, extra='description: "a\x01b"\n'), "description"),
    (command_study(ECHO, params="").replace("parameters: {}", "# none\nparameters: {}"),
     "parameters: {}"),
    (command_study(ECHO, extra="baseline: {x: null}\n"), "baseline"),
    (command_study(ECHO, extra="baseline:\n  x: [1, 2]\n"), "x: [1, 2]"),
])
def test_yaml_errors_name_the_line_of_the_fault(cli, text, fragment):
    answer = cli.run({"s.yaml": text}, ["space", "s.yaml"])
    assert_clean(answer, 2)
    assert re.search(rf"s\.yaml:{line_of(text, fragment)}: ", answer["stderr"]), (
        text, answer["stderr"])


# --- the merge benchmark ------------------------------------------------------------------


@pytest.mark.parametrize(("args", "fragment"), [
    # 10^12 rows: each worker died on a MemoryError traceback (about 100 lines); 2 x 10^9
    # rows would have been allocated and filled until the machine ran out of memory
    (["-c", str(10**12)], "--chunk-size 1000000000000 with 2 worker(s) on this host needs"),
    (["-t", "mpi", "-c", str(2 * 10**11)], "with 2 worker(s) on this host needs about"),
    (["-n", "100000", "-c", "10"], "with 100000 worker(s) on this host needs"),
])
def test_a_merge_run_that_cannot_fit_in_memory_is_refused_before_it_starts(cli, args,
                                                                           fragment):
    answer = cli.run({}, ["bench", "merge", *args, "-i", "1"])
    assert answer["rc"] == 2, answer["stderr"][-2000:]
    lines = answer["stderr"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("merge: error: "), lines
    assert fragment in lines[0] and "GiB is available" in lines[0]
    assert answer["maxrss_mb"] < 400, answer["maxrss_mb"]


def merge_study(params: str) -> str:
    """A study of the ``merge`` workload (tcp, so that no mpirun is probed) with ``params``."""
    return ("name: m\nworkload:\n  name: merge\n  options: {transport: tcp, iterations: 1}\n"
            f"parameters:\n  {params}\n")


@pytest.mark.parametrize(("params", "fragment"), [
    # -5 was dropped as if the workload's rule 'chunk_size > 0' excluded it; 0 workers alike
    ("chunk_size: [1000, -5]", "parameter 'chunk_size': value -5: Input should be greater than 0"),
    ("workers: [2, 0]", "parameter 'workers': value 0: Input should be greater than or equal to 2"),
    # each of these ran, and every one of its runs failed
    ("chunk_size: [1000, 2000.0]", "parameter 'chunk_size': value 2000.0: Input should be a "
                                   "valid integer"),
    ("iterations: [1, 0]", "parameter 'iterations': value 0: Input should be greater than or"),
    ("warmup: [-1]", "parameter 'warmup': value -1: Input should be greater than or equal to 0"),
    ("frac_match: [1.5]", "parameter 'frac_match': value 1.5: Input should be less than or"),
    ("seed: [-3]", "parameter 'seed': value -3: Input should be greater than or equal to 0"),
    ("timeout: [0]", "parameter 'timeout': value 0: Input should be greater than 0"),
    ("transport: [tcp, smoke]", "parameter 'transport': value 'smoke': Input should be 'mpi', "),
])
@pytest.mark.parametrize("command", EVERY_LOAD)
def test_a_merge_parameter_value_the_benchmark_never_takes_is_refused_at_load(cli, command,
                                                                              params, fragment):
    answer = cli.run({"s.yaml": merge_study(params)}, [*command, "s.yaml"])
    assert_clean(answer, 2, f"s.yaml:6: workload 'merge' {fragment}")
    assert not (Path(answer["dir"]) / "runs").exists()


@pytest.mark.parametrize("command", EVERY_LOAD)
def test_a_merge_size_that_cannot_fit_is_refused_at_load_on_the_local_launcher(cli, command):
    # before, the study started and each of that point's runs failed on the refusal
    text = merge_study("chunk_size: [1000, 1000000000000]")
    answer = cli.run({"s.yaml": text}, [*command, "s.yaml"])
    assert_clean(answer, 2, "s.yaml:6: workload 'merge': point chunk_size=1000000000000: "
                            "chunk_size 1000000000000 with 2 worker(s) on this host needs about",
                 "GiB is available (MemAvailable)")
    assert not (Path(answer["dir"]) / "runs").exists()


def test_a_merge_size_is_left_to_the_run_on_a_batch_launcher(cli):
    text = merge_study("chunk_size: [1000, 1000000000000]") + "launcher: {type: slurm}\n"
    answer = cli.run({"s.yaml": text}, ["space", "s.yaml"])
    assert_clean(answer, 0)  # the run's node is not this machine: the benchmark judges there


@pytest.mark.parametrize("name", ["chunksize", "python"])
def test_a_merge_parameter_that_is_no_option_it_reads_is_refused_at_load(cli, name):
    # before, a misspelt option (or the study's own interpreter) made points that all ran
    # the same command, ranked against each other as if they differed
    answer = cli.run({"s.yaml": merge_study(f"{name}: [1000, 2000]")}, ["space", "s.yaml"])
    assert_clean(answer, 2, f"s.yaml:6: workload 'merge' does not use a parameter {name!r}: "
                            "every value would run the same command; its parameters are "
                            "backend, chunk_size,")


DRY_LOADS = [["space"], ["run", "--dry-run"]]


def ddp_study(params: str) -> str:
    """A study of the ``ddp`` workload (emulated ResNet-18 compute) with ``params``."""
    return ("name: d\nworkload:\n  name: ddp\n  options: {model: resnet18, compute: "
            "'emulate:resnet18/a100/b64'}\nparameters:\n  " + params + "\n")


@pytest.mark.parametrize(("params", "fragment"), [
    # each was a valid point whose every run failed on the benchmark's own refusal
    ("batch_size: [64, -4]", "parameter 'batch_size': value -4: Input should be greater than "
                             "or equal to 1"),
    ("workers: [1, 0]", "parameter 'workers': value 0: Input should be greater than or equal"),
    ("steps: [10, 2.5]", "parameter 'steps': value 2.5: Input should be a valid integer"),
    ("bucket_mb: [25, -1]", "parameter 'bucket_mb': value -1: Input should be greater than 0"),
])
@pytest.mark.parametrize("command", DRY_LOADS)
def test_a_ddp_parameter_value_the_benchmark_never_takes_is_refused_at_load(cli, command,
                                                                            params, fragment):
    answer = cli.run({"s.yaml": ddp_study(params)}, [*command, "s.yaml"])
    assert_clean(answer, 2, f"s.yaml:6: workload 'ddp' {fragment}")


@pytest.mark.parametrize(("params", "fragment"), [
    # each was a valid point: -1 trained with a negative learning rate, 2.5 epochs ran 2
    ("lr: [-1]", "parameter 'lr': value -1: Input should be greater than 0"),
    ("batch_size: [16, 0]", "parameter 'batch_size': value 0: Input should be greater than or"),
    ("epochs: [2.5]", "parameter 'epochs': value 2.5: Input should be a valid integer"),
    ("nproc: [1, -2]", "parameter 'nproc': value -2: Input should be greater than or equal to 1"),
    ("window: [0]", "parameter 'window': value 0: Input should be greater than or equal to 32"),
])
@pytest.mark.parametrize("command", DRY_LOADS)
def test_a_leopard_parameter_value_training_never_takes_is_refused_at_load(cli, command,
                                                                           params, fragment):
    text = "name: l\nworkload: {name: leopard}\nparameters:\n  " + params + "\n"
    answer = cli.run({"s.yaml": text}, [*command, "s.yaml"])
    assert_clean(answer, 2, f"s.yaml:4: workload 'leopard' {fragment}")


def test_a_leopard_sync_bn_word_and_whole_epoch_values_stay_points(cli):
    text = ("name: l\nworkload: {name: leopard}\nparameters:\n  sync_bn: ['yes', 'no']\n"
            "  steps_per_epoch: [0, 20]\n")
    assert_clean(cli.run({"s.yaml": text}, ["space", "s.yaml"]), 0)


@pytest.mark.parametrize("params", ["data: [a.json, b.json]", "device: [cpu, cuda]",
                                    "max_eval_windows: [64, 256]", "batchsize: [8, 16]",
                                    "python: [python3, python3.12]"])
@pytest.mark.parametrize("command", DRY_LOADS)
def test_a_leopard_parameter_training_never_reads_is_refused_at_load(cli, command, params):
    # before, an option only the study sets (or a misspelt batch_size) made points that all
    # ran the same command, ranked against each other as if they differed
    text = "name: l\nworkload: {name: leopard}\nparameters:\n  " + params + "\n"
    answer = cli.run({"s.yaml": text}, [*command, "s.yaml"])
    name = params.split(":")[0]
    assert_clean(answer, 2, f"s.yaml:4: workload 'leopard' does not use a parameter {name!r}: "
                            "every value would run the same command; its parameters are "
                            "augment_scale, batch_size, bn_momentum, epochs, in_channels, lr, "
                            "lr_scaling, nodes, nproc, patience, ppn, seed, steps_per_epoch, "
                            "sync_bn, threads, warmup_epochs, window")


def test_a_leopard_placement_and_thread_parameters_stay_points(cli):
    text = ("name: l\nworkload: {name: leopard}\nparameters:\n  nodes: [1]\n  ppn: [1]\n"
            "  threads: [1, 2]\n  in_channels: [5, 6]\n")
    assert_clean(cli.run({"s.yaml": text}, ["space", "s.yaml"]), 0)


@pytest.mark.parametrize(("params", "value"), [
    # each was a valid point whose runs asked mpirun (or pw.x) for an impossible count
    ("np: [1, -2]", "-2"),
    ("npool: [1, 0]", "0"),
    ("omp: [1, 1.5]", "1.5"),
    ("ntg: [true]", "True"),
])
@pytest.mark.parametrize("command", DRY_LOADS)
def test_a_qe_count_pw_x_never_takes_is_refused_at_load(cli, command, params, value):
    si = (Path(__file__).parents[2] / "examples/qe/si.in").read_text()
    text = ("name: q\nworkload: {name: qe, options: {input: si.in, nk: 10}}\nparameters:\n  "
            + params + "\n")
    answer = cli.run({"s.yaml": text, "si.in": si}, [*command, "s.yaml"])
    name = params.split(":")[0]
    assert_clean(answer, 2, f"s.yaml:4: workload 'qe' parameter {name!r}: value {value}: a "
                            "count of ranks, pools, groups, threads or nodes must be a whole "
                            "number of at least 1")


def no_point_left(line: int, workload: str, name: str, at: str, value: str, why: str) -> str:
    """The refusal of a study whose derived value ``name`` the workload takes nowhere."""
    return (f"s.yaml:{line}: no valid point: all 2 combinations are excluded ({name!r} "
            f"excluded 2); the first combination ({at}): derived value {name!r} is {value}, a "
            f"value workload {workload!r} never takes: {why}")


@pytest.mark.parametrize("command", DRY_LOADS)
def test_a_ddp_derived_value_the_benchmark_never_takes_is_refused_at_its_line(cli, command):
    # before, batch_size -4 x workers made valid points whose every run failed
    text = ddp_study("workers: [1, 2]") + "derived:\n  batch_size: -4 * workers\n"
    answer = cli.run({"s.yaml": text}, [*command, "s.yaml"])
    assert_clean(answer, 2, no_point_left(8, "ddp", "batch_size", "workers=1", "-4",
                                          "Input should be greater than or equal to 1"))


QE_DERIVED = ("name: q\nworkload: {name: qe, options: {input: si.in, nk: 10}}\nparameters:\n"
              "  omp: [1, 2]\nderived:\n  np: 2 - 2 * omp\n")


@pytest.mark.parametrize(("files", "message"), [
    # before, only the ddp workload checked a derived value: these made valid points whose
    # every run failed (leopard: a negative learning rate; qe: -np 0; merge on a batch
    # launcher: chunk_size -10; here its memory check refused it at the options' line)
    ({"s.yaml": merge_study("workers: [2, 3]") + "derived:\n  chunk_size: -5 * workers\n"},
     no_point_left(8, "merge", "chunk_size", "workers=2", "-10",
                   "Input should be greater than 0")),
    ({"s.yaml": merge_study("workers: [2, 3]") + "derived:\n  chunk_size: -5 * workers\n"
                "launcher: {type: slurm}\n"},
     no_point_left(8, "merge", "chunk_size", "workers=2", "-10",
                   "Input should be greater than 0")),
    ({"s.yaml": "name: l\nworkload: {name: leopard}\nparameters:\n  batch_size: [16, 32]\n"
                "derived:\n  lr: -0.001 * batch_size\n"},
     no_point_left(6, "leopard", "lr", "batch_size=16", "-0.016",
                   "Input should be greater than 0")),
    ({"s.yaml": QE_DERIVED, "si.in": "examples/qe/si.in"},
     no_point_left(6, "qe", "np", "omp=1", "0", "a count of ranks, pools, groups, threads or "
                   "nodes must be a whole number of at least 1")),
])
@pytest.mark.parametrize("command", EVERY_LOAD)
def test_a_derived_value_a_workload_never_takes_is_refused_at_its_line(cli, command, files,
                                                                       message):
    root = Path(__file__).parents[2]
    files = {k: (root / v).read_text() if k.endswith(".in") else v for k, v in files.items()}
    answer = cli.run(files, [*command, "s.yaml"])
    assert_clean(answer, 2, message)
    assert not (Path(answer["dir"]) / "runs").exists()


PARTLY = merge_study("workers: [2, 3, 4]") + "derived:\n  chunk_size: 1500 - 500 * workers\n"
"""A merge study whose derived chunk size the benchmark takes at workers=2 only."""
LEFT_OUT = ("derived value 'chunk_size' is 0, a value workload 'merge' never takes: Input "
            "should be greater than 0 (first at workers=3)")


@pytest.mark.parametrize("search", ["", "search: {strategy: optuna, samples: 3}\n",
                                    "search: {strategy: racing, max_runs: 2}\n"])
def test_a_derived_value_a_workload_takes_at_some_points_leaves_the_others_out(cli, search):
    # before, grid and random refused the study (the first point it never takes), optuna
    # and the run strategies ran those points: every run failed ('invalid point'), and the
    # search learnt from the failures
    text = PARTLY + search
    shown = cli.run({"s.yaml": text}, ["space", "s.yaml"])
    assert_clean(shown, 0)
    assert re.search(r"\b1 valid points? of 3 combinations", shown["stdout"])
    assert re.search(r"\b2\s+chunk_size\s+study \(derived\)\s+" + re.escape(LEFT_OUT),
                     shown["stdout"])
    dry = cli.run({"s.yaml": text}, ["run", "--dry-run", "s.yaml"])
    assert_clean(dry, 0, f"s.yaml:8: 2 of 3 combinations are left out where {LEFT_OUT}; "
                         "'tunelab space s.yaml' lists them")
    assert dry["stderr"].count("left out") == 1
    assert "workers 3" not in dry["stdout"] and "workers 4" not in dry["stdout"]


def test_an_optuna_study_runs_only_points_whose_derived_values_the_workload_takes(cli):
    text = PARTLY + "search: {strategy: optuna, samples: 3}\n"
    answer = cli.run({"s.yaml": text}, ["run", "--repeats", "1", "s.yaml"])
    assert_clean(answer, 0, "s.yaml:8: 2 of 3 combinations are left out")
    rows = store_rows(Path(answer["dir"], "runs/m/tunelab.db"))
    assert [(json.loads(key)["workers"], status) for key, _, status, _ in rows] == [(2, "ok")]


SAMPLED = merge_study("workers: {type: int, min: 2, max: 101}\n"
                      "  chunk_size: {type: int, min: 1000, max: 9000}") + \
    "derived:\n  iterations: 60 - workers\n"
"""A merge study of 800,100 combinations (above the enumeration limit) whose derived
iteration count the benchmark never takes at 42 of the 100 worker counts."""


def test_a_sampled_space_says_about_how_much_a_derived_value_leaves_out(cli):
    # before: 's.yaml:9: combinations are left out where …; 'tunelab space s.yaml' counts
    # them', and 'tunelab space' counted nothing ('too many to enumerate, so the valid ones
    # are not counted')
    text = SAMPLED + "search: {strategy: random, samples: 5}\n"
    dry = cli.run({"s.yaml": text}, ["run", "--dry-run", "s.yaml"])
    assert_clean(dry, 0)
    note = re.search(r"s\.yaml:9: of 800,100 combinations, about (\d+)% \(an estimate: (\d+) "
                     r"of 1,000 drawn at random\) are left out where derived value "
                     r"'iterations' is -\d+, a value workload 'merge' never takes", dry["stderr"])
    assert note is not None, dry["stderr"]
    assert 35 <= int(note[1]) <= 49 and note[1] == f"{int(note[2]) / 10:.0f}"  # 42% in truth
    shown = cli.run({"s.yaml": text}, ["space", "s.yaml"])
    assert_clean(shown, 0)
    assert re.search(r"800,100 combinations \(workers, chunk_size\): too many to enumerate; "
                     r"about \d+% \(an estimate: \d+ of 1,000 drawn at random\) of them are "
                     r"valid", shown["stdout"])
    assert re.search(r"about \d+%\s+iterations\s+study \(derived\)", shown["stdout"])


def test_a_sparse_sampled_space_plans_no_more_points_than_its_sampling_found(cli):
    # before: 'up to 100 points chosen by optuna x 3 repeats = up to 300 runs', where the
    # sampling optuna proposes from found 40 valid points of the ~174
    text = SAMPLED + "constraints:\n  - chunk_size < 1003\nsearch: {strategy: optuna, " \
                     "samples: 100}\n"
    dry = cli.run({"s.yaml": text}, ["run", "--dry-run", "s.yaml"])
    assert_clean(dry, 0)
    plan = re.search(r"up to (\d+) points chosen by optuna x 3 repeats = up to (\d+) runs",
                     dry["stderr"])
    assert plan is not None, dry["stderr"]
    assert 0 < int(plan[1]) < 100 and int(plan[2]) == 3 * int(plan[1])
