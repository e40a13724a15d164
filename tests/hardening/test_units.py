"""The pieces behind the promises, one by one (fast, in-process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import env_with_pythonpath
from tunelab.errors import SpaceError, StoreError, StudyError
from tunelab.execute import procs
from tunelab.execute.guards import check_study_dir, command_problem, read_output, split_finite
from tunelab.execute.hygiene import (
    MARKER,
    StudyProcesses,
    _interrupts_held,
    _interrupts_raise_once,
    current,
)
from tunelab.expr import Expression, ExpressionError
from tunelab.limits import LIMITS
from tunelab.safeyaml import load_yaml
from tunelab.space import Space


def test_yaml_lines_are_indexed_once_per_node_even_through_aliases():
    text = "a: &x\n  b: 1\n  c: [1, 2]\nd: *x\ne: [*x, *x]\n"
    data, lines = load_yaml(text, "s.yaml")
    assert data["d"] == data["a"] and data["e"][1]["c"] == [1, 2]
    assert lines[("a", "b")] == 2 and lines[("d",)] == 4 and lines[("e",)] == 5


def test_yaml_alias_expansion_is_counted_without_being_walked():
    # each level doubles: 2**40 nodes once expanded, sized in microseconds
    lines = ["l0: &l0 [1, 2]"] + [f"l{i}: &l{i} [*l{i - 1}, *l{i - 1}]" for i in range(1, 41)]
    started = time.process_time()
    with pytest.raises(StudyError, match=r"s.yaml:\d+: more than 100,000 YAML nodes"):
        load_yaml("\n".join(lines), "s.yaml")
    assert time.process_time() - started < 1


def test_merge_keys_still_work_and_explicit_keys_win():
    data, _ = load_yaml("base: &b {x: 1, y: 2}\nd: {<<: *b, y: 3}\n", "s.yaml")
    assert data["d"] == {"x": 1, "y": 3}


@pytest.mark.parametrize("source", ["2 ** 64 > 0", "'ab' * 5000 != ''", "(2**63)**64 > 0",
                                    "max(" + ", ".join(["1"] * 400) + ") == 1"])
def test_expressions_just_within_the_limits_evaluate(source):
    assert Expression.parse(source).evaluate({}) is True


@pytest.mark.parametrize("source", ["(2**64)**64", "'ab' * 5001", "(2**63)**64 * 2**64"])
def test_expressions_just_over_the_limits_are_refused_before_computing(source):
    with pytest.raises(ExpressionError, match="larger than 4096 bits|longer than 10,000"):
        Expression.parse(source).evaluate({})


def test_enumeration_refuses_at_once_when_nothing_prunes_early():
    space = Space([("a", tuple(range(1000))), ("b", tuple(range(1000)))])
    started = time.process_time()
    with pytest.raises(SpaceError, match=r"1,000,000 combinations \(1,000 a x 1,000 b\)"):
        space.points()
    assert time.process_time() - started < 0.1


def test_a_large_product_that_prunes_early_still_enumerates():
    space = Space([("a", tuple(range(10_000))), ("b", tuple(range(10_000)))],
                  constraints=[_rule("a < 3")])
    assert space.size == 10**8
    assert len(space.points()) == 3 * 10_000


def _rule(text):
    from tunelab.spec import ConstraintSpec

    return ConstraintSpec(Expression.parse(text))


def test_read_output_keeps_head_and_tail_of_huge_output(tmp_path):
    path = tmp_path / "out"
    half = LIMITS.output_parse_bytes // 2
    path.write_bytes(b"HEAD\n" + b"x" * (3 * half) + b"\nTAIL\n")
    text = read_output(path)
    assert text.startswith("HEAD") and text.endswith("TAIL\n")
    assert "bytes not read" in text and len(text) < LIMITS.output_parse_bytes + 100


def test_split_finite_names_the_first_non_finite_fom():
    finite, reason = split_finite({"a": 1.0, "v": float("nan"), "w": float("inf")})
    assert finite == {"a": 1.0} and reason == "figure of merit 'v' is not finite: nan"


@pytest.mark.parametrize(("argv", "env", "fragment"), [
    (["echo", "a\x00b"], {}, "argv[1] 'a\\x00b' holds a NUL"),
    (["echo"], {"A=B": "1"}, "name 'A=B'"),
    (["echo"], {"A": "x\x00"}, "value of environment variable A"),
    ([], {}, "empty"),
])
def test_commands_no_program_can_start_with_are_named(tmp_path, argv, env, fragment):
    assert fragment in (command_problem(argv, env, tmp_path) or "")
    assert "does not exist" in (command_problem(["echo"], {}, tmp_path / "nope") or "")


def test_study_dir_problems_are_found_before_the_lock(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(StoreError, match="exists and is not a directory"):
        check_study_dir(tmp_path / "f")
    (tmp_path / "d" / "runs").mkdir(parents=True)
    (tmp_path / "d" / ".tunelab.lock").symlink_to("/etc/passwd")
    with pytest.raises(StoreError, match="is not a regular file"):
        check_study_dir(tmp_path / "d")
    with pytest.raises(StoreError) as err:  # nothing ran: nothing is said to be stored
        check_study_dir(tmp_path / "f" / "x")
    assert str(err.value) == (f"cannot make the study directory {tmp_path / 'f' / 'x'}: "
                              "Not a directory; use another --dir")


def test_interrupts_wait_until_the_kill_is_done():
    seen = []
    old = signal.signal(signal.SIGINT, lambda *_: seen.append("handled"))
    try:
        with _interrupts_held() as interrupted:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C changes nothing
            time.sleep(0.05)
            assert interrupted() and seen == []
        assert seen == ["handled"]
    finally:
        signal.signal(signal.SIGINT, old)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # expected
def test_a_ctrl_c_whose_exception_was_swallowed_is_delivered_again_after_the_run():
    """Python ignores an exception raised in an at-fork hook (logging registers one; a run
    with a preexec_fn forks through them): a Ctrl-C landing there must not be lost."""
    class SwallowsInterrupt:
        def __del__(self) -> None:  # like an at-fork hook: its exceptions are ignored
            signal.raise_signal(signal.SIGINT)

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), _interrupts_raise_once():
            SwallowsInterrupt()  # the run goes on as if nothing had arrived
            after_swallow = True
        assert after_swallow
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, old)

def test_the_sweep_kills_what_a_dead_controller_left_by_its_marker(tmp_path):
    study = StudyProcesses(tmp_path)
    env = {**os.environ, MARKER: f"{study.token}/r0"}
    # The orphan says it runs before the sweep looks: right after Popen returns, the child may
    # still be inside execve with an empty /proc/PID/environ (seen in 42 of 300 tries).
    code = "import time; print(flush=True); time.sleep(60)"
    orphan = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True,
                              stdout=subprocess.PIPE)
    try:
        assert orphan.stdout is not None and orphan.stdout.readline() == b"\n"
        assert study.sweep() >= 1
        orphan.wait(timeout=10)  # it was killed (the sweep may have reaped it already)
    finally:
        orphan.kill()
        study.close()


def test_an_older_attempt_of_a_run_never_touches_a_newer_attempts_processes(tmp_path):
    """A batch job's step runs one attempt of a run outside any study. A job cut off by a node
    failure may have its step told to stop only after the run was re-packed into a new job:
    the old attempt's clean-up (another process, the same run directory) must leave the new
    attempt's processes and cgroup alone. Before, both attempts shared the marker and the
    cgroup named from the run directory, and the new attempt was SIGKILLed."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    new = current(run_dir)
    code = "import time; print(flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **new.env},
                            stdout=subprocess.PIPE, **new.popen_options())
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"\n"
        new.started(proc)
        old_attempt = ("import sys; from pathlib import Path; "
                       "from tunelab.execute.hygiene import current; "
                       "current(Path(sys.argv[1])).cleanup()")
        subprocess.run([sys.executable, "-c", old_attempt, str(run_dir)], check=True,
                       env=env_with_pythonpath(Path(__file__).resolve().parents[2] / "src"),
                       timeout=60)
        assert proc.poll() is None
        assert new.cgroup is None or new.cgroup.is_dir()
    finally:
        new.end(proc, 0.1)
    assert proc.poll() is not None


