"""The study file's ``launcher:`` section.

::

    launcher:
      type: slurm            # local (default) | slurm | pbs
      mode: pack             # per-run: one job per (point, repeat); pack: one allocation runs many
      account: proj1         # Slurm --account / PBS -P (alias: project)
      partition: debug       # Slurm --partition / PBS -q (alias: queue)
      walltime: 30m          # per job; default: the study's timeout (x the runs of a pack) + 2 min
      nodes: 2               # nodes per job (default: the largest point's need)
      tasks_per_node: 2      # default: the largest point's ranks per node
      cpus_per_task: 1       # default: the largest point's threads per rank
      cores_per_node: 48     # the nodes' size, for rules (default: this machine's)
      memory: 190GB          # per node
      modules: [qe]          # 'module load' lines
      directives: ["--exclusive"]   # extra '#SBATCH' / '#PBS' lines
      env: {OMP_PROC_BIND: close}   # exported in every job
      max_queued: 20         # per-run: jobs in the queue at once
      allocations: 1         # pack: how many allocations share the runs
      retries: 2             # a run the infrastructure lost is submitted again this many times
      poll_interval: 2s
      blocked_wait: 5m       # a job its down or drained nodes keep from starting: checked again
                             # (sbatch --test-only) after this long, and refused, the study stops
      site: pbspro           # the scheduler's dialect (launchers/sites.py): slurm, slurm-pmi2,
                             # slurm-none, pbspro, openpbs, gadi, torque, virtual
      isolation: exclusive   # exclusive (default): jobs get whole nodes | shared
      starter: srun          # MPI ranks in an allocation: srun | mpirun (default: the site's)
      pbs_resources: select  # override the site's PBS resource syntax: ncpus | select | nodes
      python: /path/python   # the interpreter of the job step on the nodes (default: this one)
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from tunelab.errors import StudyError
from tunelab.execute.launchers.sites import Site, site_for
from tunelab.spec import StudySpec, parse_duration

__all__ = ["LAUNCHER_TYPES", "LauncherConfig", "launcher_config"]

LAUNCHER_TYPES = ("local", "slurm", "pbs")
_MEMORY = re.compile(r"\d+(\.\d+)?\s*([KMGTP]i?B?|[kmgtp]b?)?")
_ALIASES = {"project": "account", "queue": "partition"}


class LauncherConfig(BaseModel):
    """Where and how a study's runs execute (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["local", "slurm", "pbs"] = "local"
    mode: Literal["per-run", "pack"] = "per-run"
    account: str | None = None
    partition: str | None = None
    walltime: float | str | None = None
    nodes: int | None = Field(default=None, ge=1, le=100_000)
    tasks_per_node: int | None = Field(default=None, ge=1, le=100_000)
    cpus_per_task: int | None = Field(default=None, ge=1, le=100_000)
    cores_per_node: int | None = Field(default=None, ge=1, le=100_000)
    memory: str | None = None
    modules: list[str] = Field(default_factory=list, max_length=100)
    directives: list[str] = Field(default_factory=list, max_length=100)
    env: dict[str, str | int | float] = Field(default_factory=dict, max_length=1000)
    max_queued: int = Field(default=50, ge=1, le=100_000)
    allocations: int = Field(default=1, ge=1, le=1000)
    retries: int = Field(default=2, ge=0, le=100)
    poll_interval: float | str = 2.0
    blocked_wait: float | str = 300.0
    site: str | None = None
    isolation: Literal["exclusive", "shared"] = "exclusive"
    starter: Literal["srun", "mpirun"] | None = None
    pbs_resources: Literal["ncpus", "select", "nodes"] | None = None
    python: str | None = None

    @field_validator("site")
    @classmethod
    def _known_site(cls, value: str | None, info: ValidationInfo) -> str | None:
        kind = info.data.get("type", "local")
        if value is not None:
            if kind == "local":
                raise ValueError("a site applies to type slurm or pbs, not local")
            site_for(kind, value)
        return value

    @field_validator("walltime", "poll_interval", "blocked_wait")
    @classmethod
    def _duration(cls, value: float | str | None) -> float | str | None:
        if value is not None:
            parse_duration(value)
        return value

    @field_validator("account", "partition", "python")
    @classmethod
    def _one_word(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or re.search(r"\s", value)):
            raise ValueError(f"must be one word without spaces, got {value!r}")
        return value

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str | None) -> str | None:
        if value is not None and not _MEMORY.fullmatch(value.strip()):
            raise ValueError(f"must be a size such as 4G or 190GB, got {value!r}")
        return value

    @field_validator("modules", "directives")
    @classmethod
    def _one_line(cls, values: list[str]) -> list[str]:
        for value in values:
            if not value.strip() or "\n" in value or "\r" in value:
                raise ValueError(f"each entry must be one non-empty line, got {value!r}")
        return values

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, Any]) -> dict[str, Any]:
        for key, value in env.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"{key!r} is not an environment variable name")
            if isinstance(value, bool):
                raise ValueError(f"{key} must be a string or number, got {value!r}")
        return env

    @property
    def batch(self) -> bool:
        """True for the launchers that submit to a scheduler."""
        return self.type != "local"

    @property
    def poll_s(self) -> float:
        """Seconds between two polls of the scheduler."""
        return parse_duration(self.poll_interval)

    @property
    def blocked_wait_s(self) -> float:
        """Seconds a job may wait for nodes the scheduler holds out of service before it is
        submit-tested again (and, refused, the study stops)."""
        return parse_duration(self.blocked_wait)

    @property
    def walltime_s(self) -> float | None:
        """The configured walltime in seconds, or None (derived from the timeout)."""
        return parse_duration(self.walltime) if self.walltime is not None else None

    def site_profile(self, scheduler: str | None = None) -> Site:
        """The site of ``scheduler`` (default: this launcher's): the study's ``site`` when it
        speaks that scheduler, else the scheduler's default site."""
        scheduler = scheduler or self.type
        named = self.site if self.site is not None and self.type == scheduler else None
        return site_for(scheduler, named)

    def starter_for(self, scheduler: str) -> Literal["srun", "mpirun"]:
        """How MPI ranks start inside an allocation of ``scheduler``."""
        if self.starter is not None:
            return self.starter
        return self.site_profile(scheduler).starter

    def resources_for(self, scheduler: str) -> Literal["ncpus", "select", "nodes"]:
        """The PBS resource syntax: ``pbs_resources`` when given, else the site's."""
        if self.pbs_resources is not None:
            return self.pbs_resources
        style = self.site_profile(scheduler).resources
        return "select" if style == "slurm" else style

    def job_env(self, scheduler: str | None = None) -> dict[str, str]:
        """The site's environment and the ``env`` entries, as strings."""
        site = self.site_profile(scheduler) if (scheduler or self.batch) else None
        return {**(dict(site.env) if site else {}), **{k: str(v) for k, v in self.env.items()}}


def launcher_config(spec: StudySpec) -> LauncherConfig:
    """The validated ``launcher:`` section of ``spec`` (``type: local`` when absent);
    errors name the file, line and field."""
    raw = spec.raw.get("launcher")
    if raw is None:
        return LauncherConfig()
    if not isinstance(raw, dict):
        raise StudyError(f"{spec.where('launcher')}: 'launcher' must be a mapping such as "
                         f"{{type: slurm, partition: debug}}, got {raw!r}")
    data = {_ALIASES.get(k, k): v for k, v in raw.items()}
    try:
        return LauncherConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"]]
        key = next((k for k, v in _ALIASES.items() if loc and v == loc[0] and k in raw),
                   loc[0] if loc else "launcher")
        where = spec.where("launcher", key, *loc[1:])
        if err["type"] == "extra_forbidden":
            valid = ", ".join(sorted([*LauncherConfig.model_fields, *_ALIASES]))
            raise StudyError(f"{where}: unknown launcher field {key!r}; valid: {valid}") \
                from None
        msg = err["msg"].removeprefix("Value error, ")
        raise StudyError(f"{where}: launcher {'.'.join([key, *loc[1:]])!r}: {msg}, got "
                         f"{err.get('input')!r}") from None
