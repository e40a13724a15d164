"""Faults of the machine and of the user, with real processes: ``kill -9`` of tunelab at
random points (then resumed), repeated Ctrl-C, SIGTERM while starting, runs that leave
``setsid()`` daemons and background processes, timeouts, file systems that turn read-only
or immutable mid-run, a full disk, and a study read from a read-only medium.

After each: every (point, repeat) is stored exactly once, ``PRAGMA integrity_check`` is ok,
and no process of the study is left running.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import termios
import time
import uuid
from pathlib import Path

import pytest

from tests.hardening.conftest import PY, assert_clean, read_only_view, root_can, store_rows
from tunelab.execute import hygiene, shm
from tunelab.store.connect import open_store

PROG = Path(__file__).with_name("leaver.py")


def leaver_study(tag: str, *, points: int = 3, repeats: int = 2, sleep: str = "0.1",
                 leave: str = "both", timeout: float = 60, extra: str = "") -> str:
    """A study whose runs each leave a ``setsid()`` grandchild and a background process
    running (tagged ``tag`` on their command lines) and print ``v=<x>``; with ``both`` or
    ``all`` a run fails (exit 3) if it starts while a process of an earlier run lives."""
    xs = ", ".join(str(i) for i in range(points))
    return (f"name: f\nworkload: {{name: command, options: {{argv: [{PY}, {PROG}, {leave}, "
            f"'{sleep}', {tag}, '{{x}}'], foms: {{v: 'v=(?P<value>\\S+)'}}}}}}\n"
            f"parameters: {{x: [{xs}]}}\nrepeats: {repeats}\ntimeout: {timeout}\n"
            f"objective: {{fom: v}}\n{extra}")


def survivors(tag: str) -> list[str]:
    """Command lines of live processes tagged ``tag`` (zombies are dead)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if tag in cmd and state != "Z":
            found.append(f"{pid}: {cmd}")
    return found


