"""Noise watch: runs held back with no other process on their cores — by a CPU quota of
their cgroup, or stopped by a signal — are flagged, with the cause; real runs through the
real runner where this machine allows (root, cgroups), the counters faked otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tunelab import cpustat
from tunelab.noise import STOPPED_SHARE, THROTTLED_SHARE, NoiseWatch, judge
from tunelab.procstate import stopped_now


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_cgroups_whose_quota_can_hold_a_run_back_are_found_in_both_hierarchies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's cgroup v2 and its parents up to the mount, and this process's cgroup of
    the version-1 cpu controller and its parents; a hierarchy without cpu is left out."""
    v1, v2, mem = tmp_path / "cpu,cpuacct", tmp_path / "unified", tmp_path / "memory"
    for d in (v1, v1 / "box", v1 / "box" / "inner", v2, v2 / "me", v2 / "me" / "study",
              mem, mem / "box"):
        _write(d / "cpu.stat", "usage_usec 0\n")
    proc = tmp_path / "proc"
    _write(proc / "self" / "mountinfo",
           f"30 25 0:26 / {v1} rw - cgroup cgroup rw,cpu,cpuacct\n"
           f"31 25 0:27 / {v2} rw - cgroup2 cgroup2 rw\n"
           f"32 25 0:28 / {mem} rw - cgroup cgroup rw,memory\n"
           "40 1 8:1 / / rw - ext4 /dev/vda rw\n")
    _write(proc / "self" / "cgroup", "3:memory:/box\n2:cpu,cpuacct:/box/inner\n0::/me\n")
    monkeypatch.setattr(cpustat, "PROC", proc)
    assert cpustat.quota_cgroups(v2 / "me" / "study") == (
        v1 / "box" / "inner", v1 / "box", v1, v2 / "me" / "study", v2 / "me", v2)
    assert cpustat.quota_cgroups(None) == (v1 / "box" / "inner", v1 / "box", v1, v2 / "me", v2)


def test_the_time_a_quota_held_a_cgroup_back_is_read_in_both_versions(tmp_path: Path) -> None:
    v1 = _write(tmp_path / "a" / "cpu.stat",
                "nr_periods 27\nnr_throttled 26\nthrottled_time 1182008953\n").parent
    v2 = _write(tmp_path / "b" / "cpu.stat",
                "usage_usec 5\nnr_throttled 3\nthrottled_usec 250000\n").parent
    none = _write(tmp_path / "c" / "cpu.stat", "usage_usec 5\n").parent
    assert cpustat.throttled((v1, v2, none)) == pytest.approx((1.182008953, 0.25, 0.0))
    assert cpustat.throttled((none,)) is None
    assert cpustat.throttled(()) is None


