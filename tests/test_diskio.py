"""Others' disk I/O as noise-watch evidence: which disks count, the bytes of the run, of
others and of earlier writes, the I/O waiting, the rule and its phrase, the store — on fake
/sys and /proc trees (the numbers are those measured on the project's machine)."""

from __future__ import annotations

import math
import os
import sqlite3
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.test_noise import _record
from tunelab import cpustat, diskio
from tunelab.diskio import DiskIO, bytes_text, physical_disks
from tunelab.noise import CONTENDED_SHARE, IO_OTHERS_SHARE, NoiseWatch, judge
from tunelab.store import open_store
from tunelab.store.schema import NOISE_COLUMNS

MB = 1_000_000
SECTOR = 512


class FakeDisks:
    """A machine's block devices, memory and the study's cgroup as files under ``root``:
    two physical disks (vda; sda with a partition), and loop, zram, ram, device-mapper and
    md devices that are not disks. The test moves bytes and the run's waiting by hand."""

    PHYSICAL = {"vda": ("pci0000:00/virtio1", "254:0"), "sda": ("pci0000:00/ata1", "8:0")}
    VIRTUAL = {"loop0": "7:0", "zram0": "252:0", "ram0": "1:0", "dm-0": "253:0",
               "md0": "9:0"}

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch, *,
                 io_stat: bool = True) -> None:
        self.root, self.io_stat = root, io_stat
        self.now = 0.0
        self.moved = dict.fromkeys([*self.PHYSICAL, *self.VIRTUAL], 0)  # bytes written
        self.cgroup_bytes = {"254:0": 0, "253:0": 0}  # the run's bytes, per device
        self.children = [0, 0]  # (read, written) bytes of the finished children
        self.ours = [0, 0]  # (read, written) bytes of tunelab itself
        self.dirty = self.writeback = 0
        self.waited = 0.0  # seconds the cgroup's tasks waited for I/O
        block = root / "sys" / "block"
        block.mkdir(parents=True)
        for name, (where, dev) in self.PHYSICAL.items():
            self._device(root / "sys" / "devices" / where / "block" / name, block, dev)
        for name, dev in self.VIRTUAL.items():
            self._device(root / "sys" / "devices" / "virtual" / "block" / name, block, dev)
        part = root / "sys" / "devices" / "pci0000:00/ata1" / "block" / "sda" / "sda1"
        part.mkdir()
        (part / "dev").write_text("8:1\n")
        vm = root / "proc" / "sys" / "vm"
        vm.mkdir(parents=True)
        (vm / "dirty_expire_centisecs").write_text("3000\n")
        (vm / "dirty_writeback_centisecs").write_text("500\n")
        self.cgroup = root / "cg"
        self.cgroup.mkdir()
        (self.cgroup / "cpu.stat").write_text("usage_usec 0\n")
        monkeypatch.setattr(diskio, "_SYS_BLOCK", block)
        monkeypatch.setattr(diskio, "_PROC", root / "proc")
        monkeypatch.setattr(diskio, "_rusage_bytes", lambda who: (
            (self.children[0], self.children[1]) if who == diskio.resource.RUSAGE_CHILDREN
            else (self.ours[0], self.ours[1])))
        monkeypatch.setattr(cpustat, "cpu_seconds", lambda cpus: None)  # CPU rules silent
        monkeypatch.setattr(cpustat, "llc_cpus", lambda cpus: cpus)
        self.write()

    @staticmethod
    def _device(path: Path, block: Path, dev: str) -> None:
        path.mkdir(parents=True)
        (path / "dev").write_text(f"{dev}\n")
        (block / path.name).symlink_to(path)

    def write(self) -> None:
        """The counters as files, as Linux writes them."""
        for name, moved in self.moved.items():
            where = (f"{self.PHYSICAL[name][0]}/block/{name}" if name in self.PHYSICAL
                     else f"virtual/block/{name}")
            # read ios, merges, sectors, ticks; the same for writes; in flight, io ticks,
            # queue time; discards (not data moved: 10**6 sectors here); flushes
            sectors = moved // SECTOR
            (self.root / "sys" / "devices" / where / "stat").write_text(
                f"  100 0 {sectors // 4} 5 200 0 {sectors - sectors // 4} 9 0 1 1 "
                "7 0 1000000 3 4 1\n")
        part = self.root / "sys" / "devices" / "pci0000:00/ata1/block/sda/sda1/stat"
        part.write_text(f"  1 0 {self.moved['sda'] // SECTOR} 0 1 0 0 0 0 0 0\n")
        (self.root / "proc" / "meminfo").write_text(
            f"MemTotal:       24684140 kB\nDirty:          {-(-self.dirty // 1024)} kB\n"
            f"Writeback:      {-(-self.writeback // 1024)} kB\nWritebackTmp:          0 kB\n")
        if self.io_stat:
            (self.cgroup / "io.stat").write_text("".join(
                f"{dev} rbytes={n // 2} wbytes={n - n // 2} rios=1 wios=1 dbytes=0 dios=0\n"
                for dev, n in self.cgroup_bytes.items()))
        (self.cgroup / "io.pressure").write_text(
            f"some avg10=0.00 avg60=0.00 avg300=0.00 total={round(self.waited * 1e6)}\n"
            f"full avg10=0.00 avg60=0.00 avg300=0.00 total={round(self.waited * 1e6)}\n")

    def run(self, seconds: float, *, own: int = 0, others: int = 0, waited: float = 0.0,
            dirtied: int = 0, written_back: int = 0) -> None:
        """``seconds`` pass: the run moves ``own`` bytes on vda (its cgroup's, and its
        children's once finished; a device-mapper volume on vda counts them again), other
        processes ``others``, earlier dirty pages ``written_back``; the run dirties
        ``dirtied`` bytes that stay in memory; its tasks wait ``waited`` of the time."""
        self.now += seconds
        self.moved["vda"] += own + others + written_back
        self.moved["dm-0"] += own + others
        self.moved["loop0"] += others
        self.cgroup_bytes["254:0"] += own
        self.cgroup_bytes["253:0"] += own
        self.children[0] += own // 2
        self.children[1] += own - own // 2 + dirtied
        self.dirty += dirtied - min(written_back, self.dirty)
        self.waited += waited * seconds
        self.write()

    def watch(self, age: float = 1000.0) -> NoiseWatch:
        """A watch that has been watching for ``age`` seconds."""
        watch = NoiseWatch([0, 1], clock=lambda: self.now)
        self.now += age
        return watch


