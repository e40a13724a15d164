"""Noise watch: absolute evidence on the run's own cores, the flag, waiting for quiet cores,
the store, the views — and a real busy machine: a bounded load pinned to the run's cores."""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tunelab import cpustat, noise
from tunelab.cpustat import cpu_list_text, parse_cpu_list
from tunelab.noise import DISTURB_SHARE, NoiseWatch, judge
from tunelab.report.results import results_from_frame
from tunelab.store import RunRecord, open_store
from tunelab.workload import Objective


class FakeMachine:
    """Two cores whose counters the test advances by hand: ``others`` and ``own`` are shares
    of the two cores; the run's own CPU time shows in its cgroup."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cgroup: bool = True) -> None:
        self.now = self.busy = self.steal = self.own = self.waited = 0.0
        self.others_while_sleeping = 0.1
        monkeypatch.setattr(cpustat, "cpu_seconds", lambda cpus: (self.busy, self.steal))
        monkeypatch.setattr(cpustat, "cgroup_usage",
                            lambda path: self.own if cgroup and path is not None else None)
        monkeypatch.setattr(cpustat, "rusage", lambda who: self.own if not cgroup
                            and who == noise.resource.RUSAGE_CHILDREN else 0.0)
        monkeypatch.setattr(cpustat, "pressure", lambda path: self.waited)
        monkeypatch.setattr(cpustat, "load", lambda: 1.5)
        monkeypatch.setattr(cpustat, "mhz", lambda: 2400.0)
        monkeypatch.setattr(cpustat, "llc_cpus", lambda cpus: cpus)  # no cache neighbours

    def advance(self, seconds: float, others: float, own: float = 0.0,
                steal: float = 0.0) -> None:
        self.now += seconds
        self.busy += (others + own) * seconds * 2
        self.own += own * seconds * 2
        self.steal += steal * seconds * 2
        self.waited += min(others, 1.0) * seconds

    def sleep(self, seconds: float) -> None:
        self.advance(seconds, self.others_while_sleeping)

    def watch(self) -> NoiseWatch:
        return NoiseWatch([0, 1], clock=lambda: self.now, sleep=self.sleep)


def test_cpu_lists_are_written_as_linux_does() -> None:
    assert cpu_list_text([0, 1]) == "0-1"
    assert cpu_list_text([3, 0, 1, 2, 6, 8, 9]) == "0-3,6,8-9"
    assert cpu_list_text([5]) == "5"


def test_judge_flags_others_beyond_the_share_and_says_why() -> None:
    assert judge(DISTURB_SHARE + 0.01, 0.0, "0-1") == (
        True, f"others took {DISTURB_SHARE + 0.01:.0%} of cores 0-1")
    assert judge(DISTURB_SHARE, 0.0, "0-1") == (False, None)
    assert judge(0.0, 0.2, "2") == (True, "the hypervisor stole 20% of cores 2")
    assert judge(None, None, "0") == (False, None)


def test_a_machine_busy_from_the_start_flags_every_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Others take 80 % of the cores before the study and throughout: the watch judged
    against the start would call this normal; on absolute evidence every run is flagged."""
    m = FakeMachine(monkeypatch)
    m.others_while_sleeping = 0.8
    watch = m.watch()
    assert watch.busy_now() is not None and "80% of cores 0-1" in watch.busy_now()  # type: ignore[operator]
    for _ in range(3):
        before = watch.start(Path("/cg"))
        m.advance(10, others=0.8, own=0.2)
        sample = watch.stop(before)
        assert sample.disturbed and sample.evidence == "others took 80% of cores 0-1"
        assert sample.others_share == pytest.approx(0.8) and sample.own_share == pytest.approx(0.2)
        assert sample.psi_some == pytest.approx(0.8) and sample.cpus == 2