def test_a_run_a_cpu_quota_held_back_is_flagged_with_no_one_else_on_its_cores(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Others took nothing, the run waited for its CPU (throttled tasks stay runnable):
    flagged for the quota, named first; a quota that held it back little is no cause."""
    clock, held = [0.0], [0.0]
    monkeypatch.setattr(cpustat, "cpu_seconds", lambda cpus: (clock[0] * 0.3, 0.0))
    monkeypatch.setattr(cpustat, "cgroup_usage", lambda path: clock[0] * 0.3)
    monkeypatch.setattr(cpustat, "pressure", lambda path: clock[0] * 0.7)
    monkeypatch.setattr(cpustat, "llc_cpus", lambda cpus: cpus)
    monkeypatch.setattr(cpustat, "quota_cgroups", lambda cgroup: (tmp_path,))
    monkeypatch.setattr(cpustat, "throttled", lambda cgroups: (held[0],))
    watch = NoiseWatch([0, 1], clock=lambda: clock[0])
    cgroup = tmp_path / "run"
    cgroup.mkdir()
    for seconds, hold, flagged in ((2.0, 1.4, True), (2.0, 0.2, False)):
        before = watch.start(cgroup)
        clock[0] += seconds
        held[0] += hold
        sample = watch.stop(before)
        assert sample.others_share == 0.0
        assert sample.throttled == pytest.approx(hold / (seconds * 2))
        assert sample.disturbed is flagged
        if flagged:
            assert sample.evidence == "a CPU quota held it back 35% of cores 0-1"
            assert sample.as_dict()["throttled"] == pytest.approx(0.35)
    assert judge(0.5, 0.0, "0-1", throttled=THROTTLED_SHARE + 0.01)[1] == (
        "a CPU quota held it back 11% of cores 0-1")


def test_judge_names_stopped_processes() -> None:
    assert judge(0.0, 0.0, "0-1", stopped=STOPPED_SHARE + 0.3) == (
        True, "its processes were stopped (by a signal or a tracer) 40% of the time")
    assert judge(0.0, 0.0, "0-1", stopped=STOPPED_SHARE) == (False, None)


def test_a_stopped_process_is_read_from_the_state_after_its_name(tmp_path: Path) -> None:
    _write(tmp_path / "11" / "stat", "11 (a) R (x) S 1 11 11 0 -1\n")  # a name with ') S'
    _write(tmp_path / "12" / "stat", "12 (b) T 1 12 12 0 -1\n")
    _write(tmp_path / "13" / "stat", "13 (gdb me) t 1 13 13 0 -1\n")
    assert not stopped_now([11], tmp_path)
    assert stopped_now([11, 12], tmp_path)
    assert stopped_now([13], tmp_path)
    assert not stopped_now([99], tmp_path)  # gone


# ---------------------------------------------------------------- real runs


STOPS = """\
import os, signal, subprocess, sys, time
if sys.argv[1] == "1":  # stopped by a signal for a second; a process of its own goes on
    subprocess.Popen([sys.executable, "-c",
                      "import os, signal, time; time.sleep(1.0); os.kill(%d, signal.SIGCONT)"
                      % os.getpid()])
    os.kill(os.getpid(), signal.SIGSTOP)
else:
    time.sleep(1.0)
print("x=" + sys.argv[1])
"""

STUDY = """\
name: {name}
workload:
  name: command
  options:
    argv: [{python}, {prog}, "{{x}}"]
    foms: {{x: 'x=(?P<value>[0-9]+)'}}
parameters: {{x: [1, 2]}}
repeats: 1
baseline: {{x: 2}}
objective: {{fom: wall_s, direction: minimize}}
"""


def _study(tmp_path: Path, name: str, program: str) -> Path:
    prog = _write(tmp_path / f"{name}.py", program)
    return _write(tmp_path / f"{name}.yaml",
                  STUDY.format(name=name, python=sys.executable, prog=prog))


def test_a_run_stopped_by_a_signal_is_flagged_and_one_that_slept_is_not(
        tmp_path: Path) -> None:
    """Point 1 stops itself for a second (SIGSTOP; a process of its own sends SIGCONT),
    point 2 sleeps as long: only the first is flagged, for being stopped — neither took a
    CPU nor waited for one."""
    from tunelab.execute.procs import cgroup_base
    from tunelab.execute.runner import run_study
    from tunelab.execute.study import prepare_study
    from tunelab.spec import load_study
    from tunelab.store import open_store

    if cgroup_base() is None:
        pytest.skip("no writable cgroup v2 here: a run's processes are not known by cgroup")
    path = _study(tmp_path, "stops", STOPS)
    assert run_study(prepare_study(load_study(path)), tmp_path / "s").counts == {"ok": 2}
    with open_store(tmp_path / "s") as store:
        runs = store.runs_frame().set_index("x")
    assert runs.loc[1, "noise.stopped"] > 0.5
    assert runs.loc[1, "noise.disturbed"] == 1
    assert str(runs.loc[1, "noise.evidence"]).startswith("its processes were stopped")
    assert runs.loc[2, "noise.stopped"] == 0.0
    assert "stopped" not in str(runs.loc[2, "noise.evidence"])


@pytest.fixture
def quota_cgroup() -> Iterator[Path]:
    """A version-1 cpu cgroup allowed 10 % of one CPU — less than a busy machine leaves
    any process — removed afterwards (skip where none can be made: not root, no such
    hierarchy)."""
    here = next((p for p in cpustat.quota_cgroups(None)
                 if (p / "cpu.cfs_quota_us").is_file()), None)
    if here is None or not os.access(here, os.W_OK):
        pytest.skip("no writable cgroup of the version-1 cpu controller here")
    box = here / f"tunelab-test-{uuid.uuid4().hex[:8]}"
    try:
        box.mkdir()
        (box / "cpu.cfs_period_us").write_text("100000")
        (box / "cpu.cfs_quota_us").write_text("10000")
    except OSError as exc:
        pytest.skip(f"cannot make a cpu cgroup with a quota here: {exc}")
    try:
        yield box
    finally:
        for _ in range(50):
            try:
                box.rmdir()
                break
            except OSError:
                os.sched_yield()


def test_a_run_held_back_by_a_real_cpu_quota_is_flagged(quota_cgroup: Path) -> None:
    """The watch, and a child computing 0.1 CPU-s, in a cgroup allowed a tenth of a CPU:
    the quota held the child back (at least 0.9 s on one of the cores) and the sample says
    so, whatever else the machine does."""
    home = next(p for p in cpustat.quota_cgroups(None) if (p / "cpu.cfs_quota_us").is_file())
    (quota_cgroup / "cgroup.procs").write_text(str(os.getpid()))
    try:
        watch = NoiseWatch()
        before = watch.start()
        subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                        "while time.process_time() - t < 0.1:\n    pass"], check=True,
                       timeout=120)
        sample = watch.stop(before)
    finally:
        (home / "cgroup.procs").write_text(str(os.getpid()))
    assert sample.throttled is not None and sample.throttled > THROTTLED_SHARE
    assert sample.disturbed
    assert sample.evidence is not None
    assert sample.evidence.startswith("a CPU quota held it back")


def test_a_cpu_quota_below_the_cores_is_said_at_the_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The smallest quota over the cgroups (v2 cpu.max, v1 cfs_quota_us; "max" and -1 are
    none) is said when it allows fewer CPUs than the run's cores, never otherwise."""
    v2 = _write(tmp_path / "v2" / "cpu.max", "max 100000\n").parent
    v1 = _write(tmp_path / "v1" / "cpu.cfs_quota_us", "30000\n").parent
    _write(v1 / "cpu.cfs_period_us", "100000\n")
    wide = _write(tmp_path / "wide" / "cpu.max", "400000 100000\n").parent
    none = _write(tmp_path / "none" / "cpu.cfs_quota_us", "-1\n").parent
    _write(none / "cpu.cfs_period_us", "100000\n")
    assert cpustat.quota((v2, v1, wide, none)) == (0.3, v1)
    assert cpustat.quota((v2, none)) is None
    monkeypatch.setattr(cpustat, "cpu_seconds", lambda cpus: (0.0, 0.0))
    monkeypatch.setattr(cpustat, "llc_cpus", lambda cpus: cpus)
    for cgroups, said in (((v2, v1), f"a CPU quota allows the runs 0.3 CPUs of cores 0-1 "
                                     f"({v1}); runs it holds back are flagged disturbed"),
                          ((wide, none), None)):
        monkeypatch.setattr(cpustat, "quota_cgroups", lambda cgroup, c=cgroups: c)
        assert NoiseWatch([0, 1], sleep=lambda s: None).busy_now() == said


def test_runs_held_back_by_a_quota_are_not_said_to_be_disturbed_by_other_processes() -> None:
    from tunelab.report.results import busy_line
    from tunelab.stats.disturbance import Disturbance

    line = busy_line(Disturbance(
        watched=4, disturbed=4, others_median=0.0, others_max=0.01, from_start=True,
        evidence=("a CPU quota held it back 35% of cores 0-1",)))
    assert line.startswith("The machine was busy from the start: 4 of 4 runs were disturbed "
                           "(e.g. a CPU quota held it back 35% of cores 0-1)")
    assert "other processes" not in line


def test_a_sampler_stops_reading_once_its_run_has_ended(tmp_path: Path) -> None:
    """No thread outlives its run: once the cgroup that held processes is empty the sampler
    ends by itself; what it read stays (this process, running, never stopped)."""
    import time

    from tunelab.procstate import StopSampler

    procs = _write(tmp_path / "cgroup.procs", f"{os.getpid()}\n")
    sampler = StopSampler(tmp_path, every_s=0.01)
    deadline = time.monotonic() + 30
    while sampler.readings == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    procs.write_text("")
    while sampler.reading and time.monotonic() < deadline + 30:
        time.sleep(0.01)
    assert not sampler.reading
    assert sampler.readings > 0
    assert sampler.end() == 0.0