# ---------------------------------------------------------------- the rule and its phrase

LOADED = DiskIO("vda", 403 * MB, 1477 * MB, 0.79, 0.0, 0.74)  # fileio beside the io hog


def test_judge_flags_a_run_that_waited_for_io_while_others_moved_most_bytes() -> None:
    assert judge(None, None, "0-1", io=LOADED) == (
        True, "others moved 1.5 GB on vda while its tasks waited for I/O 74% of the time")
    assert judge(0.3, None, "0-1", io=LOADED) == (True, "others took 30% of cores 0-1")


@pytest.mark.parametrize("io", [
    DiskIO("vda", 403 * MB, 1 * MB, 0.002, 0.0, 0.60),  # fileio, quiet: its own waiting
    DiskIO("vda", 1.6 * MB, 1.6 * MB, 0.50, 0.0, 0.35),  # small fsyncs, quiet: metadata
    DiskIO("vda", 403 * MB, 604 * MB, IO_OTHERS_SHARE, 0.0, 0.74),  # at the share
    DiskIO("vda", 403 * MB, 1477 * MB, 0.79, 0.0, CONTENDED_SHARE),  # it hardly waited
    DiskIO("vda", 403 * MB, 1477 * MB, 0.79, 0.0, None),  # no cgroup or no PSI
    DiskIO("", None, None, None, None, 0.74),  # no disk readable
    DiskIO("vda", 0.0, 2190 * MB, 1.0, 0.0, 0.30),  # no I/O of its own
    DiskIO("vda", 1.6 * MB, 5 * MB, 0.76, 0.0, 0.30),  # small fsyncs beside a few MB
])
def test_judge_leaves_runs_that_waited_on_their_own_or_show_nothing(io: DiskIO) -> None:
    assert judge(None, None, "0-1", io=io) == (False, None)


def test_bytes_are_written_as_people_read_them() -> None:
    assert [bytes_text(n) for n in (1.44e9, 802e6, 12_345, 512)] == [
        "1.4 GB", "802 MB", "12 kB", "512 B"]


# ---------------------------------------------------------------- the bytes