def test_the_runs_own_cpu_time_is_not_counted_as_others(monkeypatch: pytest.MonkeyPatch) -> None:
    for cgroup in (True, False):  # from the cgroup's cpu.stat, else from the children's rusage
        m = FakeMachine(monkeypatch, cgroup=cgroup)
        m.others_while_sleeping = 0.0
        watch = m.watch()
        assert watch.busy_now() is None
        before = watch.start(Path("/cg"))
        m.advance(10, others=0.05, own=0.95)
        quiet = watch.stop(before)
        assert not quiet.disturbed and quiet.evidence is None
        assert quiet.others_share == pytest.approx(0.05) and quiet.own_share == pytest.approx(0.95)
        row = quiet.as_dict()
        assert row["disturbed"] == 0.0 and row["cpu_list"] == "0-1"
        assert row["others_cpu"] == row["others_share"]


def test_stolen_cores_are_a_disturbance(monkeypatch: pytest.MonkeyPatch) -> None:
    m = FakeMachine(monkeypatch)
    watch = m.watch()
    before = watch.start(Path("/cg"))
    m.advance(10, others=0.0, own=0.6, steal=0.3)
    sample = watch.stop(before)
    assert sample.disturbed and "hypervisor stole 30%" in (sample.evidence or "")


def test_wait_quiet_waits_for_quiet_cores_or_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    m = FakeMachine(monkeypatch)
    m.others_while_sleeping = 0.9
    watch = m.watch()
    assert watch.wait_quiet(level=0.05, max_wait_s=30) == pytest.approx(30, abs=1.01)
    m.others_while_sleeping = 0.01
    assert watch.wait_quiet(level=0.05, max_wait_s=30) == pytest.approx(1.0)


def test_cpu_lists_are_read_as_linux_writes_them() -> None:
    assert parse_cpu_list("0-3,6\n") == {0, 1, 2, 3, 6} and parse_cpu_list("5") == {5}
    for bad in ("", "x", "3-1", "-1", "0-99999999"):
        assert parse_cpu_list(bad) == set()


def _cache(root: Path, cpu: int, index: int, level: int, kind: str, shared: str) -> None:
    d = root / f"cpu{cpu}" / "cache" / f"index{index}"
    d.mkdir(parents=True)
    (d / "level").write_text(f"{level}\n")
    (d / "type").write_text(f"{kind}\n")
    (d / "shared_cpu_list").write_text(f"{shared}\n")


def test_the_cores_sharing_the_last_level_cache_come_from_sysfs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Per core, the data or unified cache of the highest level: cores 0-3 share an L3,
    4-7 another; the instruction cache's sharing never counts."""
    for cpu in range(8):
        _cache(tmp_path, cpu, 0, 1, "Data", str(cpu))
        _cache(tmp_path, cpu, 1, 1, "Instruction", "0-7")
        _cache(tmp_path, cpu, 2, 2, "Unified", str(cpu))
        _cache(tmp_path, cpu, 3, 3, "Unified", "0-3" if cpu < 4 else "4-7")
    monkeypatch.setattr(cpustat, "SYS_CPU", tmp_path)
    assert cpustat.llc_cpus((1,)) == (0, 1, 2, 3)
    assert cpustat.llc_cpus((3, 4)) == tuple(range(8))
    assert cpustat.llc_cpus((9,)) == (9,)  # sysfs does not say: the run's own
    watch = NoiseWatch([0, 1, 2, 3])
    assert watch.llc_cpus == () and watch.llc_cpu_list == ""  # it covers its cache
    assert NoiseWatch([2]).llc_cpu_list == "0-3"


def test_judge_flags_others_on_the_cores_sharing_the_last_level_cache() -> None:
    assert judge(0.0, 0.0, "1", llc_others_share=0.5, llc_cpu_list="0-1") == (
        True, "others took 50% of cores 0-1, which share the last-level cache of cores 1")
    assert judge(0.3, 0.0, "1", llc_others_share=0.5, llc_cpu_list="0-1") == (
        True, "others took 30% of cores 1")  # its own cores first
    assert judge(0.0, 0.0, "1", llc_others_share=DISTURB_SHARE, llc_cpu_list="0-1") == (
        False, None)


