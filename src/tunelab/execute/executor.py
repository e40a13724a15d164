"""The launch/collect step of the runner: runs in, finished :class:`RunRecord` objects out.

:class:`Executor` takes (point, repeat) pairs, prepares each run (its directory and
command), hands them to a :class:`~tunelab.execute.launchers.Launcher` as jobs — one per run
(``per-run``: at most ``max_queued`` in the queue) or a few packs that run many one after
another inside one allocation (``pack``) — polls the jobs, and turns each run's exit status
and output into a record (parse, invariants) that it passes to ``on_record``. Only this
process writes the store: jobs leave files in run directories.

Resume: every job is stored (``jobs`` table: token, scheduler id, runs) before it is
submitted; :meth:`Executor.reattach` picks up the open jobs of an earlier controller —
collecting what they finished, waiting for what still runs — so a run is never submitted
twice nor lost. A run that a job's end cut off or never started is judged by
:mod:`tunelab.execute.jobends`: lost by the infrastructure (node failure, preemption,
``scancel`` from outside, walltime, a vanished job: submitted again up to
``launcher.retries`` times, each attempt stored, then stored as ``lost``), failed by the
program (out of memory), or packed again (a pack that made progress on others). Every path
of a job is absolute, whatever the study directory was given as.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tunelab.errors import LaunchError, WorkloadError
from tunelab.execute.guards import (
    command_problem,
    overridden_env,
    override_note,
    read_output,
    write_fault,
)
from tunelab.execute.jobends import judge_run_end, scheduler_reason
from tunelab.execute.launchers.base import (
    Job,
    JobStatus,
    Launcher,
    Outcome,
    RunRequest,
    started_info,
)
from tunelab.execute.reasons import printable
from tunelab.execute.records import drop_scratch, run_record, timestamp
from tunelab.execute.study import run_dir_of
from tunelab.space import Point
from tunelab.store import RunRecord, Store

if TYPE_CHECKING:
    from tunelab.execute.study import Study

__all__ = ["Executor"]

_TAIL_CHARS = 300
_CANCEL_WAIT_S = 30.0
#: How long the scheduler may not answer polls before the controller gives up (its jobs
#: stay stored: running it again re-attaches).
_POLL_PATIENCE_S = 300.0


def _tail(path: Path) -> str:
    text = read_output(path).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return printable(lines[-1][-_TAIL_CHARS:], _TAIL_CHARS) if lines else ""


@dataclass
class _Active:
    job: Job
    job_id: str


class Executor:
    """Runs (point, repeat) pairs of a study through a launcher; see the module docstring.

    ``on_record`` receives every finished run (the runner stores it); once ``stop`` returns
    True no further run is submitted (those already submitted finish and are recorded). The
    executor never blocks for longer than one poll interval without checking its jobs.
    """

    def __init__(self, study: Study, store: Store, study_dir: Path, launcher: Launcher, *,
                 host: str, sysinfo_id: int | None,
                 on_record: Callable[[RunRecord], object],
                 stop: Callable[[], bool] = lambda: False,
                 on_note: Callable[[str], object] | None = None) -> None:
        self.study = study
        self.store = store
        self.study_dir = Path(os.path.abspath(study_dir))  # jobs run elsewhere: no relative path
        self.launcher = launcher
        self.host = host
        self.sysinfo_id = sysinfo_id
        self.on_record = on_record
        self.stop = stop
        self.jobs_dir = self.study_dir / "jobs"
        self.active: dict[str, _Active] = {}
        self.again: deque[tuple[Point, int]] = deque()
        """Runs the infrastructure lost, to be submitted again (``launcher.retries``)."""
        self._judged: set[tuple[str, str, int]] = set()
        """(job token, point key, repeat) of runs whose loss is stored already."""
        self._reattached: set[str] = set()
        """Tokens of the jobs an earlier controller submitted: their runs are stored without
        this session's ``sysinfo_id`` (it names the session a run started in)."""
        self._losses: dict[tuple[str, int], int] = {}
        """Attempts of each run lost since this controller started (a resume starts the
        count again: ``launcher.retries`` more chances)."""
        self.done: set[tuple[str, int]] = store.completed()
        self._checked: set[tuple[int, int, int, float]] = set()
        self._poll_failed_since: float | None = None
        self.detached = False
        self.on_note = on_note
        self._overrides: set[str] = set()
        """The variables the workload set over the user's, already said (``on_note``)."""
        self._pending: dict[str, str] = {}
        """The pending reason last said of each queued job (by token)."""
        self._blocked_since: dict[str, float] = {}
        """Since when (monotonic) each queued job has been blocked without a check."""
        self._running: set[str] = set()
        """Tokens of the jobs last seen running."""
        self._requeued: set[str] = set()
        """Tokens of the jobs seen running, then queued again: the scheduler requeued them."""

    # ------------------------------------------------------------------ public steps

    @contextmanager
    def session(self, *, detach: bool = False) -> Iterator[Executor]:
        """Re-attach to earlier jobs on entry; on Ctrl-C cancel this study's jobs (unless
        ``detach``), record what they finished, and re-raise."""
        self.detached = detach
        self.reattach()
        try:
            yield self
        except KeyboardInterrupt:
            if not detach and self.active:
                self.cancel_all()
            raise

    def covered(self) -> set[tuple[str, int]]:
        """(point key, repeat) of every run that an active job will still execute."""
        return {(r.point_key, r.repeat) for a in self.active.values() for r in a.job.runs}

    def reattach(self) -> None:
        """Take over the open jobs the store knows (from an earlier, maybe killed,
        controller), then collect whatever of them has ended."""
        for stored in self.store.open_jobs():
            if stored.launcher != self.launcher.name:
                raise LaunchError(
                    f"{self.study_dir} has open {stored.launcher} jobs; resume it with "
                    f"launcher type {stored.launcher} (or cancel them and delete "
                    f"{self.study_dir}/jobs)")
            runs = tuple(RunRequest.from_json(r) for r in stored.runs)
            job = Job(stored.token, runs, self.jobs_dir)
            self._reattached.add(stored.token)
            job_id = stored.job_id or self.launcher.find(job)
            if job_id is None:  # never accepted, or gone: its run directories tell
                self._finish_job(job, JobStatus("unknown"), accepted=False)
                continue
            if stored.job_id is None:
                self.store.set_job_id(job.token, job_id)
            self.active[job.token] = _Active(job, job_id)
        if self.active:
            self.poll_once()

    def execute(self, pairs: Sequence[tuple[Point, int]]) -> None:
        """Run every pair not done and not already in an active job; return when all of
        them are recorded (or, when detached, once they are submitted). Runs that jobs
        (earlier ones too) lost are submitted again until their retries are spent."""
        covered = self.covered()
        todo = [(p, r) for p, r in pairs
                if (p.key, r) not in self.done and (p.key, r) not in covered]
        while todo or self.active:
            if todo and self.launcher.batch:
                self._check(todo)
            if self.launcher.config.mode == "pack" and self.launcher.batch:
                self._run_packs(todo)
            else:
                self._run_each(todo)
            if self.detached:
                return
            self.wait_all()  # jobs of an earlier controller hold the rest of the runs
            todo = [] if self.stop() else self._take_again()

    def poll_once(self) -> int:
        """Poll the active jobs once; record what they finished; close the ended ones.
        Returns how many runs were recorded. With ``wait``, sleep one poll interval first
        when nothing was recorded."""
        if not self.active:
            return 0
        try:
            statuses = self.launcher.poll([a.job_id for a in self.active.values()])
        except LaunchError:  # the scheduler did not answer: ask again, up to a limit
            now = time.monotonic()
            self._poll_failed_since = self._poll_failed_since or now
            if now - self._poll_failed_since > _POLL_PATIENCE_S:
                raise
            return 0
        self._poll_failed_since = None
        recorded = 0
        for token, active in list(self.active.items()):
            status = statuses.get(active.job_id, JobStatus("unknown"))
            if status.phase == "running":
                self._running.add(token)
            elif status.phase == "queued" and token in self._running:
                self._requeued.add(token)
            if status.ended:
                recorded += self._finish_job(active.job, status)
                del self.active[token]
            else:
                self._pending_reason(active, status)
                recorded += self._collect_finished(active.job)
        return recorded

    def _pending_reason(self, active: _Active, status: JobStatus) -> None:
        """Say why a queued job waits when the reason changes. When the scheduler has said
        for the launcher's ``blocked_wait`` that it cannot start on the cluster as it is
        (nodes down or drained: a node may be back in a minute), submit-test it again and,
        refused, cancel this study's jobs and stop with one line (their runs never started:
        a resume runs them); accepted, wait as long again before the next test."""
        token = active.job.token
        reason = status.reason if status.phase == "queued" else ""
        if reason != self._pending.get(token, ""):
            self._pending[token] = reason
            if reason and self.on_note is not None:
                self.on_note(f"job {active.job_id} pending: {reason}")
        if not (reason and status.blocked):
            self._blocked_since.pop(token, None)
            return
        now = time.monotonic()
        since = self._blocked_since.setdefault(token, now)
        if now - since < self.launcher.config.blocked_wait_s:
            return
        self._blocked_since[token] = now
        try:
            self.launcher.check([active.job])
        except LaunchError as exc:
            self.cancel_all()
            raise LaunchError(
                f"job {active.job_id} ({active.job.name}) cannot start: {reason} "
                f"(for {now - since:.0f} s); {exc}. Its runs did not start and nothing was "
                "lost: run the same command again once the nodes are back") from None

    def wait_all(self) -> None:
        """Poll until no job is active."""
        interval = self.launcher.config.poll_s if self.launcher.batch else 0.0
        while self.active:
            if self.poll_once() == 0 and self.active and interval:
                time.sleep(interval)

    def cancel_all(self) -> None:
        """Cancel every active job of the study, record what they finished, close them."""
        ids = [a.job_id for a in self.active.values()]
        self.launcher.cancel(ids)
        deadline = time.monotonic() + _CANCEL_WAIT_S
        while self.active and time.monotonic() < deadline:
            try:
                statuses = self.launcher.poll([a.job_id for a in self.active.values()])
            except LaunchError:
                break
            for token, active in list(self.active.items()):
                self._collect_finished(active.job)
                if statuses.get(active.job_id, JobStatus("unknown")).ended:
                    self.store.close_job(token, "CANCELLED")
                    del self.active[token]
            if self.active:
                time.sleep(0.5)
        for token in list(self.active):  # still listed: leave them to the next controller
            del self.active[token]

    # ------------------------------------------------------------------ per-run, packs

    def _run_each(self, todo: list[tuple[Point, int]]) -> None:
        """One job per run, at most ``max_queued`` active at once (one at a time locally);
        runs the infrastructure lost go to the back of the queue."""
        limit = self.launcher.config.max_queued if self.launcher.batch else 1
        queue = deque(todo)
        while (queue or self.again) and not self.stop() or self.active:
            queue.extend(self._take_again())
            while queue and len(self.active) < limit and not self.stop():
                point, repeat = queue.popleft()
                request = self._prepare(point, repeat)
                if request is not None:
                    self._submit((request,))
            if self.detached:
                return
            if self.poll_once() == 0 and self.active and self.launcher.batch:
                time.sleep(self.launcher.config.poll_s)

    def _run_packs(self, todo: list[tuple[Point, int]]) -> None:
        """Split the runs over ``allocations`` packs (round-robin: each pack keeps the
        interleaved order); submit them; pack again the runs that ended packs did not
        finish (prepared again, from a clean directory, like the first time)."""
        pairs = list(todo)
        while pairs and not self.stop():
            requests = [r for p, rep in pairs if (r := self._prepare(p, rep)) is not None]
            n = min(self.launcher.config.allocations, len(requests))
            for i in range(n):
                self._submit(tuple(requests[i::n]))
            if self.detached:
                return
            self.wait_all()
            pairs = self._take_again()

    def _take_again(self) -> list[tuple[Point, int]]:
        """The lost runs waiting to be submitted again (emptied)."""
        again = [(p, r) for p, r in self.again if (p.key, r) not in self.done]
        self.again.clear()
        return again

    # ------------------------------------------------------------------ the pieces

    def _check(self, todo: list[tuple[Point, int]]) -> None:
        """Ask the launcher, before anything is submitted, whether it would take the jobs
        these runs make (each distinct shape once)."""
        study = self.study
        runs = []
        for point, repeat in todo:
            needs = study.workload.needs(study.space.values(point))
            runs.append(RunRequest(point.key, repeat, self.jobs_dir, (), {}, self.jobs_dir,
                                   study.spec.timeout_s, needs))
        if self.launcher.config.mode == "pack":
            n = min(self.launcher.config.allocations, len(runs))
            jobs = [Job("check", tuple(runs[i::n]), self.jobs_dir) for i in range(n)]
        else:
            jobs = [Job("check", (run,), self.jobs_dir) for run in runs]
        fresh = {}
        for job in jobs:
            needs = job.needs()
            shape = (needs.nodes, needs.ranks_per_node, needs.threads,
                     sum(r.timeout_s for r in job.runs))
            if shape not in self._checked:
                fresh[shape] = job
        if fresh:
            self.launcher.check(list(fresh.values()))
            self._checked.update(fresh)

    def _submit(self, runs: tuple[RunRequest, ...]) -> None:
        job = Job(secrets.token_hex(6), runs, self.jobs_dir)
        if not self.launcher.batch:  # runs here, now: nothing to re-attach to later
            try:
                self.launcher.submit(job)
            except OSError as exc:  # the run's own files could not be written
                raise write_fault(exc, runs[0].run_dir) from None
            self._collect_finished(job)
            return
        self.store.add_job(job.token, self.launcher.name, [r.to_json() for r in runs], timestamp())
        try:
            job_id = self.launcher.submit(job)
        except BaseException as exc:
            self.store.close_job(job.token, "NOT_SUBMITTED")
            if isinstance(exc, OSError):  # the job's files could not be written
                raise write_fault(exc, self.jobs_dir) from None
            if isinstance(exc, LaunchError) and self.active:
                raise LaunchError(f"{exc} ({len(self.active)} job(s) submitted before stay in "
                                  f"the queue; 'tunelab status {self.study_dir}' collects "
                                  "them)") from None
            raise
        self.store.set_job_id(job.token, job_id)
        self.active[job.token] = _Active(job, job_id)

    def _clean(self, run_dir: Path) -> None:
        try:
            if run_dir.exists():
                shutil.rmtree(run_dir)
            run_dir.mkdir(parents=True)
        except OSError as exc:
            raise write_fault(exc, run_dir) from None

    def _prepare(self, point: Point, repeat: int) -> RunRequest | None:
        """The run's directory (wiped) and command; a command that cannot be built is
        recorded as a failed run at once (None)."""
        study = self.study
        run_dir = run_dir_of(self.study_dir, point, repeat)
        self._clean(run_dir)
        env: dict[str, str] = {}
        try:
            needs = study.workload.needs(study.space.values(point))
            placement = self.launcher.placement(needs, run_dir)
            ctx = study.context(point, run_dir, self.study_dir, repeat, placement=placement,
                                cores=self.launcher.cores_per_node)
            env = dict(ctx.env)
            cmd = study.workload.command(ctx)
            problem = command_problem(cmd.argv, {**ctx.env, **cmd.env}, cmd.cwd or run_dir)
            if problem is not None:
                raise LaunchError(problem)
            self._note_overrides(overridden_env(cmd.env, ctx.env, os.environ))
        except (LaunchError, WorkloadError) as exc:
            self._record(point.key, dict(point), repeat, run_dir, [], env,
                         Outcome("failed", None, 0.0, reason=str(exc)))
            return None
        return RunRequest(point.key, repeat, run_dir, tuple(cmd.argv),
                          {**ctx.env, **cmd.env}, cmd.cwd or run_dir, study.spec.timeout_s,
                          needs)

    def _note_overrides(self, said: list[str]) -> None:
        """Say once per variable and value that the workload sets it over the user's."""
        new = [s for s in said if s not in self._overrides]
        self._overrides.update(new)
        if new and self.on_note is not None:
            self.on_note(override_note(self.study.workload.name, new))

    def _collect_finished(self, job: Job) -> int:
        """Record every run of ``job`` that has an exit status and is not stored yet (a run
        whose job step says the scheduler ended it is a lost attempt)."""
        recorded = 0
        for run in job.runs:
            key = (run.point_key, run.repeat)
            if key in self.done or (job.token, *key) in self._judged:
                continue
            outcome = self.launcher.collect(run)
            if outcome is None:
                continue
            if outcome.status == "lost":
                hosts = (started_info(run.run_dir) or {}).get("hosts") or outcome.host
                recorded += self._lose(run, job, "ABORTED", outcome.reason or "lost", hosts)
            else:
                self._record_request(run, outcome, job)
                recorded += 1
        return recorded

    def _finish_job(self, job: Job, status: JobStatus, *, accepted: bool = True) -> int:
        """``job`` ended: record its finished runs, then judge each run it cut off or never
        started (:func:`~tunelab.execute.jobends.judge_run_end`); close it. A job the
        scheduler never accepted (``accepted=False``) lost nothing: its runs that never
        started go to the next job as they are."""
        recorded = self._collect_finished(job)
        word = scheduler_reason(status, job.output_path)
        if word == "COMPLETED" and job.token in self._requeued:
            word = "REQUEUED"  # a run it cut off was cut by the requeue, not by its end
        started = {(r.point_key, r.repeat): started_info(r.run_dir) for r in job.runs}
        progressed = any(info is not None for info in started.values())
        tail = _tail(job.output_path)
        for run in job.runs:
            key = (run.point_key, run.repeat)
            if key in self.done or (job.token, *key) in self._judged:
                continue
            info = started[key]
            if info is None and not accepted:
                continue  # the plan of this or the next controller holds it
            end = judge_run_end(word, started=info is not None, pack_progressed=progressed,
                                job_name=job.name, output_tail=tail)
            if end.kind == "repack":
                self.again.append((Point.from_key(run.point_key), run.repeat))
            elif end.kind == "lost":
                hosts = (info or {}).get("hosts") or (info or {}).get("host")
                recorded += self._lose(run, job, word, end.reason, hosts)
            else:
                self._record_request(run, Outcome("failed", None, 0.0, reason=end.reason), job)
                recorded += 1
        self.store.close_job(job.token, word)
        return recorded

    def _lose(self, run: RunRequest, job: Job, state: str, reason: str,
              node: object) -> int:
        """Store an attempt the infrastructure lost; submit the run again while retries are
        left, else record it as ``lost``. Returns how many runs were recorded (0 or 1)."""
        point = Point.from_key(run.point_key)
        self._judged.add((job.token, run.point_key, run.repeat))
        node_text = ",".join(node) if isinstance(node, list) else (str(node) if node else None)
        active = next((a for a in self.active.values() if a.job.token == job.token), None)
        attempts = self.store.record_attempt(
            run.point_key, dict(point), run.repeat, job=active.job_id if active else job.name,
            state=state, node=node_text, reason=reason, at=timestamp())
        key = (run.point_key, run.repeat)
        self._losses[key] = self._losses.get(key, 0) + 1
        retries = self.launcher.config.retries
        if self._losses[key] <= retries:
            self.again.append((point, run.repeat))
            if self.on_note is not None:
                where = f" on {node_text}" if node_text else ""
                self.on_note(f"{point.label()} r{run.repeat}: an attempt was "
                             f"lost{where} ({reason}); submitted again (retry "
                             f"{self._losses[key]} of {retries})")
            return 0
        self._record_request(run, Outcome(
            "lost", None, 0.0, reason=f"{reason}; lost {attempts} times, not submitted again "
                                      "(a resume runs it again)"), job)
        return 1

    def _record_request(self, run: RunRequest, outcome: Outcome, job: Job) -> None:
        point = Point.from_key(run.point_key)
        self._record(run.point_key, dict(point), run.repeat, run.run_dir, list(run.argv),
                     dict(run.env), outcome, own=job.token not in self._reattached)

    def _record(self, key: str, params: dict[str, object], repeat: int, run_dir: Path,
                argv: list[str], env: dict[str, str], outcome: Outcome, *,
                own: bool = True) -> None:
        """Store a run; ``own``: started in this session (by a job it submitted)."""
        record = run_record(self.study, self.store, key, params, repeat, run_dir, argv, env,
                            outcome, host=self.host, study_dir=self.study_dir,
                            sysinfo_id=self.sysinfo_id if own else None)
        self.done.add((key, repeat))
        self.on_record(record)
        drop_scratch(self.study, run_dir)
