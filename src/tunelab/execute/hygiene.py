"""Process hygiene: every process a run starts ends with the run, whatever happens.

A run's processes are found four ways, so that none escapes:

* **process group** — the run starts a new session; the group is signalled as a whole.
* **cgroup v2** — where the unified hierarchy is writable, each run's processes live in a
  cgroup of their own (``<own cgroup>/tunelab-<study>/<run>``), entered before ``exec``. A
  process that calls ``setsid()`` or double-forks stays in it; ``cgroup.kill`` ends them all.
  The cgroup outlives a controller killed with ``kill -9``, so the next start finds what it
  left. A batch job's step (one attempt of a run, outside any study) has a cgroup and a
  marker of that attempt's own (:func:`current`).
* **subreaper** — while a run is in flight the controller is a child subreaper
  (``PR_SET_CHILD_SUBREAPER``): an orphaned descendant of the run becomes the controller's
  child instead of init's, and is killed and reaped when the run ends. Used everywhere; it is
  all there is where cgroups are not writable.
* **environment marker** — every run's environment holds ``TUNELAB_RUN=<study>/<run>``,
  inherited by its descendants; ``/proc/*/environ`` finds those that escaped the rest after
  a controller was killed with ``kill -9``.

What a run leaves in shared memory goes with it too: each run gets a private directory in
``/dev/shm`` that its MPI and UCX backing files are pointed to, removed after the run and
swept with its processes (:mod:`tunelab.execute.shm`).

Rules the launcher relies on (:class:`RunProcesses`):

* while a run is in flight (:meth:`RunProcesses.in_flight`) the first SIGINT, SIGTERM or SIGHUP
  unwinds to the launcher, which ends the run; every later one is held from that moment;
* ending a run (:meth:`RunProcesses.end`) sends SIGTERM, waits a grace period, then SIGKILLs
  everything left; the three are held meanwhile, so a second Ctrl-C can never
  skip the kill step — it only cuts the grace short;
* after every run, finished or not, :meth:`RunProcesses.cleanup` kills what the run left
  behind (background processes, ``setsid()`` daemons) and waits until it is gone;
* the pid and start time of the run in flight are recorded (in the store, through the
  study's :class:`StudyProcesses`); when a study starts, :meth:`StudyProcesses.sweep` kills
  any run a killed controller left running before anything is run again — only processes
  in the study's cgroup or carrying its marker: a copied or crafted store cannot make it
  kill anything else; then its runs' shared-memory directories that no live process uses
  are removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from tunelab.errors import STOP_SIGNALS
from tunelab.execute import procs, shm

__all__ = ["RunProcesses", "StudyProcesses", "current", "current_cgroup", "study_processes"]

MARKER = "TUNELAB_RUN"
_INTERRUPTS = {signal.SIGINT, *STOP_SIGNALS}
_HELD: list[list[int]] = []  # signals held by the runs in flight (see _interrupts_raise_once)


# --- signals ----------------------------------------------------------------------------


@contextlib.contextmanager
def _interrupts_held() -> Iterator[Callable[[], bool]]:
    """Hold SIGINT, SIGTERM and SIGHUP back; yield a function that tells whether one arrived
    meanwhile. On exit the usual handlers are back and a held signal is raised again, so it
    is handled as usual — after the kill. A signal held by :func:`_interrupts_raise_once`
    after its first counts as arrived. (Python runs signal handlers in the main thread
    only, whichever thread the kernel delivered the signal to, so replacing the handlers is
    what holds them; away from the main thread no KeyboardInterrupt can arrive anyway.)"""
    arrived: list[int] = []

    def note(signum: int, frame: object) -> None:
        arrived.append(signum)

    try:
        old = {sig: signal.signal(sig, note) for sig in _INTERRUPTS}
    except ValueError:  # not the main thread
        yield lambda: False
        return
    try:
        yield lambda: bool(arrived) or any(len(held) > 1 for held in _HELD)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if arrived:
            signal.raise_signal(arrived[0])


@contextlib.contextmanager
def _interrupts_raise_once() -> Iterator[None]:
    """While a run is in flight: the first SIGINT, SIGTERM or SIGHUP is handled as usual (it raises
    ``KeyboardInterrupt``, or whatever the handler raises, so the caller ends the run);
    from that moment on, until the block is left, all are held — a second signal, however
    soon, cannot interrupt the kill step before it has begun (:meth:`RunProcesses.end`
    only sees it cut the grace short). A first signal whose disposition is the default
    (SIGTERM outside the command line) unwinds as ``KeyboardInterrupt`` and is delivered
    again, with its default action, once the block is left; so is a first signal whose
    exception something swallowed, when the block ends normally."""
    held: list[int] = []  # the first signal, then those held after it

    def note(signum: int, frame: object) -> None:
        held.append(signum)

    def first(signum: int, frame: FrameType | None) -> None:
        handler = old[signum]
        if held:  # re-entered before the handlers were swapped
            held.append(signum)
        if held or handler == signal.SIG_IGN:
            return
        held.append(signum)
        for sig in _INTERRUPTS:
            signal.signal(sig, note)
        if not callable(handler):
            raise KeyboardInterrupt  # the default action follows once the block is left
        handler(signum, frame)
        held.clear()  # the usual handler did not raise: go on as before
        for sig in _INTERRUPTS:
            signal.signal(sig, first)

    try:
        old: dict[int, Any] = {sig: signal.getsignal(sig) or signal.SIG_DFL
                               for sig in _INTERRUPTS}
        for sig in _INTERRUPTS:
            signal.signal(sig, first)
    except ValueError:  # not the main thread: signals are handled elsewhere
        yield
        return
    _HELD.append(held)
    swallowed = False
    try:
        yield
        # The block ended normally, yet the first signal raised: something swallowed its
        # exception (Python ignores exceptions in at-fork hooks, such as logging's, which
        # run when a run starts with a preexec_fn). It is delivered again below.
        swallowed = bool(held)
    finally:
        _HELD[:] = [h for h in _HELD if h is not held]
        for signum, handler in old.items():
            signal.signal(signum, handler)
        if held and old[held[0]] != signal.SIG_IGN and (swallowed or not callable(old[held[0]])):
            signal.raise_signal(held[0])


# --- a study's processes ------------------------------------------------------------------


class MetaStore(Protocol):
    """What hygiene needs of a store: meta values (the in-flight record)."""

    def get_meta(self, key: str) -> str | None: ...

    def set_meta(self, values: Mapping[str, str]) -> None: ...


INFLIGHT_KEY = "inflight"
"""Meta key of the run in flight: JSON ``{"pid", "start", "marker", "cgroup"}``, or empty."""


@dataclass
class StudyProcesses:
    """The process hygiene of one study controller (see the module docstring)."""

    study_dir: Path
    store: MetaStore | None = None
    #: set for a hygiene of one attempt (:func:`current` outside a study): its cgroup and
    #: marker are then the attempt's own
    attempt: str = ""
    token: str = field(init=False)
    cgroup: Path | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.token = hashlib.sha1(str(self.study_dir.resolve()).encode()).hexdigest()[:12]
        if self.attempt:
            self.token += f"-{self.attempt}"
        base = procs.cgroup_base()
        if base is not None:
            candidate = base / f"tunelab-{self.token}"
            with contextlib.suppress(OSError):
                candidate.mkdir(exist_ok=True)
                self.cgroup = candidate

    def sweep(self, on_note: Callable[[str], None] | None = None) -> int:
        """Kill every process a killed controller of this study left running (cgroups, the
        environment marker, the recorded in-flight run); wait until they are gone; remove
        the shared-memory directories of its runs that no live process uses. Returns how
        many processes were killed.

        Only processes that provably belong to this study are killed: those in its cgroup
        and those whose environment holds its marker (``TUNELAB_RUN=<token>/``, the token
        made from this study directory's path). The recorded in-flight run comes from the
        store, which may have been copied or crafted: the process it names is killed only
        when it carries the marker; otherwise ``on_note`` is told that it was left alone."""
        victims: dict[int, procs.Proc] = {}
        recorded = self._recorded()
        pid = recorded.get("pid")
        if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0:
            proc = procs.stat(pid)
            if proc is not None and proc.start == recorded.get("start"):
                if procs.environ_has(proc.pid, self._marker()):
                    procs.killpg(proc.pgid, signal.SIGKILL)
                    victims[proc.pid] = proc
                elif on_note is not None:
                    on_note(f"{self.study_dir}: the store records process {pid} as the run in "
                            f"flight, but it does not carry this study's marker "
                            f"({MARKER}={self.token}/...): nothing was killed")
        if self.cgroup is not None:
            for leaf in [p for p in self.cgroup.iterdir() if p.is_dir()]:
                victims.update((pid, procs.Proc(pid, 0, 0, 0)) for pid in procs.cgroup_pids(leaf))
                procs.cgroup_remove(leaf)
        for proc in procs.marked(self._marker()):
            procs.killpg(proc.pgid, signal.SIGKILL)
            procs.kill(proc.pid)
            victims[proc.pid] = proc
        procs.wait_gone(list(victims.values()))
        for directory in shm.leftovers(self.token):
            shm.remove(directory)
        if recorded:
            self.record(None)
        return len(victims)

    def _marker(self) -> bytes:
        """What the environment of every process of this study's runs holds, NUL first (the
        variable starts there: :func:`procs.environ_has` puts a NUL before the first)."""
        return f"\0{MARKER}={self.token}/".encode()

    def _recorded(self) -> dict[str, Any]:
        raw = self.store.get_meta(INFLIGHT_KEY) if self.store is not None else None
        try:
            record = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            return {}
        return record if isinstance(record, dict) else {}

    def record(self, record: dict[str, Any] | None) -> None:
        """Store the record of the run in flight, or clear it (None)."""
        if self.store is not None:
            self.store.set_meta({INFLIGHT_KEY: json.dumps(record) if record else ""})

    def run(self, name: str) -> RunProcesses:
        """The processes of the run called ``name`` (unique within the study)."""
        return RunProcesses(self, name)

    def close(self) -> None:
        """Remove the study's cgroup once it is empty."""
        if self.cgroup is not None:
            for leaf in [p for p in self.cgroup.iterdir() if p.is_dir()]:
                procs.cgroup_remove(leaf)
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()