def test_a_run_pinned_beside_a_busy_core_that_shares_its_cache_is_flagged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured here: a memory-bound run pinned to core 1 of 2, beside one process streaming
    memory on core 0, ran 1.7-2x slower with core 1 to itself. Others took ~0 % of its own
    core; beside it, they took ~50 % of cores 0-1, which share its last-level cache:
    flagged."""
    m = FakeMachine(monkeypatch)
    counters = {(1,): [0.0], (0, 1): [0.0]}  # busy seconds of core 1 and of cores 0-1

    def neighbour_busy(seconds: float) -> None:  # core 0 busy, core 1 idle
        m.now += seconds
        counters[(0, 1)][0] += seconds

    monkeypatch.setattr(cpustat, "cpu_seconds", lambda cpus: (counters[cpus][0], 0.0))
    monkeypatch.setattr(cpustat, "llc_cpus", lambda cpus: (0, 1))
    watch = NoiseWatch([1], clock=lambda: m.now, sleep=neighbour_busy)
    assert watch.llc_cpu_list == "0-1"
    assert watch.busy_now() == (
        "the machine is busy: other processes take 50% of cores 0-1, which share the "
        "last-level cache of cores 1 now; runs taken like this are flagged disturbed "
        "(--wait-quiet waits for quiet cores)")
    assert watch.others_now() == pytest.approx(0.5)  # what --wait-quiet waits on
    before = watch.start(Path("/cg"))
    m.now += 10
    m.own += 9.8  # the run: 98 % of core 1
    counters[(1,)][0] += 9.9  # core 1: the run and 1 % of others
    counters[(0, 1)][0] += 9.9 + 9.6  # core 0: a process busy 96 % of the time
    sample = watch.stop(before)
    assert sample.others_share == pytest.approx(0.01)
    assert sample.llc_others_share == pytest.approx(0.48)  # beside its own core: 9.6 s / 20 s
    assert sample.disturbed and sample.evidence == (
        "others took 48% of cores 0-1, which share the last-level cache of cores 1")
    row = sample.as_dict()
    assert row["llc_cpu_list"] == "0-1" and row["llc_others_share"] == pytest.approx(0.48)


def test_a_run_that_waited_while_others_took_a_tenth_of_its_core_is_flagged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured here: a process busy 15 % of every 10 ms on the one core of a CPU-bound run
    took 14 % of it, the run's tasks waited for a CPU 14 % of its time, and it ran 18 %
    slower — under the 20 % share. That it waited (its own cgroup's CPU pressure) says it
    wanted the core: flagged. Without its own cgroup (the machine's pressure counts others'
    waiting too), or when it did not wait, the 20 % share stays the rule."""
    for cgroup, waits, flagged in ((True, True, True), (False, True, False),
                                   (True, False, False)):
        m = FakeMachine(monkeypatch, cgroup=cgroup)
        watch = m.watch()
        before = watch.start(Path("/cg"))
        m.advance(10, others=0.14, own=0.86)  # the fake's run waits as long as others run
        if not waits:  # others took only what the run left idle
            m.waited = before.pressure or 0.0
        sample = watch.stop(before)
        assert sample.disturbed == flagged and sample.others_share == pytest.approx(0.14)
        if flagged:
            assert sample.evidence == ("others took 14% of cores 0-1 while its tasks waited "
                                       "for a CPU 14% of the time")


