"""Noise watch: did other processes take the cores a run ran on, while it ran?

The evidence is absolute, taken on the run's own cores and over the run's own wall time —
never relative to how busy the machine was when the study started (a machine busy from the
start would then look normal):

* **the run's cores**: the CPUs it may use (``sched_getaffinity``, which a cpuset narrows),
  written as a list (``cpu_list``, e.g. ``0-1``) and counted (``cpus``);
* **busy time on those cores**, per CPU from ``/proc/stat`` (user, nice, system, irq,
  softirq; steal apart), before and after the run;
* **the run's own CPU time**: its cgroup's ``cpu.stat`` (``usage_usec``; the study's
  cgroup, which holds only the run in flight, see :mod:`tunelab.execute.hygiene`), else the
  ``getrusage`` of the finished children; tunelab's own CPU time is subtracted too;
* **a CPU quota's hold** (``throttled``): the time a CPU quota (cgroup v2 ``cpu.max``,
  version 1 ``cpu.cfs_quota_us``) of the run's cgroup or a parent held its tasks back, from
  their ``cpu.stat``, as a share of the run's wall time × its cores: a quota slows a run
  without any other process on its cores;
* **stopped processes** (``stopped``): the share of readings, every 50 ms while the run
  ran, in which a process of its cgroup was stopped by a signal or a tracer
  (:mod:`tunelab.procstate`; ``SIGSTOP`` from ``cpulimit``, a job suspended to share a
  node): a stopped run takes no CPU and waits for none, so nothing else shows it;
* **CPU pressure** (PSI): the share of the run's wall time in which its tasks waited for a
  CPU (``some`` of the cgroup's ``cpu.pressure``, else the machine's ``/proc/pressure/cpu``),
  recorded as ``psi_some`` beside the rest;
* **the cores that share its last-level cache** (``llc_cpu_list``: the run's cores and every
  core sharing a last-level cache with one of them, from sysfs ``cache/index*``), recorded
  only when they are more than the run's own: a run pinned to some cores shares the cache,
  and the memory bandwidth behind it, with the others;
* **disk I/O** (:mod:`tunelab.diskio`): the bytes the physical disks moved, the run's own,
  others' (``io_others_bytes``, ``io_others_share``: what the disks moved beyond the run's,
  tunelab's and the writeback of earlier writes), and the share of its wall time its own
  tasks waited for I/O (``io_wait``, its cgroup's ``io.pressure``).

``others_share`` = (busy − own − tunelab) / (wall × cpus): the share of the run's cores that
other processes took; ``own_share`` = own / (wall × cpus); ``llc_others_share`` = the busy
time of the cores sharing its last-level cache beside its own / (wall × all of those cores).
A run is **disturbed** when others took more than :data:`DISTURB_SHARE` of its cores, or of
the cores sharing its last-level cache (a memory-bound run pinned to one core of two, beside
one process streaming memory on the other, ran 1.7 to 2 times slower with its own core to
itself), or a CPU quota held it back more than :data:`THROTTLED_SHARE`, or its processes
were stopped more than :data:`STOPPED_SHARE` of its time, or the hypervisor stole more than
:data:`STEAL_SHARE`, or others took more than :data:`CONTENDED_SHARE` of its cores while
its own tasks waited for a CPU more than that share of its time (:func:`judge`);
``evidence`` says why in one phrase ("others took 64 % of cores 0-1"). PSI alone is not
the rule: a run with more ranks than cores waits for a CPU with no one else on the machine;
and only the run's own cgroup's says that the run waited. But on
a run's one CPU, others run only while the run leaves it idle, never beside it: there the
run's own waiting is the whole cost, and others' share counts only with it. A run whose
own tasks waited for I/O more than :data:`CONTENDED_SHARE` of its time while others moved
more than :data:`IO_OTHERS_SHARE` of the bytes on the disks, and at least
:data:`IO_OTHERS_MIN_BYTES`, is disturbed too ("others moved 1.4 GB on vda while its tasks
waited for I/O 74% of the time").

Everything is read from Linux's ``/proc`` and ``/sys`` (:mod:`tunelab.cpustat`,
:mod:`tunelab.diskio`); where they are missing each figure is None and no run is flagged.
Another process on a run's GPU is the GPU side of the same judgement
(:mod:`tunelab.execute.gpuwatch`, added by the run's watch).
"""

from __future__ import annotations

import dataclasses
import math
import resource
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tunelab import cpustat
from tunelab.diskio import DiskIO, DiskSnapshot, DiskWatch, bytes_text
from tunelab.procstate import StopSampler

