"""A failed run's reason names the signal or the first real error line, never Open MPI's
banner: the pure function on real outputs, then real runs through real mpirun (a program that
dies on SIGSEGV, one that prints an error and exits 3) with the command and qe workloads."""

from __future__ import annotations

import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import tunelab
from tunelab.cluster.mpi import mpirun_argv
from tunelab.errors import ParseError, RunReportedError
from tunelab.execute.reasons import MESSAGE_CHARS, REASON_CHARS, failure_reason, printable
from tunelab.execute.records import parse_run

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun")
SEGFAULT = "import ctypes; ctypes.string_at(0)"
ERROR_EXIT = "import sys; print('ERROR: cannot open input.dat', file=sys.stderr); sys.exit(3)"


def _mpirun(code: str, n: int = 2) -> subprocess.CompletedProcess[str]:
    argv = [*mpirun_argv(n, cores=1), sys.executable, "-c", code]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@needs_mpirun
def test_a_rank_killed_by_a_signal_is_named_not_the_banner():
    """mpirun names the rank's signal in a line of its own ("mpirun noticed that process
    rank 1 … exited on signal 11"), except once in a while on a loaded machine, where only
    its "returned a non-zero exit code" banner and its status 139 say so (seen once in CI):
    then the signal is read from the status. Either way the signal is named, not the
    banner."""
    res = _mpirun(SEGFAULT)
    assert res.returncode != 0 and res.stderr.rstrip().endswith("-" * 20)  # the banner
    reason = failure_reason(res.returncode, res.stdout, res.stderr)
    if "exited on signal" in res.stderr:
        assert reason.startswith(f"exit code {res.returncode}: ")
        assert "exited on signal 11 (Segmentation fault)" in reason, reason
    else:
        assert reason == (f"exit code {res.returncode} (128 + signal 11: Segmentation fault, "
                          "as a shell reports a program killed by it)"), (reason, res.stderr)
    assert "---" not in reason


@needs_mpirun
def test_a_rank_that_exits_with_an_error_is_named_by_its_own_line():
    res = _mpirun(ERROR_EXIT, n=1)
    assert res.returncode == 3, res.stderr
    assert failure_reason(3, res.stdout, res.stderr) == \
        "exit code 3: ERROR: cannot open input.dat"


def test_a_signal_in_the_exit_status_is_named():
    assert failure_reason(-signal.SIGSEGV, "", "") == \
        "killed by signal 11 (Segmentation fault)"
    assert failure_reason(-9, "partial output\n", "") == "killed by signal 9 (Killed)"


def test_a_shell_status_above_128_is_named_as_its_signal_when_nothing_else_is():
    reason = failure_reason(139, "", "----\n")
    assert reason.startswith("exit code 139 (128 + signal 11: Segmentation fault")


def test_the_exception_line_of_a_python_traceback():
    err = textwrap.dedent("""\
        Traceback (most recent call last):
          File "x.py", line 3, in <module>
            open("input.dat")
        FileNotFoundError: [Errno 2] No such file or directory: 'input.dat'
        """)
    assert failure_reason(1, "", err) == \
        "exit code 1: FileNotFoundError: [Errno 2] No such file or directory: 'input.dat'"


def test_the_first_error_line_before_the_last_line_and_stderr_before_stdout():
    out = "step 1\nwarning: could not read cache\nstep 2\n"
    err = "loading\nfatal: out of range at step 7\nsee the log\n"
    assert failure_reason(2, out, err) == "exit code 2: fatal: out of range at step 7"
    assert failure_reason(2, out, "") == "exit code 2: warning: could not read cache"


def test_without_an_error_line_the_last_real_line_and_never_a_banner():
    assert failure_reason(1, "", "working\nstopped at 3\n" + "=" * 40 + "\n") == \
        "exit code 1: stopped at 3"
    assert failure_reason(1, "", "-" * 74 + "\n\n") == "exit code 1"
    assert failure_reason(None, "", "") == "exit code None"


def test_gfortran_s_floating_point_note_is_not_the_reason():
    err = "Note: The following floating-point exceptions are signalling: IEEE_DENORMAL\n"
    assert failure_reason(1, "the end\n", err) == "exit code 1: the end"


def test_a_long_line_is_cut():
    reason = failure_reason(1, "", "error: " + "x" * 5000 + "\n")
    assert len(reason) <= len("exit code 1: ") + REASON_CHARS and reason.endswith("…")