_CURRENT: list[StudyProcesses] = []


@contextlib.contextmanager
def study_processes(study_dir: Path, store: MetaStore | None = None
                    ) -> Iterator[StudyProcesses]:
    """Make the hygiene of ``study_dir`` the current one while a study runs: the local
    launcher's runs join it (see :func:`current`); ``store`` keeps the in-flight record."""
    processes = StudyProcesses(Path(study_dir), store)
    _CURRENT.append(processes)
    try:
        yield processes
    finally:
        _CURRENT.remove(processes)
        processes.close()


def current_cgroup() -> Path | None:
    """The cgroup that holds the current study's runs, one at a time (None outside a study
    or where cgroups are not writable): its ``cpu.stat`` counts the run in flight."""
    return _CURRENT[-1].cgroup if _CURRENT else None


def current(run_dir: Path) -> RunProcesses:
    """The processes of the run whose directory is ``run_dir``: within the current study's
    hygiene when a study runs, else within a hygiene of this attempt's own (closed by
    cleanup). Outside a study — a batch job's step running one attempt of a run — the
    cgroup and the marker are the attempt's: an older attempt of the same run (a job cut
    off by a node failure, whose step is told to stop only later) must never find, kill or
    remove a newer attempt's processes or cgroup."""
    name = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:12]
    if _CURRENT:
        return _CURRENT[-1].run(name)
    return RunProcesses(StudyProcesses(run_dir, attempt=secrets.token_hex(4)), name,
                        owns_study=True)