__all__ = [
    "CONTENDED_SHARE",
    "DISTURB_SHARE",
    "IO_OTHERS_MIN_BYTES",
    "IO_OTHERS_SHARE",
    "IO_QUIET_RATE",
    "MAX_QUIET_WAIT_S",
    "QUIET_SHARE",
    "STEAL_SHARE",
    "STOPPED_SHARE",
    "THROTTLED_SHARE",
    "NoiseSample",
    "NoiseWatch",
    "judge",
]

DISTURB_SHARE = 0.20
"""A run is disturbed when other processes took more than this share of its cores (of its
wall time × its cores): e.g. one busy process on one of two cores the run may use."""

CONTENDED_SHARE = 0.10
"""… or when others took more than this share of its cores while its own tasks waited for a
CPU more than this share of its wall time (its cgroup's CPU pressure): a run that wants its
cores loses about what others take of them (a process busy 15 % of the time on the one core
of a run slowed it 18 %), and its waiting shows that it wanted them."""

STEAL_SHARE = 0.10
"""… or when the hypervisor stole more than this share of its cores."""

THROTTLED_SHARE = 0.10
"""… or when a CPU quota of its cgroup or a parent held it back more than this share of its
cores (of its wall time × its cores): a run in a cgroup allowed 30 % of a CPU ran 3.3 times
slower, held back 23 % of its two cores, with no other process on them; without a quota the
counter never moves."""

STOPPED_SHARE = 0.10
"""… or when some process of the run was stopped (``SIGSTOP``, a tracer) in more than this
share of the readings taken while it ran (:mod:`tunelab.procstate`)."""

IO_OTHERS_SHARE = 0.50
"""… or when other processes moved more than this share of the bytes on the physical disks
(more than the run itself) while the run's own tasks waited for I/O more than
:data:`CONTENDED_SHARE` of its wall time (a run with no I/O of its own never). Measured
here (docs/statistics.md): a quiet run of small fsyncs 0.30-0.38 (the file system's
metadata writes for them are not the run's own in its ``getrusage``), runs beside another
writer 0.60-1.00."""

IO_OTHERS_MIN_BYTES = 8 * 2**20
"""… and only when those others' bytes are at least this many: a run of small fsyncs (1.6 MB
of its own, 0.07-0.17 s) was flagged beside 2-5 MB of others' (a quiet machine's background
writes) and was not slower; runs beside another writer saw 600 MB-2 GB of others'."""

QUIET_SHARE = 0.05
"""``--wait-quiet`` waits until others take at most this share of the study's cores."""

IO_QUIET_RATE = 1e6
"""… and, once a run of the study waited for its own I/O, until others move at most this many
bytes a second on the physical disks (a quiet machine's background writes here: 0-20 kB/s;
another writer or reader: 100 MB/s and more)."""

MAX_QUIET_WAIT_S = 600.0
"""``--wait-quiet`` gives up waiting after this long and runs anyway (the run is flagged if
others still take its cores)."""

def _taken(others_share: float | None, cpu_list: str, llc_others_share: float | None,
           llc_cpu_list: str) -> tuple[float, str] | None:
    """The share others took beyond :data:`DISTURB_SHARE`, and of which cores: the run's own
    first, then those sharing its last-level cache; None when neither."""
    where = f"cores {cpu_list}" if cpu_list else "its cores"
    if others_share is not None and others_share > DISTURB_SHARE:
        return others_share, where
    if llc_others_share is not None and llc_others_share > DISTURB_SHARE:
        return llc_others_share, (f"cores {llc_cpu_list}, which share the last-level cache "
                                  f"of {where}")
    return None


def _io_evidence(io: DiskIO | None) -> str | None:
    """Why the run's disk I/O was disturbed (see :func:`judge`), or None."""
    if (io is None or io.waited is None or io.waited <= CONTENDED_SHARE
            or not io.own_bytes or io.others_share is None
            or io.others_share <= IO_OTHERS_SHARE or io.others_bytes is None
            or io.others_bytes < IO_OTHERS_MIN_BYTES):
        return None
    return (f"others moved {bytes_text(io.others_bytes)} on {io.disks or 'its disks'} "
            f"while its tasks waited for I/O {io.waited:.0%} of the time")