def test_escape_sequences_in_the_output_are_shown_escaped_never_sent():
    err = "\x1b]0;PWNED-TITLE\x07\x1b[31mred\x1b[0m fake: all ok\n"
    assert failure_reason(3, "", err) == \
        r"exit code 3: \x1b]0;PWNED-TITLE\x07\x1b[31mred\x1b[0m fake: all ok"
    assert failure_reason(1, "", "error:\tx\u202ey\x9b2J\udcff z\n") == \
        r"exit code 1: error:\tx\u202ey\x9b2J\udcff z"


def test_a_line_of_escapes_is_cut_to_the_bound_between_two_escapes():
    shown = printable("\x1b" * 400)
    assert len(shown) <= REASON_CHARS and shown.endswith("\\x1b…")
    assert printable("é" * 10, 10) == "é" * 10 and printable("é" * 11, 10) == "é" * 9 + "…"


class _Saying:
    """A workload whose parser fails with ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def parse(self, stdout: str, stderr: str, run_dir: Path) -> dict[str, float]:
        raise self.error


@pytest.mark.parametrize(("rc", "error", "stored"), [
    (0, ParseError("no result (\x1b[2Jcleared)"), r"unparsable output: no result (\x1b[2Jcleared)"),
    (3, RunReportedError("stopped: \x1b]0;t\x07"), r"exit code 3: stopped: \x1b]0;t\x07"),
])
def test_a_parse_error_quoting_the_output_is_stored_printable_and_bounded(tmp_path, rc, error,
                                                                          stored):
    (tmp_path / "stdout.txt").write_text("")
    (tmp_path / "stderr.txt").write_text("")
    study = SimpleNamespace(workload=_Saying(error))
    assert parse_run(study, rc, tmp_path)[:2] == ("failed", stored)  # type: ignore[arg-type]
    long = SimpleNamespace(workload=_Saying(ParseError("\x07" * 5000)))
    why = parse_run(long, 0, tmp_path)[1]  # type: ignore[arg-type]
    assert why is not None and len(why) <= len("unparsable output: ") + MESSAGE_CHARS


def _stored_reasons(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [r for (r,) in conn.execute("SELECT reason FROM runs ORDER BY id")]
    finally:
        conn.close()


@needs_mpirun
def test_a_crashed_run_s_stored_reason_names_the_signal(tmp_path):
    argv = [*mpirun_argv(2, cores=1), sys.executable, "-c", SEGFAULT]
    (tmp_path / "s.yaml").write_text(
        f"name: s\nworkload: {{name: command, options: {{argv: {argv!r}}}}}\n"
        "parameters: {x: [1]}\nrepeats: 1\ntimeout: 120\n")
    res = tunelab("run", "s.yaml", "--dir", "d", "-q", cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    [reason] = _stored_reasons(tmp_path / "d" / "tunelab.db")
    # mpirun's own line, or (on a busy machine, where its report can miss the run's output)
    # the exit status 139 read as the signal: either way signal 11 is named
    signalled = re.compile(r"signal 11:? \(?Segmentation fault")
    assert signalled.search(reason), reason
    status = tunelab("status", "d", cwd=tmp_path)
    assert signalled.search(status.stdout), status.stdout


@needs_mpirun
def test_a_qe_run_whose_pw_x_crashes_names_the_signal(tmp_path):
    """The qe workload's real mpirun line, with a pw.x that dies on SIGSEGV at once."""
    pw = tmp_path / "crashing-pw.x"
    pw.write_text(f"#!{sys.executable}\nimport os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    pw.chmod(0o755)
    si = Path(__file__).parents[2] / "examples" / "qe" / "si.in"
    shutil.copy(si, tmp_path / "si.in")
    (tmp_path / "s.yaml").write_text(textwrap.dedent(f"""\
        name: crash
        workload: {{name: qe, options: {{input: si.in, pw: {pw}, nk: 10,
                                          oversubscribe: true}}}}
        parameters: {{np: [2], npool: [1]}}
        repeats: 1
        timeout: 120
        """))
    res = tunelab("run", "s.yaml", "--dir", "d", "-q", cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    [reason] = _stored_reasons(tmp_path / "d" / "tunelab.db")
    assert "exited on signal 11 (Segmentation fault)" in reason, reason
    assert "---" not in reason