# --- one run's processes ------------------------------------------------------------------


class RunProcesses:
    """Everything one run starts: how to start it (:meth:`environment`, :meth:`popen_options`),
    how to end it (:meth:`end`) and how to clean up after it (:meth:`cleanup`)."""

    def __init__(self, study: StudyProcesses, name: str, *, owns_study: bool = False) -> None:
        self.study = study
        self._owns_study = owns_study
        self._name = name
        self.env = {MARKER: f"{study.token}/{name}"}
        self.shm_dir: Path | None = None
        self._launchers: list[int] = []  # the MPI launchers :meth:`end` found running
        self._session_env: dict[str, str] = {}  # where they keep their session directories
        self.cgroup: Path | None = None
        self._cgroup_fd: int | None = None
        self._leader: procs.Proc | None = None
        self._children_before: set[int] = set()
        self.ended_while_stopped = False
        """Whether tunelab was stopped (SIGSTOP, Ctrl-Z) when the run's leader ended: the
        wall time it measured then counts the stop (see :meth:`in_flight`)."""
        if study.cgroup is not None:
            leaf = study.cgroup / name
            try:
                leaf.mkdir(exist_ok=True)
                self._cgroup_fd = os.open(leaf / "cgroup.procs", os.O_WRONLY)
                self.cgroup = leaf
            except OSError:
                self.cgroup = None

    def environment(self, env: Mapping[str, str], *, shared_memory: bool = True
                    ) -> dict[str, str]:
        """The run's environment: ``env`` with the marker and, with ``shared_memory``, the
        run's private shared-memory directory (made now, removed by :meth:`cleanup`) as the
        backing directory of the MPI and UCX variables the user did not set
        (:func:`tunelab.execute.shm.backing_env`). Without ``shared_memory`` (a run whose
        ranks span other nodes, where the directory does not exist: Open MPI would turn
        its shared-memory transport off) nothing is pointed anywhere."""
        extra: dict[str, str] = {}
        self._session_env = {k: env[k] for k in shm.SESSION_VARIABLES if k in env}
        if shared_memory:
            if self.shm_dir is None:
                self.shm_dir = shm.make(self.study.token, self._name)
            if self.shm_dir is not None:
                extra = shm.backing_env(self.shm_dir, env)
        return {**env, **extra, **self.env}

    def popen_options(self) -> dict[str, Any]:
        """Keyword arguments for :class:`subprocess.Popen`: a new session, and between
        ``fork`` and ``exec`` entering the run's cgroup (so no descendant starts outside it)
        and asking for SIGTERM when tunelab dies (a ``kill -9`` of tunelab takes the run's
        leader with it; what that leaves is swept when the study next runs)."""
        procs.subreaper(True)  # for this run only: what it orphans is adopted, killed and reaped
        fd = self._cgroup_fd
        arm = procs.die_with_parent(signal.SIGTERM)

        def prepare_child() -> None:  # in the child, between fork and exec
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.write(fd, b"0")
            arm()

        options: dict[str, Any] = {"start_new_session": True, "preexec_fn": prepare_child}
        self._children_before = {p.pid for p in procs.children()}
        return options

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        """The block that starts, waits for and ends the run: the first SIGINT, SIGTERM or SIGHUP
        in it unwinds (the caller then calls :meth:`end`), every later one is held until
        the block is left, so no second signal can skip the kill step. A SIGCONT in it (tunelab
        continued after SIGSTOP or Ctrl-Z; the run, in a session of its own, ran on) that finds
        the run's leader ended sets :attr:`ended_while_stopped`: the end was seen only now."""
        self.ended_while_stopped = False

        def continued(signum: int, frame: object) -> None:
            leader = self._leader
            if leader is not None and procs.exited(leader.pid):
                self.ended_while_stopped = True

        try:
            old = signal.signal(signal.SIGCONT, continued)
        except ValueError:  # not the main thread: no handler can run here
            old = None
        try:
            with _interrupts_raise_once():
                yield
        finally:
            if old is not None:
                signal.signal(signal.SIGCONT, old)

    def started(self, proc: subprocess.Popen[bytes]) -> None:
        """Record the run's leader (pid and start time) while it is in flight."""
        self._leader = procs.stat(proc.pid)
        if self._leader is not None:
            self.study.record({"pid": self._leader.pid, "start": self._leader.start,
                               "marker": self.env[MARKER],
                               "cgroup": str(self.cgroup) if self.cgroup else None})

    def end(self, proc: subprocess.Popen[bytes], grace_s: float) -> None:
        """SIGTERM the run's processes, give them ``grace_s`` seconds, SIGKILL the rest.
        Interrupts wait until this is done; one arriving meanwhile ends the grace."""
        with _interrupts_held() as interrupted:
            self._launchers = shm.launchers(p.pid for p in self._members(proc.pid))
            self._signal_all(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and not interrupted():
                if proc.poll() is not None and not self._members(proc.pid):
                    break
                time.sleep(0.02)
            self._signal_all(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=procs.GONE_WAIT_S)
            self.cleanup()

    def cleanup(self) -> None:
        """Kill whatever the run left running (background processes, ``setsid()``
        daemons, orphans adopted by this subreaper), wait until it is gone, remove its
        shared-memory directory, and clear the in-flight record."""
        with _interrupts_held():
            leftovers = self._leftovers()
            for proc in leftovers:
                procs.killpg(proc.pgid, signal.SIGKILL)
                procs.kill(proc.pid)
            if self.cgroup is not None:
                procs.cgroup_remove(self.cgroup)
            procs.wait_gone(leftovers)
            if self.shm_dir is not None:
                shm.remove(self.shm_dir)  # kept while anything still uses it: swept later
                self.shm_dir = None
            if self._launchers:  # killed MPI launchers' session directories
                shm.remove_sessions(self._launchers, self._session_env)
                self._launchers = []
            if self._cgroup_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._cgroup_fd)
                self._cgroup_fd = None
            if self._leader is not None:
                self._leader = None
                self.study.record(None)
            procs.subreaper(False)  # orphans of anything else go to init, as usual
            if self._owns_study:
                self.study.close()

    def _members(self, pgid: int) -> list[procs.Proc]:
        """The run's live processes: its group, its cgroup, its marked descendants."""
        found = {p.pid: p for p in procs.marked(f"{MARKER}={self.env[MARKER]}".encode())}
        if self.cgroup is not None:
            for pid in procs.cgroup_pids(self.cgroup):
                proc = procs.stat(pid)
                if proc is not None:
                    found[pid] = proc
        for proc in procs.children():
            if proc.pgid == pgid:
                found[proc.pid] = proc
        return list(found.values())

    def _leftovers(self) -> list[procs.Proc]:
        pgid = self._leader.pgid if self._leader else -1
        found = {p.pid: p for p in self._members(pgid)}
        for proc in procs.children():  # orphans this subreaper adopted during the run
            if proc.pid not in self._children_before:
                found[proc.pid] = proc
        return list(found.values())

    def _signal_all(self, pgid: int, sig: int) -> None:
        procs.killpg(pgid, sig)
        for proc in self._members(pgid):
            procs.kill(proc.pid, sig)
            if proc.pgid != pgid:
                procs.killpg(proc.pgid, sig)
