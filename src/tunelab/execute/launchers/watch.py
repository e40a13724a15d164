"""What the controller does around each run it executes itself (the local launcher).

:class:`RunWatch` holds a study's :class:`~tunelab.noise.NoiseWatch` (what other processes
took of the run's cores while it ran, its own CPU time from the study's cgroup, CPU
pressure; with ``wait_quiet``, waiting for quiet cores first, and for quiet disks once a
run of the study waited for its own I/O), its :class:`~tunelab.execute.gpuwatch.GpuWatch`
(another process computing on a GPU the run used) and, when the
study prunes, its :class:`~tunelab.search.RunPruner` (stop a training run whose intermediate
figures fall behind). The local launcher calls :meth:`RunWatch.start` just before a run and
:meth:`WatchedRun.finish` after it; the runner calls :meth:`RunWatch.recorded` with each
stored run so the pruner learns its final figure. Runs on a batch scheduler run elsewhere and
are not watched from here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tunelab.execute.launchers.base import Outcome, RunRequest

if TYPE_CHECKING:
    from tunelab.execute.gpuwatch import GpuRun, GpuWatch
    from tunelab.noise import NoiseWatch, Snapshot
    from tunelab.search import PruneTrial, RunPruner
    from tunelab.store import RunRecord

__all__ = ["RunWatch", "WatchedRun"]


@dataclass
class WatchedRun:
    """One run being watched: what the launcher asks while it runs, and its closing step."""

    watch: RunWatch
    run: RunRequest
    before: Snapshot | None
    trial: PruneTrial | None
    should_stop: Callable[[], bool] | None
    gpus: GpuRun | None = None

    def finish(self, outcome: Outcome) -> Outcome:
        """``outcome`` with the run's noise sample (another process on its GPU makes it
        disturbed too) and, when the pruner stopped it, the reason (status ``stopped``)."""
        noise = None
        gpu_neighbours = self.gpus.stop() if self.gpus is not None else None
        if self.before is not None and self.watch.noise is not None:
            sample = self.watch.noise.stop(self.before)
            self.watch.runs_wait_for_io = self.watch.runs_wait_for_io or sample.waited_for_io
            if gpu_neighbours is not None:
                sample = dataclasses.replace(sample, disturbed=True, evidence="; ".join(
                    e for e in (sample.evidence, gpu_neighbours) if e))
            noise = sample.as_dict()
        reason = outcome.reason
        if outcome.status == "stopped" and self.trial is not None:
            step, value = (self.trial.steps[-1] if self.trial.steps
                           else (self.trial.pruned_at, math.nan))
            reason = (f"pruned at step {self.trial.pruned_at}: {self.watch.fom} {value:.4g} "
                      "behind the median of earlier runs")
        return dataclasses.replace(outcome, noise=noise, reason=reason)


class RunWatch:
    """Noise watch, ``--wait-quiet`` and pruning around the runs of one study."""

    def __init__(self, fom: str, *, noise: NoiseWatch | None = None,
                 pruner: RunPruner | None = None, wait_quiet: bool = False,
                 gpus: GpuWatch | None = None) -> None:
        self.fom = fom
        self.noise = noise
        self.gpus = gpus
        """Who else computes on the runs' GPUs (:mod:`tunelab.execute.gpuwatch`); None
        without ``nvidia-smi``, or without a noise watch."""
        self.pruner = pruner
        self.wait_quiet = wait_quiet
        self.runs_wait_for_io = False
        """Whether a run of the study waited for its own I/O: ``--wait-quiet`` then waits
        for quiet disks too."""
        self._trials: dict[tuple[str, int], PruneTrial] = {}

    def start(self, run: RunRequest) -> WatchedRun:
        """Just before ``run`` starts: wait for a quiet machine (if asked: its cores, and its
        disks once a run waited for its own I/O), sample it, open
        the run's pruning trial."""
        from tunelab.execute.hygiene import current_cgroup
        from tunelab.search import IntermediateTail

        if self.wait_quiet and self.noise is not None:
            self.noise.wait_quiet(disks=self.runs_wait_for_io)
        before = self.noise.start(current_cgroup()) if self.noise is not None else None
        gpus = self.gpus.start() if self.gpus is not None and before is not None else None
        trial, should_stop = None, None
        if self.pruner is not None:
            pruner = self.pruner
            trial = pruner.begin()
            self._trials[(run.point_key, run.repeat)] = trial
            tail = IntermediateTail(run.run_dir / "stdout.txt", self.fom)
            should_stop = lambda: any(  # noqa: E731
                pruner.report(trial, step, value) for step, value in tail.read())
        return WatchedRun(self, run, before, trial, should_stop, gpus)

    def recorded(self, record: RunRecord) -> None:
        """The runner stored ``record``: close its pruning trial with its final figure."""
        trial = self._trials.pop((record.point_key, record.repeat), None)
        if trial is not None and self.pruner is not None:
            self.pruner.end(trial, record.foms.get(self.fom) if record.status == "ok" else None)