def test_only_whole_physical_disks_count_each_once(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    """Partitions, loop, zram, ram, device-mapper and md devices pass I/O on to a disk
    (counted twice) or are not disks: only vda and sda count; discards are no data."""
    m = FakeDisks(tmp_path, monkeypatch)
    assert physical_disks() == {"sda": "8:0", "vda": "254:0"}
    m.moved.update(vda=3 * MB, sda=1 * MB, loop0=50 * MB, zram0=50 * MB)
    m.write()
    assert diskio._disk_bytes(physical_disks()) == {"vda": 3 * MB - 3 * MB % SECTOR,
                                                   "sda": 1 * MB - 1 * MB % SECTOR}
    assert physical_disks(tmp_path / "nowhere") == {}


def test_a_run_beside_another_writer_is_flagged_and_a_quiet_one_is_not(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Measured here (fileio: 192 MiB written with fsyncs, read back O_DIRECT): alone it
    moved 403 MB, the disk 403 MB, and it waited for I/O ~60 % of the time (its own I/O);
    beside a writer the disk moved 1.9 GB and it waited 74 %. Its own bytes come from its
    cgroup's io.stat (on the physical disks only: the device-mapper line is the same bytes
    again), else from its finished children."""
    for io_stat in (True, False):
        m = FakeDisks(tmp_path / str(io_stat), monkeypatch, io_stat=io_stat)
        watch = m.watch()
        before = watch.start(m.cgroup)
        m.run(0.6, own=403 * MB, others=1 * MB, waited=0.60)
        quiet = watch.stop(before)
        assert quiet.io is not None and not quiet.disturbed
        assert quiet.io.own_bytes == pytest.approx(403 * MB, abs=SECTOR)
        assert quiet.io.others_share == pytest.approx(1 / 404, abs=1e-4)
        assert quiet.io.waited == pytest.approx(0.60) and quiet.io.disks == "vda"
        before = watch.start(m.cgroup)
        m.run(0.6, own=403 * MB, others=1477 * MB, waited=0.74)
        loaded = watch.stop(before)
        assert loaded.disturbed and loaded.evidence == (
            "others moved 1.5 GB on vda while its tasks waited for I/O 74% of the time")
        row = loaded.as_dict()
        assert row["io_disks"] == "vda" and row["io_wait"] == pytest.approx(0.74)
        assert row["io_bytes"] == pytest.approx(1880 * MB, abs=SECTOR)
        assert row["io_others_bytes"] == pytest.approx(1477 * MB, abs=SECTOR)
        assert row["io_others_share"] == pytest.approx(1477 / 1880, abs=1e-4)
        assert row["io_own_bytes"] == pytest.approx(403 * MB, abs=SECTOR)
        assert row["io_carried_bytes"] == 0.0


def test_a_run_with_no_io_of_its_own_is_never_flagged_by_others_io(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    m = FakeDisks(tmp_path, monkeypatch)
    watch = m.watch()
    before = watch.start(m.cgroup)
    m.run(1.0, others=2190 * MB, waited=0.3)
    sample = watch.stop(before)
    assert sample.io is not None and sample.io.others_share == 1.0
    assert sample.io.own_bytes == 0.0 and not sample.disturbed


def test_tunelabs_own_io_is_not_others(monkeypatch: pytest.MonkeyPatch,
                                       tmp_path: Path) -> None:
    """The controller writes the run's output and the store while the run runs: its own
    bytes (RUSAGE_SELF) are no one else's."""
    m = FakeDisks(tmp_path, monkeypatch)
    watch = m.watch()
    before = watch.start(m.cgroup)
    m.run(1.0, own=10 * MB, others=40 * MB, waited=0.5)
    m.ours[1] += 40 * MB  # the "others" were tunelab
    sample = watch.stop(before)
    assert sample.io is not None and sample.io.others_bytes == 0.0 and not sample.disturbed
    assert sample.io.own_bytes == pytest.approx(10 * MB)


def test_writeback_of_the_previous_runs_pages_is_not_others(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A run writes 300 MB without fsync and ends; the next one waits for its own I/O
    while the kernel writes the previous run's pages back: they were the study's writes
    (its children's) and dirty as it started, so not others'. The same bytes dirtied by
    another process are others'; the study's own writes count only within twice the
    kernel's writeback delay (dirty_expire + dirty_writeback: 35 s here)."""
    m = FakeDisks(tmp_path, monkeypatch)
    watch = m.watch()
    before = watch.start(m.cgroup)
    m.run(1.0, dirtied=300 * MB)
    assert not watch.stop(before).disturbed
    before = watch.start(m.cgroup)
    m.run(1.0, own=50 * MB, dirtied=300 * MB, written_back=300 * MB, waited=0.3)
    second = watch.stop(before)
    assert second.io is not None and second.io.carried_bytes == pytest.approx(300 * MB)
    assert second.io.others_bytes == 0.0 and not second.disturbed
    assert second.io.moved_bytes == pytest.approx(350 * MB, abs=SECTOR)
    m.moved["vda"] += 500 * MB  # between runs the kernel writes back all but 100 MB
    m.dirty = 100 * MB
    m.write()
    before = watch.start(m.cgroup)  # carried: what is still dirty, not all it wrote
    m.run(1.0, own=50 * MB, others=300 * MB, written_back=100 * MB, waited=0.3)
    third = watch.stop(before)
    assert third.io == DiskIO("vda", 50 * MB, pytest.approx(300 * MB, abs=2048),
                              pytest.approx(300 / 450, abs=1e-5),
                              pytest.approx(100 * MB, abs=2048), 0.3,
                              pytest.approx(450 * MB, abs=SECTOR))
    assert third.disturbed
    # another process's 300 MB, dirty as the run starts, written back during it
    m.dirty += 300 * MB
    m.now += 100  # the study's own writes are long written
    m.write()
    before = watch.start(m.cgroup)
    m.run(1.0, own=50 * MB, written_back=300 * MB, waited=0.3)
    fourth = watch.stop(before)
    assert fourth.io is not None and fourth.io.carried_bytes == 0.0
    assert fourth.disturbed and fourth.evidence == (
        "others moved 300 MB on vda while its tasks waited for I/O 30% of the time")


def test_a_young_watch_carries_all_that_was_dirty(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    """A study that just started cannot know what an earlier tunelab left dirty: all of
    Dirty + Writeback as the run starts is carried over."""
    m = FakeDisks(tmp_path, monkeypatch)
    m.dirty, m.writeback = 200 * MB, 100 * MB
    m.write()
    watch = m.watch(age=1.0)
    before = watch.start(m.cgroup)
    m.run(1.0, own=50 * MB, written_back=300 * MB, waited=0.3)
    sample = watch.stop(before)
    assert sample.io is not None
    assert sample.io.carried_bytes == pytest.approx(300 * MB, abs=2048)
    assert not sample.disturbed


def test_missing_counters_give_no_figure_and_no_flag(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    """No cgroup, no PSI, no disk, no /proc/meminfo, garbage in any of them: the figure is
    None, the run is not flagged, nothing raises."""
    m = FakeDisks(tmp_path, monkeypatch)
    watch = m.watch()
    before = watch.start(None)  # no cgroup: the run's waiting is unknown
    m.run(1.0, own=50 * MB, others=500 * MB, waited=0.5)
    sample = watch.stop(before)
    assert sample.io is not None and sample.io.waited is None and not sample.disturbed
    assert sample.io.others_share == pytest.approx(500 / 550)
    breakages = [
        lambda: (m.cgroup / "io.pressure").unlink(),  # no PSI
        lambda: (m.cgroup / "io.pressure").write_text("some avg10=x total=abc\n"),
        lambda: (m.root / "proc" / "meminfo").unlink(),
        lambda: (m.root / "proc" / "meminfo").write_text("Dirty: many kB\n"),
        lambda: [p.unlink() for p in (m.root / "sys" / "block").iterdir()],
        lambda: (m.root / "sys/devices/pci0000:00/virtio1/block/vda/stat").write_text("1 2\n"),
    ]
    for i, breakage in enumerate(breakages):
        m = FakeDisks(tmp_path / str(i), monkeypatch)
        watch = m.watch()
        breakage()
        before = watch.start(m.cgroup)
        m.run(1.0, own=50 * MB, others=500 * MB, waited=0.5)
        breakage()
        sample = watch.stop(before)
        assert not (sample.disturbed and sample.evidence and "moved" in sample.evidence), i
        assert sample.io is not None
    m = FakeDisks(tmp_path / "io.stat", monkeypatch)  # an unreadable io.stat: the children's
    watch = m.watch()
    before = watch.start(m.cgroup)
    m.run(1.0, own=50 * MB, others=500 * MB, waited=0.5)
    (m.cgroup / "io.stat").write_text("254:0 rbytes=lots\n")
    sample = watch.stop(before)
    assert sample.io is not None and sample.io.own_bytes == 50 * MB and sample.disturbed


# ---------------------------------------------------------------- --wait-quiet


def test_wait_quiet_waits_for_quiet_disks_only_when_asked(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    """Another process writes 100 MB/s for 5 s, then the disk is quiet: waiting for quiet
    disks takes those 5 s (and a last quiet second); waiting for quiet cores alone does not
    wait for them, and a writer that never stops is waited on up to ``max_wait_s``."""
    m = FakeDisks(tmp_path, monkeypatch)
    writer_left = [5.0]

    def sleep(seconds: float) -> None:
        busy = min(seconds, writer_left[0])
        writer_left[0] -= busy
        m.run(seconds, others=round(busy * 100 * MB))

    watch = NoiseWatch([0, 1], clock=lambda: m.now, sleep=sleep)
    m.now += 1000.0  # an old watch: no earlier writes carried
    assert watch.wait_quiet(disks=False) == pytest.approx(1.0)
    assert watch.wait_quiet(disks=True) == pytest.approx(5.0)  # 4 busy windows, 1 quiet
    writer_left[0] = math.inf
    assert watch.wait_quiet(disks=True, max_wait_s=30) == pytest.approx(30.0)


def test_wait_quiet_turns_to_the_disks_once_a_run_waited_for_its_own_io(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A study's runs that compute only never wait for disks (a CPU study is not held up by
    a backup on the machine); after a run that waited for its own I/O, every later run of the
    study waits for quiet disks as well as quiet cores."""
    from tunelab.execute.launchers.base import Outcome, RunRequest
    from tunelab.execute.launchers.watch import RunWatch

    m = FakeDisks(tmp_path, monkeypatch)
    asked: list[bool] = []
    watch = NoiseWatch([0, 1], clock=lambda: m.now, sleep=lambda s: m.run(s))
    m.now += 1000.0
    monkeypatch.setattr(watch, "wait_quiet", lambda **kw: asked.append(kw["disks"]) or 0.0)
    monkeypatch.setattr("tunelab.execute.hygiene.current_cgroup", lambda: m.cgroup)
    runs = RunWatch("wall_s", noise=watch, wait_quiet=True)
    request = RunRequest("{}", 0, tmp_path, ("true",), {}, tmp_path, 10.0)
    for own, waited in ((0, 0.0), (50 * MB, CONTENDED_SHARE), (50 * MB, 0.4), (0, 0.0)):
        watched = runs.start(request)
        m.run(1.0, own=own, waited=waited)
        watched.finish(Outcome("ok", 0, 1.0))
    runs.start(request)
    assert asked == [False, False, False, True, True]


# ---------------------------------------------------------------- the store


def test_the_io_columns_are_stored_and_old_stores_read_without_them(tmp_path: Path) -> None:
    """A version-3 store written before the I/O columns reads NaN (or empty) there when
    opened read-only, untouched; opened for writing it gains them."""
    io_columns = [c for c in NOISE_COLUMNS if c.startswith("io_")]
    with open_store(tmp_path, create=True) as store:
        store.record_run(_record({"x": 1}, 0, 1.0, disturbed=False))
    conn = sqlite3.connect(tmp_path / "tunelab.db")
    for column in io_columns:
        conn.execute(f"ALTER TABLE noise DROP COLUMN {column}")
    conn.commit()
    conn.close()
    with open_store(tmp_path) as store:
        frame = store.runs_frame()
    assert frame.loc[0, "noise.io_disks"] == "" and math.isnan(frame.loc[0, "noise.io_wait"])
    conn = sqlite3.connect(tmp_path / "tunelab.db")
    have = {row[1] for row in conn.execute("PRAGMA table_info(noise)")}
    conn.close()
    assert not have & set(io_columns)  # read-only: untouched
    record = _record({"x": 1}, 1, 1.1, disturbed=True)
    record.noise.update(io_disks="vda", io_own_bytes=403e6, io_others_bytes=1.477e9,  # type: ignore[union-attr]
                        io_others_share=0.79, io_carried_bytes=0.0, io_wait=0.74)
    with open_store(tmp_path, write=True) as store:
        store.record_run(record)
        frame = store.runs_frame()
    assert frame.loc[1, "noise.io_disks"] == "vda"
    assert frame.loc[1, "noise.io_others_bytes"] == 1.477e9
    assert math.isnan(frame.loc[0, "noise.io_others_share"])


# ---------------------------------------------------------------- this machine


@pytest.mark.slow
def test_a_real_runs_own_direct_writes_are_its_own() -> None:
    """A child writes 8 MiB with O_DIRECT to a file on a physical disk of this machine: the
    watch counts them as the run's own bytes, and the disk moved at least as much."""
    folder = Path(tempfile.gettempdir())
    watch = NoiseWatch()
    dev = folder.stat().st_dev
    device = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve()
    if not {device.name, device.parent.name} & set(watch._disks.disks):
        pytest.skip("the temporary folder is on no physical disk")
    path = folder / f"tunelab-diskio-{os.getpid()}"
    try:
        before = watch.start()
        subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", "count=8",
                        "oflag=direct"], check=True, capture_output=True)
        sample = watch.stop(before)
    finally:
        path.unlink(missing_ok=True)
    assert sample.io is not None and sample.io.own_bytes is not None
    assert sample.io.own_bytes >= 8 * 2**20 and sample.io.disks