def judge(others_share: float | None, steal_share: float | None,
          cpu_list: str, *, llc_others_share: float | None = None,
          llc_cpu_list: str = "", waited: float | None = None,
          io: DiskIO | None = None, throttled: float | None = None,
          stopped: float | None = None) -> tuple[bool, str | None]:
    """Whether a run is disturbed, and the phrase why (None when not): others took more than
    :data:`DISTURB_SHARE` of its cores (``others_share``) or of the cores sharing its
    last-level cache (``llc_others_share``: what they took beside its own cores, of all of
    ``llc_cpu_list``); or more than :data:`CONTENDED_SHARE` of its cores while its own
    tasks waited for a CPU more than that share of its time (``waited``: its own cgroup's
    CPU pressure, None where only the machine's is known); or the hypervisor stole more than
    :data:`STEAL_SHARE`; or others moved more than :data:`IO_OTHERS_SHARE` of the bytes on
    the disks (and at least :data:`IO_OTHERS_MIN_BYTES`) while the run, which moved some
    of its own, waited for I/O more than :data:`CONTENDED_SHARE` of its time (``io``; its
    waiting from its own cgroup, else None); or a CPU quota held it back more than
    :data:`THROTTLED_SHARE` of its cores (``throttled``), or some process of it was stopped
    in more than :data:`STOPPED_SHARE` of the readings (``stopped``) — these two named
    first, since others may fill the cores the run then leaves idle. A run on one CPU that
    waited at most :data:`CONTENDED_SHARE` of its time is not disturbed by what others took
    of that CPU: they ran only while it left the CPU idle, never beside it."""
    where = f"cores {cpu_list}" if cpu_list else "its cores"
    if throttled is not None and throttled > THROTTLED_SHARE:
        return True, f"a CPU quota held it back {throttled:.0%} of {where}"
    if stopped is not None and stopped > STOPPED_SHARE:
        return True, (f"its processes were stopped (by a signal or a tracer) {stopped:.0%} "
                      "of the time")
    own_cores = others_share
    if (waited is not None and waited <= CONTENDED_SHARE
            and len(cpustat.parse_cpu_list(cpu_list)) == 1):
        own_cores = None  # on its one CPU others ran only while the run left it idle
    taken = _taken(own_cores, cpu_list, llc_others_share, llc_cpu_list)
    if taken is not None:
        return True, f"others took {taken[0]:.0%} of {taken[1]}"
    if (others_share is not None and others_share > CONTENDED_SHARE
            and waited is not None and waited > CONTENDED_SHARE):
        return True, (f"others took {others_share:.0%} of {where} while its tasks waited for "
                      f"a CPU {waited:.0%} of the time")
    io_evidence = _io_evidence(io)
    if io_evidence is not None:
        return True, io_evidence
    if steal_share is not None and steal_share > STEAL_SHARE:
        return True, f"the hypervisor stole {steal_share:.0%} of {where}"
    return False, None


def _share(seconds: float, span: float) -> float:
    """``seconds`` as a share of ``span`` seconds, within [0, 1]."""
    return min(max(seconds / span, 0.0), 1.0)


@dataclass(frozen=True)
class Snapshot:
    """The counters just before a run (or a window): wall clock, busy and steal seconds of
    the cores, the run's cgroup (and its CPU seconds), the finished children's and
    tunelab's own CPU seconds, pressure, load and frequency; busy and steal seconds of the
    cores sharing the run's last-level cache."""

    wall: float
    cpus: tuple[int, ...]
    cpu: tuple[float, float] | None
    cgroup: Path | None
    cgroup_cpu: float | None
    children: float
    self_cpu: float
    pressure: float | None
    load: float | None
    mhz: float | None
    llc_cpu: tuple[float, float] | None = None
    """Busy and steal seconds of the cores sharing the run's last-level cache (None when
    they are the run's own)."""
    disk: DiskSnapshot | None = None
    """The disk counters (:mod:`tunelab.diskio`)."""
    throttled: tuple[float, ...] | None = None
    """Seconds a CPU quota held back each cgroup that limits the run
    (:func:`tunelab.cpustat.throttled`)."""
    stops: StopSampler | None = None
    """Reads whether the run's processes are stopped, from this snapshot on (a run's only,
    with its cgroup)."""