def test_on_its_one_cpu_what_others_took_while_the_run_left_it_idle_is_no_disturbance(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured here: a run pinned to core 1 that sleeps half its time, beside a busy
    process whose session's autogroup is at nice 19: others took ~60 % of core 1, the run
    waited for it 0-4 % of the time and ran as fast as alone (+2 %). On one CPU others run
    only while the run leaves it idle, never beside it: not disturbed, and that share does
    not count as the cache neighbours' either. On two CPUs they may run beside it: flagged."""
    m = FakeMachine(monkeypatch)
    counters = {(1,): [0.0], (0, 1): [0.0]}
    monkeypatch.setattr(cpustat, "cpu_seconds", lambda cpus: (counters[cpus][0], 0.0))
    monkeypatch.setattr(cpustat, "llc_cpus", lambda cpus: (0, 1))
    watch = NoiseWatch([1], clock=lambda: m.now, sleep=m.sleep)
    before = watch.start(Path("/cg"))
    m.now += 10
    m.own += 4.0
    m.waited += 0.2  # it waited 2 % of its time
    counters[(1,)][0] += 4.0 + 6.0  # the run, and others in its idle time
    counters[(0, 1)][0] += 10.0 + 1.0  # core 0: 10 % busy
    sample = watch.stop(before)
    assert sample.others_share == pytest.approx(0.6) and sample.psi_some == pytest.approx(0.02)
    assert sample.llc_others_share == pytest.approx(0.05)
    assert not sample.disturbed and sample.evidence is None
    assert judge(0.6, 0.0, "0-1", waited=0.02) == (True, "others took 60% of cores 0-1")
    assert judge(0.6, 0.0, "1", waited=None) == (True, "others took 60% of cores 1")
    assert judge(0.6, 0.0, "1", waited=0.3)[0]  # it wanted the CPU they took


def test_judge_needs_both_others_and_the_runs_own_waiting() -> None:
    assert judge(0.15, 0.0, "1", waited=0.15)[0]
    assert not judge(0.05, 0.0, "1", waited=0.9)[0]  # more ranks than cores: its own waiting
    assert not judge(0.15, 0.0, "1", waited=0.05)[0]
    assert not judge(0.15, 0.0, "1", waited=None)[0]


def test_a_real_sample_is_consistent() -> None:
    """Whatever this machine is doing: shares within [0, 1], flagged exactly when others
    took more than the set share, the evidence saying so."""
    watch = NoiseWatch()
    sample = watch.stop(watch.start())
    assert sample.cpu_list and sample.cpus == len(os.sched_getaffinity(0))
    if sample.others_share is not None:
        assert 0.0 <= sample.others_share <= 1.0
        assert (sample.disturbed, sample.evidence) == judge(
            sample.others_share, sample.steal, sample.cpu_list,
            llc_others_share=sample.llc_others_share, llc_cpu_list=sample.llc_cpu_list)
        assert (sample.evidence is not None) == sample.disturbed


# ---------------------------------------------------------------- the store and the views

OLD_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE points (id INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, params TEXT NOT NULL);
CREATE TABLE sysinfo (id INTEGER PRIMARY KEY, taken_at TEXT NOT NULL, snapshot TEXT NOT NULL);
CREATE TABLE runs (id INTEGER PRIMARY KEY, point_id INTEGER NOT NULL REFERENCES points(id),
    repeat INTEGER NOT NULL, status TEXT NOT NULL, reason TEXT, rc INTEGER,
    wall_s REAL NOT NULL, started_at TEXT NOT NULL, ended_at TEXT NOT NULL, host TEXT NOT NULL,
    command TEXT NOT NULL, env TEXT NOT NULL, run_dir TEXT NOT NULL,
    sysinfo_id INTEGER REFERENCES sysinfo(id), UNIQUE (point_id, repeat));
CREATE TABLE foms (run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    name TEXT NOT NULL, value REAL NOT NULL, PRIMARY KEY (run_id, name));
INSERT INTO points VALUES (1, '{"x": 1}', '{"x": 1}');
INSERT INTO runs VALUES (1, 1, 0, 'ok', NULL, 0, 1.0, 't', 't', 'h', '[]', '{}', 'r', NULL);
INSERT INTO foms VALUES (1, 'wall_s', 1.0);
"""


def _record(point: dict[str, int], repeat: int, value: float, disturbed: bool) -> RunRecord:
    share = 0.7 if disturbed else 0.01
    return RunRecord(
        point_key=json.dumps(point), params=point, repeat=repeat, status="ok", reason=None,
        rc=0, wall_s=value, started_at="t", ended_at="t", host="h", command=[], env={},
        run_dir="r", foms={"wall_s": value},
        noise={"cpus": 2.0, "cpu_list": "0-1", "others_share": share, "others_cpu": share,
               "own_share": 0.3, "psi_some": 0.5, "steal": 0.0, "load_before": 1.0,
               "load_after": 2.0, "mhz_before": None, "mhz_after": None,
               "evidence": f"others took {share:.0%} of cores 0-1" if disturbed else None,
               "disturbed": 1.0 if disturbed else 0.0})


def test_a_schema_1_store_is_migrated_in_place(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "tunelab.db")
    conn.executescript(OLD_SCHEMA)
    conn.close()
    with open_store(tmp_path, write=True) as store:
        assert store.get_meta("schema_version") == "3"
        store.record_run(_record({"x": 1}, 1, 1.1, disturbed=True))
        frame = store.runs_frame()
    assert len(frame) == 2
    assert math.isnan(frame.loc[0, "noise.others_share"])  # the old run has no sample
    assert frame.loc[1, "noise.others_share"] == 0.7 and frame.loc[1, "noise.disturbed"] == 1
    assert frame.loc[1, "noise.evidence"] == "others took 70% of cores 0-1"
    assert math.isnan(frame.loc[1, "noise.mhz_after"])


def _busy_study(tmp_path: Path) -> Path:
    with open_store(tmp_path, create=True) as store:
        for r in range(4):
            store.record_run(_record({"x": 1}, r, 10.0 + r / 10, disturbed=r == 0))
            store.record_run(_record({"x": 2}, r, 8.0 + r / 10, disturbed=r in (0, 2)))
    return tmp_path


def test_disturbed_runs_are_counted_said_and_left_out_on_request(tmp_path: Path) -> None:
    with open_store(_busy_study(tmp_path)) as store:
        frame = store.runs_frame()
    kept = results_from_frame(frame, Objective("wall_s"), json.dumps({"x": 1}))
    by_x = {s.params["x"]: s for s in kept.summaries}
    assert (by_x[1].disturbed, by_x[2].disturbed) == (1, 2) and by_x[2].n == 4
    assert kept.disturbance is not None and kept.disturbance.disturbed == 3
    assert kept.disturbance.from_start is False  # the study's second run was quiet
    warning = next(n for n in kept.notes if "runs were disturbed" in n)
    assert "3 of 8 runs" in warning and "others took 70% of cores 0-1" in warning
    assert "--exclude-disturbed" in warning
    left = results_from_frame(frame, Objective("wall_s"), json.dumps({"x": 1}),
                              exclude_disturbed=True)
    by_x = {s.params["x"]: s for s in left.summaries}
    assert (by_x[1].n, by_x[2].n, by_x[2].left_out) == (3, 2, 2)
    assert any("the 3 disturbed ok runs are left out" in n for n in left.notes)


def test_a_machine_busy_from_the_start_is_said_from_the_runs_table(tmp_path: Path) -> None:
    with open_store(tmp_path, create=True) as store:
        for r in range(3):
            for x in (1, 2):
                store.record_run(_record({"x": x}, r, 10.0 + x + r / 10, disturbed=True))
        frame = store.runs_frame()
    results = results_from_frame(frame, Objective("wall_s"), json.dumps({"x": 1}))
    assert results.disturbance is not None and results.disturbance.from_start
    assert results.trust[0].startswith("The machine was busy from the start: 6 of 6 runs")


def test_disturbed_runs_can_be_discarded_to_run_again(tmp_path: Path) -> None:
    with open_store(_busy_study(tmp_path), write=True) as store:
        runs = store.disturbed_runs()
        assert [(json.loads(k)["x"], r) for k, r, _ in runs] == [(1, 0), (2, 0), (2, 2)]
        store.discard_runs(runs, "now")
        assert store.disturbed_runs() == [] and len(store.runs_frame()) == 5
        assert (2, 2) not in {(json.loads(k)["x"], r) for k, r in store.completed()}
        noted = json.loads(store.get_meta("discarded_runs") or "[]")
        assert len(noted) == 3 and noted[0]["evidence"].startswith("others took")


# ---------------------------------------------------------------- a real busy machine


def _spin(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    while True:
        pass


@contextlib.contextmanager
def busy_cores(per_core: int = 2) -> Iterator[None]:
    """A bounded load: ``per_core`` busy processes pinned to each core this process may
    use (its runs inherit these cores), killed on the way out."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_spin, args=(cpu,), daemon=True)
             for cpu in sorted(os.sched_getaffinity(0)) for _ in range(per_core)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.join(5)


SPIN = """\
import sys, time
t = time.process_time()
while time.process_time() - t < 0.4:
    pass
print("x=" + sys.argv[1])
"""

STUDY = """\
name: busy
workload:
  name: command
  options:
    argv: [{python}, {spin}, "{{x}}"]
    foms: {{x: 'x=(?P<value>[0-9]+)'}}
parameters: {{x: [1, 2]}}
repeats: 2
baseline: {{x: 1}}
objective: {{fom: wall_s, direction: minimize}}
"""


@pytest.mark.slow
def test_runs_on_cores_another_load_takes_are_flagged_and_said(tmp_path: Path) -> None:
    """Two busy processes per core of the study, for the whole study: every run is
    flagged with its evidence, the start says the machine is busy, compare says so from
    the runs table, and --exclude-disturbed leaves every run out."""
    from tunelab.execute.runner import run_study
    from tunelab.execute.study import prepare_study
    from tunelab.report.load import load_results
    from tunelab.spec import load_study

    (tmp_path / "spin.py").write_text(SPIN)
    path = tmp_path / "busy.yaml"
    path.write_text(STUDY.format(python=sys.executable, spin=tmp_path / "spin.py"))
    notes: list[str] = []
    with busy_cores():
        outcome = run_study(prepare_study(load_study(path)), tmp_path / "s",
                            on_note=notes.append)
    assert outcome.counts == {"ok": 4}
    assert notes and "the machine is busy" in notes[0]
    results = load_results(tmp_path / "s")
    flags = results.runs["noise.disturbed"].tolist()
    assert flags == [1, 1, 1, 1]
    assert all(e.startswith("others took") for e in results.runs["noise.evidence"])
    assert (results.runs["noise.others_share"] > DISTURB_SHARE).all()
    assert results.trust[0].startswith("The machine was busy from the start: 4 of 4 runs")
    left = load_results(tmp_path / "s", exclude_disturbed=True)
    assert all(s.n == 0 and s.left_out == 2 for s in left.summaries)
    assert "No run left to judge: the 4 ok runs were disturbed" in left.notes[-1]
    assert any("(2 disturbed, left out)" in n for n in left.notes)  # the baseline's


@pytest.mark.slow
def test_busy_cores_beside_a_pinned_watch_are_seen_through_the_shared_cache() -> None:
    """A watch pinned to one core of this machine, busy processes on the other cores that
    share its last-level cache (and that this process may use): over 1 s, others took more
    than the share of the cache's cores, whatever else the machine does."""
    own = sorted(os.sched_getaffinity(0))
    watch = NoiseWatch([own[-1]])
    beside = sorted(set(watch.llc_cpus) & set(own) - {own[-1]})
    if len(beside) <= 2 * DISTURB_SHARE * len(watch.llc_cpus):
        pytest.skip("too few cores of this process share a last-level cache")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_spin, args=(cpu,), daemon=True) for cpu in beside]
    for p in procs:
        p.start()
    try:
        before = watch.start()
        time.sleep(1.0)
        sample = watch.stop(before)
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.join(5)
    assert sample.llc_others_share is not None and sample.llc_others_share > DISTURB_SHARE
    assert sample.disturbed

