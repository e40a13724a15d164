"""Launchers: where a study's runs execute — this machine, a Slurm or a PBS cluster.

One contract (:class:`Launcher`: submit, poll, collect, cancel), one job-script renderer
(:mod:`~tunelab.execute.launchers.script`) and one job step
(:mod:`~tunelab.execute.launchers.step`) that runs inside the allocation. Choose one with
:func:`make_launcher` from the study's ``launcher:`` section.
"""

from __future__ import annotations

from tunelab.errors import StudyError
from tunelab.execute.launchers.base import Job, JobStatus, Launcher, Outcome, RunRequest
from tunelab.execute.launchers.config import LAUNCHER_TYPES, LauncherConfig, launcher_config
from tunelab.execute.launchers.local import LocalLauncher
from tunelab.execute.launchers.pbs import PbsLauncher
from tunelab.execute.launchers.slurm import SlurmLauncher

__all__ = [
    "Job",
    "JobStatus",
    "Launcher",
    "LauncherConfig",
    "LocalLauncher",
    "Outcome",
    "PbsLauncher",
    "RunRequest",
    "SlurmLauncher",
    "launcher_config",
    "make_launcher",
]

_LAUNCHERS: dict[str, type[Launcher]] = {
    "local": LocalLauncher, "slurm": SlurmLauncher, "pbs": PbsLauncher}


def make_launcher(config: LauncherConfig) -> Launcher:
    """The launcher ``config.type`` names."""
    cls = _LAUNCHERS.get(config.type)
    if cls is None:
        raise StudyError(f"unknown launcher type {config.type!r}; valid: "
                         f"{', '.join(LAUNCHER_TYPES)}")
    return cls(config)