@dataclass(frozen=True)
class NoiseSample:
    """What others did on the run's cores while it ran (None: not readable here)."""

    cpus: float
    cpu_list: str
    others_share: float | None
    own_share: float | None
    steal: float | None
    psi_some: float | None
    load_before: float | None
    load_after: float | None
    mhz_before: float | None
    mhz_after: float | None
    disturbed: bool
    evidence: str | None
    llc_cpu_list: str = ""
    """The run's cores and those sharing its last-level cache ("" when none but its own)."""
    llc_others_share: float | None = None
    """Share of the cores of ``llc_cpu_list`` that others took beside the run's own (None
    without them)."""
    io: DiskIO | None = None
    """Disk I/O over the run (None: not read)."""
    throttled: float | None = None
    """Share of the run's cores a CPU quota held it back (None: no quota counter here)."""
    stopped: float | None = None
    """Share of the readings in which a process of the run was stopped (None: not read)."""

    @property
    def waited_for_io(self) -> bool:
        """Whether the run waited for its own I/O (bytes of its own, and some task of its
        cgroup waiting more than :data:`CONTENDED_SHARE` of its time): the kind of run
        others' disk I/O can slow."""
        io = self.io
        return (io is not None and bool(io.own_bytes) and io.waited is not None
                and io.waited > CONTENDED_SHARE)

    def as_dict(self) -> dict[str, float | str | None]:
        """Column name -> value, as the store's ``noise`` table keeps them (``disturbed``
        as 0/1; ``others_cpu``, the schema-2 column, holds ``others_share``)."""
        io = self.io
        return {"cpus": self.cpus, "cpu_list": self.cpu_list,
                "others_share": self.others_share, "others_cpu": self.others_share,
                "own_share": self.own_share, "steal": self.steal, "psi_some": self.psi_some,
                "load_before": self.load_before, "load_after": self.load_after,
                "mhz_before": self.mhz_before, "mhz_after": self.mhz_after,
                "llc_cpu_list": self.llc_cpu_list, "llc_others_share": self.llc_others_share,
                "io_disks": io.disks if io else "", "io_bytes": io.moved_bytes if io else None,
                "io_own_bytes": io.own_bytes if io else None,
                "io_others_bytes": io.others_bytes if io else None,
                "io_others_share": io.others_share if io else None,
                "io_carried_bytes": io.carried_bytes if io else None,
                "io_wait": io.waited if io else None, "throttled": self.throttled,
                "stopped": self.stopped,
                "evidence": self.evidence, "disturbed": 1.0 if self.disturbed else 0.0}