class _Meta:
    """A store's meta values in memory (what :class:`StudyProcesses` keeps there)."""

    def __init__(self, **values: str) -> None:
        self.values = dict(values)

    def get_meta(self, key: str) -> str | None:
        return self.values.get(key)

    def set_meta(self, values: dict[str, str]) -> None:
        self.values.update(values)


def test_the_sweep_never_kills_a_recorded_process_without_the_study_s_marker(tmp_path):
    """A copied or crafted store's in-flight record (pid and start time of any process) made
    ``run`` SIGKILL that process's whole group."""
    code = "import time; print(flush=True); time.sleep(60)"
    victim = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                              stdout=subprocess.PIPE)
    study = None
    try:
        assert victim.stdout is not None and victim.stdout.readline() == b"\n"
        proc = procs.stat(victim.pid)
        assert proc is not None
        meta = _Meta(inflight=f'{{"pid": {proc.pid}, "start": {proc.start}}}')
        study = StudyProcesses(tmp_path, meta)
        notes: list[str] = []
        assert study.sweep(notes.append) == 0
        assert victim.poll() is None  # alive
        assert len(notes) == 1 and f"process {victim.pid}" in notes[0], notes
        assert "nothing was killed" in notes[0] and meta.values["inflight"] == ""
    finally:
        victim.kill()
        victim.wait()
        if study is not None:
            study.close()


def test_a_scheduler_command_that_cannot_be_executed_is_a_launch_error(tmp_path):
    from tunelab.errors import LaunchError
    from tunelab.execute.launchers._batch import scheduler_call

    sbatch = tmp_path / "sbatch"
    sbatch.write_text("#!/bin/sh\n")  # not executable
    with pytest.raises(LaunchError, match="cannot run .*sbatch.*: Permission denied"):
        scheduler_call([str(sbatch)])


@pytest.mark.parametrize("write", [False, True])
def test_a_store_another_process_holds_locked_is_called_locked_not_damaged(tmp_path,
                                                                          monkeypatch, write):
    """A lock held past the wait was reported as damage, with advice (restore a copy,
    .recover) that could make a user throw away a healthy store."""
    import sqlite3

    from tunelab.store import connect, open_store

    open_store(tmp_path, create=True).close()
    monkeypatch.setattr(connect, "BUSY_TIMEOUT_S", 0.05)
    holder = sqlite3.connect(tmp_path / "tunelab.db", isolation_level=None)
    try:
        holder.execute("PRAGMA locking_mode = EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        holder.execute("UPDATE meta SET value = value")
        with pytest.raises(StoreError) as caught:
            open_store(tmp_path, write=write)
    finally:
        holder.close()
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'tunelab.db'}: another process holds the results "
                              "database locked"), message
    assert "damaged" not in message and ".recover" not in message and "\n" not in message
    open_store(tmp_path, write=write).close()  # healthy once the lock is gone