def wait_no_survivors(tag: str, timeout: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := survivors(tag)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def count_runs(db: Path) -> int:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return int(conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def start(study: Path, directory: Path, *options: str,
          nohup: bool = False) -> subprocess.Popen[str]:
    """``tunelab run``; with ``nohup`` it starts with SIGHUP ignored, as ``nohup`` does."""
    return subprocess.Popen([PY, "-m", "tunelab", "run", str(study), "--dir", str(directory),
                             *options],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=study.parent, preexec_fn=_ignore_hangup if nohup else None)


def _ignore_hangup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def start_without_cgroups(study: Path, directory: Path) -> subprocess.Popen[str]:
    """``tunelab run`` with cgroups out of reach: the process group and the subreaper are
    all that find a run's processes."""
    code = ("import sys, tunelab.execute.hygiene as h\nh._cgroup_base = lambda: None\n"
            "from tunelab._entry import main\nsys.argv[0] = 'tunelab'\nmain()\n")
    return subprocess.Popen([PY, "-c", code, "run", str(study), "--dir", str(directory)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=study.parent)


def wait_until(check, timeout: float = 120.0, what: str = "") -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def assert_complete(db: Path, points: int, repeats: int) -> None:
    rows = store_rows(db)
    keys = [(key, repeat) for key, repeat, _, _ in rows]
    assert len(keys) == len(set(keys)) == points * repeats, rows
    assert all(status == "ok" for _, _, status, _ in rows), rows


# --- kill -9 at random points -------------------------------------------------------------


def kill_9_trials(tmp_path: Path, seeds: range, resume, cgroups: bool = True) -> int:  # noqa: ANN001
    """``kill -9`` tunelab at a random point of a study, once per seed, then ``resume(study,
    directory)``; check every (point, repeat) stored exactly once, no run started beside a
    survivor of the killed one (the leaver fails then), nothing left running. Returns how
    many kills orphaned a run."""
    orphaned = 0  # seeds whose kill left a run (and what it started) running
    for seed in seeds:
        rng = random.Random(seed)
        tag = f"tl{uuid.uuid4().hex[:10]}"
        study = tmp_path / f"s{seed}.yaml"
        study.write_text(leaver_study(tag, sleep=f"{rng.uniform(0.02, 0.15):.2f}"))
        d = tmp_path / f"d{seed}"
        proc = start(study, d) if cgroups else start_without_cgroups(study, d)
        stored = rng.randint(0, 5)  # kill once this many runs are stored, plus a little
        db = d / "tunelab.db"
        wait_until(lambda: count_runs(db) >= stored or proc.poll() is not None,  # noqa: B023
                   what=f"{stored} runs")
        time.sleep(rng.uniform(0, 0.2))
        proc.kill()  # kill -9 of tunelab alone: its run in flight is orphaned
        proc.communicate(timeout=30)
        orphaned += bool(survivors(tag))
        resume(study, d)
        assert_complete(d / "tunelab.db", 3, 2)
        assert wait_no_survivors(tag) == [], f"seed {seed}"
    return orphaned


@pytest.mark.slow
def test_kill_9_at_random_points_then_resume_keeps_every_run_exactly_once(cli, tmp_path):
    def resume(study: Path, d: Path) -> None:
        answer = cli.run({}, ["run", str(study), "--dir", str(d), "-q"], cwd=str(tmp_path))
        assert_clean(answer, 0)

    assert kill_9_trials(tmp_path, range(20), resume) >= 5


@pytest.mark.slow
def test_kill_9_then_resume_without_cgroups(tmp_path):
    """The same where cgroups are out of reach: the in-flight record (pid and start time)
    and the environment marker find what the killed controller left."""
    def resume(study: Path, d: Path) -> None:
        proc = start_without_cgroups(study, d)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "Traceback" not in err, err

    assert kill_9_trials(tmp_path, range(100, 104), resume, cgroups=False) >= 1


@pytest.mark.parametrize("cgroups", [True, False])
def test_kill_9_of_tunelab_takes_the_run_in_flight_with_it(tmp_path, cgroups):
    """The run's leader dies with tunelab (it used to run on, orphaned, until the study was
    run again; a Leopard training for minutes): the kernel sends it SIGTERM."""
    tag = f"tl{uuid.uuid4().hex[:10]}"
    study = tmp_path / "s.yaml"
    study.write_text(leaver_study(tag, points=1, repeats=1, sleep="60", leave="plain"))
    proc = start(study, tmp_path / "d") if cgroups else start_without_cgroups(study, tmp_path / "d")
    wait_until(lambda: survivors(tag) != [], what="the run")
    proc.kill()
    proc.communicate(timeout=30)
    assert wait_no_survivors(tag, timeout=30) == []
    with hygiene.study_processes(tmp_path / "d") as processes:  # as the next run does
        assert shm.leftovers(processes.token) != []  # the run's shared-memory directory
        processes.sweep()
        assert shm.leftovers(processes.token) == []


# --- signals ------------------------------------------------------------------------------


def test_a_hang_up_ends_the_run_like_ctrl_c(tmp_path):
    """The terminal closed (SIGHUP): the run in flight and what it started go down, one
    line, exit 130 (before, tunelab died and its run ran on, orphaned)."""
    tag = f"tl{uuid.uuid4().hex[:10]}"
    study = tmp_path / "s.yaml"
    study.write_text(leaver_study(tag, points=1, repeats=1, sleep="60", leave="both"))
    proc = start(study, tmp_path / "d")
    wait_until(lambda: len(survivors(tag)) >= 3, what="the run and its leftovers")
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err, err
    assert wait_no_survivors(tag) == []


def _take_the_terminal() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_a_closed_terminal_ends_the_run_exit_130(tmp_path):
    """tunelab on a terminal (its session's controlling tty, a progress bar on it) that goes
    away, as when an SSH session drops: the kernel's SIGHUP ends the run in flight, and the
    bar and the message, which can no longer be written, do not turn the exit into a
    traceback's 1."""
    tag = f"tl{uuid.uuid4().hex[:10]}"
    study = tmp_path / "s.yaml"
    study.write_text(leaver_study(tag, points=1, repeats=1, sleep="60", leave="both"))
    master, slave = pty.openpty()
    proc = subprocess.Popen([PY, "-m", "tunelab", "run", str(study), "--dir", str(tmp_path / "d")],
                            stdin=slave, stdout=slave, stderr=slave, cwd=tmp_path,
                            start_new_session=True, preexec_fn=_take_the_terminal)
    os.close(slave)
    try:
        wait_until(lambda: len(survivors(tag)) >= 3, what="the run and its leftovers")
    finally:
        os.close(master)
    assert proc.wait(timeout=30) == 130
    assert wait_no_survivors(tag) == []


def test_a_hang_up_under_nohup_changes_nothing(tmp_path):
    tag = f"tl{uuid.uuid4().hex[:10]}"
    study = tmp_path / "s.yaml"
    study.write_text(leaver_study(tag, points=1, repeats=1, sleep="1", leave="plain"))
    proc = start(study, tmp_path / "d", nohup=True)
    wait_until(lambda: survivors(tag) != [], what="the run")
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert_complete(tmp_path / "d" / "tunelab.db", 1, 1)



def test_repeated_ctrl_c_never_skips_the_kill(tmp_path):
    tag = f"tl{uuid.uuid4().hex[:10]}"
    study = tmp_path / "s.yaml"
    study.write_text(leaver_study(tag, points=1, repeats=1, sleep="60", leave="stubborn"))
    proc = start(study, tmp_path / "d")
    wait_until(lambda: len(survivors(tag)) >= 3, what="the run and its leftovers")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)  # inside the grace period: the run ignores SIGTERM
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    assert wait_no_survivors(tag) == []


def test_two_signals_at_once_end_the_run_at_once_without_cgroups(tmp_path):
    """SIGINT and SIGTERM pending together: the first unwinds, the second is held until
    the kill step runs and only cuts its grace short (it used to be lost to the KeyboardInterrupt
    handling of the wait, so the whole grace passed)."""
    tag = f"tl{uuid.uuid4().hex[:10]}"
    study = tmp_path / "s.yaml"
    study.write_text(leaver_study(tag, points=1, repeats=1, sleep="60", leave="stubborn"))
    proc = start_without_cgroups(study, tmp_path / "d")
    wait_until(lambda: len(survivors(tag)) >= 3, what="the run and its leftovers")
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    assert proc.returncode == 130 and "Traceback" not in err and "interrupted" in err, err
    assert wait_no_survivors(tag) == []
    assert took < 3.0, took  # the 3 s grace was cut short by the second signal


def _catches_sigterm(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


@pytest.mark.parametrize("delay", [0.0, 0.1, 0.3])
def test_sigterm_while_tunelab_starts_is_one_line(tmp_path, delay):
    study = tmp_path / "s.yaml"
    study.write_text(leaver_study("unused", points=1, repeats=1))
    proc = start(study, tmp_path / "d")
    wait_until(lambda: _catches_sigterm(proc.pid) or proc.poll() is not None,
               what="tunelab to handle SIGTERM")
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert len(err.strip().splitlines()) == 1 and "interrupted" in err, err


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def test_a_run_that_ended_while_tunelab_was_stopped_is_run_again(tmp_path):
    """tunelab stopped (SIGSTOP, Ctrl-Z: its own process group only) while its run, in a
    session of its own, runs on and ends: the end is seen only at SIGCONT, so the wall time
    counts the stop (a 0.5 s run was stored as ok, 8.1 s). That attempt is lost and the run
    goes again; the stored run is the one seen to its end."""
    go, ended = tmp_path / "go", tmp_path / "ended"
    tag = f"tl{uuid.uuid4().hex[:10]}"
    code = (f"import pathlib, time  # {tag}\nwhile not pathlib.Path({str(go)!r}).exists(): "
            f"time.sleep(0.01)\npathlib.Path({str(ended)!r}).touch()\nprint('v=1')")
    study = tmp_path / "s.yaml"
    study.write_text(f"name: f\nworkload: {{name: command, options: {{argv: [{PY}, -c, "
                     f"{json.dumps(code)}], foms: {{v: 'v=(?P<value>\\S+)'}}}}}}\n"
                     "parameters: {x: [1]}\nrepeats: 1\ntimeout: 60\nobjective: {fom: v}\n")
    proc = start(study, tmp_path / "d")
    wait_until(lambda: survivors(tag) != [] or proc.poll() is not None, what="the run")
    run_pid = int(survivors(tag)[0].split(":")[0])
    proc.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: _state(proc.pid) == "T", what="tunelab to stop")
        go.touch()
        wait_until(lambda: ended.exists() and _state(run_pid) in ("Z", ""), what="its end")
    finally:
        proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert_complete(tmp_path / "d" / "tunelab.db", 1, 1)
    conn = sqlite3.connect(tmp_path / "d" / "tunelab.db")
    attempts = conn.execute("SELECT reason FROM attempts").fetchall()
    conn.close()
    assert len(attempts) == 1 and "tunelab was stopped" in attempts[0][0], attempts
    assert "was stopped" in err, err


def test_a_wall_clock_stepped_mid_study_moves_no_run_to_another_session(tmp_path):
    """A run's session (the ``tunelab run`` that made it, for pairing by round) was read
    from its wall-clock start against each session's snapshot time: a clock stepped a year
    forward mid-study (NTP, ``date``) put that session's later runs into the next session,
    and ``compare`` said "Round r1 was split across 2 'tunelab run' sessions" and paired
    them apart. The store's order decides now. The step is written into the store as such
    a clock writes it."""
    tag = f"tl{uuid.uuid4().hex[:10]}"
    study = tmp_path / "s.yaml"
    study.write_text(leaver_study(tag, points=2, repeats=2, sleep="0", leave="plain",
                                  extra="baseline: {x: 0}\n"))
    d = tmp_path / "d"
    for more in ([], ["--repeats", "3"]):
        res = subprocess.run([PY, "-m", "tunelab", "run", str(study), "--dir", str(d), "-q",
                              *more], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        if not more:  # the clock stepped a year forward before round r1 of session 1
            conn = sqlite3.connect(d / "tunelab.db")
            with conn:
                conn.execute("UPDATE runs SET started_at = '2099' || substr(started_at, 5), "
                             "ended_at = '2099' || substr(ended_at, 5) WHERE repeat = 1")
            conn.close()
    with open_store(d) as store:
        frame = store.runs_frame()
    sessions = sorted(zip(frame["repeat"], frame["session"], strict=True))
    assert sessions == [(0, 1), (0, 1), (1, 1), (1, 1), (2, 2), (2, 2)], sessions
    res = subprocess.run([PY, "-m", "tunelab", "compare", str(d)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and "split across" not in res.stdout + res.stderr, res.stdout


# --- what runs leave behind ---------------------------------------------------------------


@pytest.mark.parametrize("cgroups", [True, False])
def test_setsid_grandchildren_and_background_processes_end_with_each_run(tmp_path, cgroups):
    tag = f"tl{uuid.uuid4().hex[:10]}"
    study = tmp_path / "s.yaml"
    study.write_text(leaver_study(tag, points=2, repeats=1, leave="all",
                                  extra="search: {strategy: grid}\n"))
    code = ("import sys, tunelab.execute.hygiene as h\n"
            + ("" if cgroups else "h._cgroup_base = lambda: None\n")
            + "from tunelab._entry import main\nsys.argv[0] = 'tunelab'\nmain()\n")
    res = subprocess.run([PY, "-c", code, "run", str(study), "--dir", str(tmp_path / "d"),
                          "-q"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert survivors(tag) == []
    rows = store_rows(tmp_path / "d" / "tunelab.db")
    # each run checked that the previous run's leftovers were gone before it started
    assert [status for *_, status, _ in rows] == ["ok", "ok"], rows


def test_a_timed_out_run_records_the_time_at_the_timeout(cli):
    tag = f"tl{uuid.uuid4().hex[:10]}"
    answer = cli.run({"s.yaml": leaver_study(tag, points=1, repeats=1, sleep="60",
                                             leave="stubborn", timeout=0.5)},
                     ["run", "s.yaml", "-q"])
    assert_clean(answer, 1)
    conn = sqlite3.connect(Path(answer["dir"], "runs/f/tunelab.db"))
    status, wall = conn.execute("SELECT status, wall_s FROM runs").fetchone()
    conn.close()
    assert status == "timeout" and 0.5 <= wall < 1.5, wall  # not 0.5 s + the 3 s grace
    assert wait_no_survivors(tag) == []


# --- file systems -------------------------------------------------------------------------


@pytest.mark.parametrize("killed", [False, True])
def test_a_study_on_a_read_only_medium_is_readable_by_every_read_command(cli, tmp_path,
                                                                        killed):
    tag = f"tl{uuid.uuid4().hex[:10]}"
    study = tmp_path / "s.yaml"
    study.write_text(leaver_study(tag, extra="baseline: {x: 0}\n"))
    d = tmp_path / "d"
    if killed:  # a WAL and its index left by kill -9
        proc = start(study, d)
        wait_until(lambda: count_runs(d / "tunelab.db") >= 2, what="2 runs")
        proc.kill()
        proc.communicate(timeout=30)
        assert (d / "tunelab.db-wal").exists()
    else:
        assert_clean(cli.run({}, ["run", str(study), "--dir", str(d), "-q"],
                             cwd=str(tmp_path)), 0)
    with read_only_view(d) as ro:
        report = tmp_path / "report.html"
        for argv in (["status", ro], ["compare", ro], ["best", ro], ["export", ro, "-o", "-"],
                     ["report", ro, "-o", report], ["status", ro, "--format", "json"]):
            answer = cli.run({}, [str(a) for a in argv], cwd=str(tmp_path))
            assert answer["escaped"] is None and answer["rc"] in (0, 1), answer["stderr"]
            assert "error" not in answer["stderr"], answer["stderr"]
        assert report.exists()
        assert_clean(cli.run({}, ["report", str(ro)], cwd=str(tmp_path)), 2,
                     "Read-only file system", "--output")
        assert_clean(cli.run({}, ["run", str(study), "--dir", str(ro)], cwd=str(tmp_path)), 2,
                     "not writable")
    wait_no_survivors(tag)


@pytest.mark.parametrize("target", ["runs", "tunelab.db-shm", "tunelab.db-wal", "."])
def test_a_study_directory_made_immutable_mid_run_stops_with_one_line(tmp_path, target):
    if not root_can("chattr", "-i", str(tmp_path)):
        pytest.skip("needs root and a file system with chattr")
    tag = f"tl{uuid.uuid4().hex[:10]}"
    study = tmp_path / "s.yaml"
    study.write_text(leaver_study(tag, points=3, repeats=2, sleep="0.3"))
    d = tmp_path / "d"
    proc = start(study, d, "-q")
    try:
        wait_until(lambda: count_runs(d / "tunelab.db") >= 1, what="a run")
        subprocess.run(["chattr", "-R", "+i", str(d / target)], check=True)
        _, err = proc.communicate(timeout=60)
    finally:
        subprocess.run(["chattr", "-R", "-i", str(d)], check=True)
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tunelab: error: cannot write"), err
    assert "run the same command again to resume" in lines[0]
    assert wait_no_survivors(tag) == []
    res = subprocess.run([PY, "-m", "tunelab", "run", str(study), "--dir", str(d), "-q"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert_complete(d / "tunelab.db", 3, 2)


_READ_AFTER_IMMUTABLE = """
import os, subprocess, sys
from pathlib import Path
from tunelab.errors import StoreError
from tunelab.store.connect import open_store
d = Path(sys.argv[1])
store = open_store(d, create=True)
store.set_meta({"a": "1"})
subprocess.run(["chattr", "+i", str(d / "tunelab.db-shm")], check=True)
fd = os.open(d / "tunelab.db-shm", os.O_RDONLY)
os.fsync(fd)  # written back: the next write to its mapping faults (as the kernel's writeback)
os.close(fd)
try:
    store.get_meta("a")
except StoreError as exc:
    print(exc)
"""


def test_a_read_of_a_store_whose_index_became_immutable_is_one_line_not_sigbus(tmp_path):
    """SQLite writes to the memory-mapped ``-shm`` on reads too; once that file is immutable
    and its pages written back, the write is a SIGBUS (the rare signal 7 of the test above,
    under load, in CI). Every statement of a writing store checks its files first."""
    d = tmp_path / "d"
    d.mkdir()
    if not root_can("chattr", "-i", str(d)):
        pytest.skip("needs root and a file system with chattr")
    try:
        res = subprocess.run([PY, "-c", _READ_AFTER_IMMUTABLE, str(d)], capture_output=True,
                             text=True, timeout=60)
    finally:
        subprocess.run(["chattr", "-R", "-i", str(d)], check=True)
    assert res.returncode == 0, (res.returncode, res.stderr)
    assert res.stdout.startswith(f"cannot write {d}/tunelab.db-shm: it became read-only"), \
        res.stdout


def test_a_study_directory_deleted_mid_run_is_said_and_no_run_is_claimed_stored(tmp_path):
    """``rm -rf`` of the study directory while a run is in flight: the study stops with one
    line that says so; it used to say "the finished runs are stored … run the same command
    again to resume" of runs that went with the directory."""
    tag = f"tl{uuid.uuid4().hex[:10]}"
    study = tmp_path / "s.yaml"
    study.write_text(leaver_study(tag, points=2, repeats=1, sleep="60", leave="plain"))
    d = tmp_path / "d"
    proc = start(study, d, "-q")
    wait_until(lambda: survivors(tag) != [] or proc.poll() is not None, what="the run")
    while d.exists():  # as rm -rf: again, should tunelab make a file meanwhile
        shutil.rmtree(d, ignore_errors=True)
    for run in survivors(tag):  # the run ends now rather than after its 60 s
        os.kill(int(run.split(":")[0]), signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"the study directory {d} was deleted" in lines[0], err
    assert "are stored" not in lines[0], lines[0]
    assert wait_no_survivors(tag) == []


def test_a_full_disk_mid_run_stops_with_one_line_and_resumes(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if not root_can("mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)):
        pytest.skip("needs root to mount a small tmpfs")
    try:
        tag = f"tl{uuid.uuid4().hex[:10]}"
        study = disk / "s.yaml"
        # each run writes 0.7 MB of output: the disk fills after a few runs
        study.write_text(leaver_study(tag, points=4, repeats=2, leave="fill"))
        res = subprocess.run([PY, "-m", "tunelab", "run", str(study), "--dir", str(disk / "d"),
                              "-q"], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "cannot write" in lines[0], res.stderr
        assert "no space left" in lines[0].lower() or "full" in lines[0], lines[0]
        done = store_rows(disk / "d" / "tunelab.db")
        assert 0 < len(done) < 8
        for run_dir in (disk / "d" / "runs").glob("*/*"):
            for f in run_dir.glob("*.txt"):
                f.unlink()  # make room
        res = subprocess.run([PY, "-m", "tunelab", "run", str(study), "--dir",
                              str(disk / "d"), "-q"], capture_output=True, text=True,
                             timeout=120)
        rows = store_rows(disk / "d" / "tunelab.db")
        keys = [(k, r) for k, r, _, _ in rows]
        assert len(keys) == len(set(keys)) and len(keys) >= len(done)
        assert wait_no_survivors(tag) == []
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