class NoiseWatch:
    """Samples the cores of runs (see the module docstring). ``cpus`` defaults to the CPUs
    this process may use, which its runs inherit; ``clock`` and ``sleep`` are injectable
    for tests."""

    def __init__(self, cpus: Iterable[int] | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.cpus = tuple(sorted(cpus)) if cpus is not None else cpustat.own_cpus()
        self.cpu_list = cpustat.cpu_list_text(self.cpus)
        domain = cpustat.llc_cpus(self.cpus)
        self.llc_cpus = domain if len(domain) > len(self.cpus) else ()
        self.llc_cpu_list = cpustat.cpu_list_text(self.llc_cpus)
        self._clock, self._sleep = clock, sleep
        self._disks = DiskWatch(clock)

    def start(self, cgroup: Path | None = None) -> Snapshot:
        """Sample just before a run whose processes live in ``cgroup`` (None: no cgroup,
        the finished children's CPU time counts as the run's; with one, whether they are
        stopped is read until :meth:`stop`)."""
        before = self._read(cgroup)
        if before.cgroup is None:
            return before
        return dataclasses.replace(before, stops=StopSampler(before.cgroup))

    def _read(self, cgroup: Path | None) -> Snapshot:
        """The counters now, for a run in ``cgroup``."""
        usage = cpustat.cgroup_usage(cgroup)
        if usage is None:
            cgroup = None
        pressure = cpustat.pressure(cgroup / "cpu.pressure" if cgroup is not None
                                    else cpustat.PROC / "pressure" / "cpu")
        quotas = cpustat.quota_cgroups(cgroup)
        return Snapshot(self._clock(), self.cpus, cpustat.cpu_seconds(self.cpus), cgroup,
                        usage, cpustat.rusage(resource.RUSAGE_CHILDREN),
                        cpustat.rusage(resource.RUSAGE_SELF), pressure, cpustat.load(),
                        cpustat.mhz(),
                        cpustat.cpu_seconds(self.llc_cpus) if self.llc_cpus else None,
                        self._disks.snapshot(cgroup), cpustat.throttled(quotas))

    def stop(self, before: Snapshot) -> NoiseSample:
        """Sample just after the run started at ``before``; judge it."""
        stopped = before.stops.end() if before.stops is not None else None
        after = self._read(before.cgroup)
        wall = after.wall - before.wall
        span = wall * len(self.cpus)
        others = own = steal = psi = llc = None
        if before.cgroup_cpu is not None and after.cgroup_cpu is not None:
            run = after.cgroup_cpu - before.cgroup_cpu
        else:
            run = after.children - before.children
        ours = after.self_cpu - before.self_cpu
        if span > 0 and before.cpu is not None and after.cpu is not None:
            busy = after.cpu[0] - before.cpu[0]
            others = _share(busy - run - ours, span)
            own = _share(run, span)
            steal = _share(after.cpu[1] - before.cpu[1], span)
        if (span > 0 and before.cpu is not None and after.cpu is not None
                and before.llc_cpu is not None and after.llc_cpu is not None):
            # busy beside the run's own cores, less what the run and tunelab used beyond
            # their own cores' busy time (a run that widened its affinity)
            busy_own = after.cpu[0] - before.cpu[0]
            beside = after.llc_cpu[0] - before.llc_cpu[0] - busy_own
            llc = _share(beside - max(run + ours - busy_own, 0.0), wall * len(self.llc_cpus))
        if wall > 0 and before.pressure is not None and after.pressure is not None:
            psi = _share(after.pressure - before.pressure, wall)
        io = (self._disks.over(before.disk, after.disk, wall)
              if before.disk is not None and after.disk is not None else None)
        held = None
        if (span > 0 and before.throttled is not None and after.throttled is not None
                and len(before.throttled) == len(after.throttled)):
            pairs = zip(after.throttled, before.throttled, strict=True)
            held = _share(max(a - b for a, b in pairs), span)
        disturbed, evidence = judge(others, steal, self.cpu_list, llc_others_share=llc,
                                    llc_cpu_list=self.llc_cpu_list,
                                    waited=psi if before.cgroup is not None else None, io=io,
                                    throttled=held, stopped=stopped)
        return NoiseSample(float(len(self.cpus)), self.cpu_list, others, own, steal, psi,
                           before.load, after.load, before.mhz, after.mhz, disturbed,
                           evidence, self.llc_cpu_list, llc, io, held, stopped)

    def _window(self, window_s: float) -> NoiseSample:
        """What others did over the next ``window_s`` while tunelab waits."""
        before = self._read(None)
        self._sleep(window_s)
        return self.stop(before)

    def others_now(self, window_s: float = 1.0) -> float | None:
        """Share of the watched cores other processes take over the next ``window_s`` (or
        of the cores sharing their last-level cache, when that share is larger)."""
        return _cpu_others(self._window(window_s))

    def busy_now(self, window_s: float = 1.0) -> str | None:
        """A warning when others take more than :data:`DISTURB_SHARE` of the cores (or of
        those sharing their last-level cache) now, or a CPU quota of this process's cgroups
        allows its runs fewer CPUs than the cores; None when neither, or nothing is
        readable."""
        sample = self._window(window_s)
        said = []
        taken = _taken(sample.others_share, self.cpu_list, sample.llc_others_share,
                       self.llc_cpu_list)
        if taken is not None:
            said.append(f"the machine is busy: other processes take {taken[0]:.0%} of "
                        f"{taken[1]} now; runs taken like this are flagged disturbed "
                        "(--wait-quiet waits for quiet cores)")
        limit = cpustat.quota(cpustat.quota_cgroups(None))
        if limit is not None and limit[0] < len(self.cpus):
            where = f"cores {self.cpu_list}" if self.cpu_list else "its cores"
            said.append(f"a CPU quota allows the runs {limit[0]:.2g} CPUs of {where} "
                        f"({limit[1]}); runs it holds back are flagged disturbed")
        return "; ".join(said) or None

    def wait_quiet(self, level: float = QUIET_SHARE, max_wait_s: float = MAX_QUIET_WAIT_S,
                   window_s: float = 1.0, *, disks: bool = False) -> float:
        """Wait until others take at most ``level`` of the cores and, with ``disks``, move
        at most :data:`IO_QUIET_RATE` bytes a second on the physical disks (or until
        ``max_wait_s`` passed); returns the seconds waited. A figure that cannot be read
        does not hold the wait."""
        started = self._clock()
        while self._clock() - started < max_wait_s:
            sample = self._window(window_s)
            share = _cpu_others(sample)
            cores_quiet = share is None or math.isnan(share) or share <= level
            io = sample.io
            disks_quiet = (not disks or io is None or io.others_bytes is None
                           or io.others_bytes <= IO_QUIET_RATE * window_s)
            if cores_quiet and disks_quiet:
                break
        return self._clock() - started


def _cpu_others(sample: NoiseSample) -> float | None:
    """The larger of the shares others took of the cores and of their cache's cores."""
    shares = [x for x in (sample.others_share, sample.llc_others_share) if x is not None]
    return max(shares) if shares else None
