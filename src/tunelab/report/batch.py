"""Job scripts for a finished study's best configuration (``tunelab script``).

The same renderer as submission (:mod:`tunelab.execute.launchers.script`): the workload
says what the point needs (ranks, nodes, threads) and builds its command for a job-script
placement; the study's ``launcher:`` section and the command-line options give the
scheduler's requests.
"""

from __future__ import annotations

import json
import math
import shlex
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunelab.errors import StoreError, TunelabError

if TYPE_CHECKING:
    from tunelab.execute.launchers.config import LauncherConfig

__all__ = ["JobScriptFiles", "best_job_script"]


@dataclass(frozen=True)
class JobScriptFiles:
    """A job script and the files it expects beside it (path relative to the script's
    directory -> content): the inputs the workload staged for the point."""

    text: str
    files: dict[str, bytes] = field(default_factory=dict)

    def write(self, script: Path) -> list[Path]:
        """Write the script to ``script`` and the files beside it; the paths written."""
        written = []
        for name, data in {script.name: self.text.encode(), **self.files}.items():
            target = script.parent / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            written.append(target)
        return written


def best_job_script(study_dir: str | Path, *, scheduler: str, walltime_s: float | None = None,
                    mem: str | None = None, project: str | None = None,
                    queue: str | None = None, job_name: str | None = None,
                    modules: Sequence[str] | None = None,
                    directives: Sequence[str] | None = None,
                    site: str | None = None) -> JobScriptFiles:
    """The job script (``pbs`` or ``slurm``) that runs the best point of ``study_dir``, in
    the dialect of ``site`` (default: the study's site when it speaks ``scheduler``, else
    the scheduler's default site)."""
    from tunelab.cluster.mpi import Placement, portable_argv
    from tunelab.execute.launchers.script import SCHEDULERS, JobScript, render, suggest_walltime
    from tunelab.execute.launchers.sites import site_for
    from tunelab.execute.study import prepare_study
    from tunelab.report.load import load_results
    from tunelab.space import Point
    from tunelab.spec import StudySpec
    from tunelab.store import open_store
    from tunelab.workload import Needs

    study_dir = Path(study_dir)
    results = load_results(study_dir)
    winner = results.best_result().best
    with open_store(study_dir) as store:
        raw = json.loads(store.get_meta("spec") or "{}")
        study_file = store.get_meta("study_file") or ""
    if not raw:
        raise StoreError(f"{study_dir}: holds no study spec")
    spec = StudySpec.from_mapping(raw, source=study_file or str(study_dir),
                                  path=Path(study_file) if study_file else None)
    study = prepare_study(spec)
    cfg = _with_options(study.launcher, {"memory": mem, "account": project, "partition": queue,
                                         "modules": list(modules or ()) or None,
                                         "directives": list(directives or ()) or None})
    if scheduler not in SCHEDULERS:
        raise TunelabError(f"unknown scheduler {scheduler!r}; choose one of: "
                           f"{', '.join(SCHEDULERS)}")
    try:
        profile = site_for(scheduler, site) if site else cfg.site_profile(scheduler)
    except ValueError as exc:
        raise TunelabError(f"--site: {exc}") from None
    point = Point.from_key(winner.point)
    needs = study.workload.needs(study.space.values(point))
    if "nodes" not in point and "ppn" not in point and cfg.cores_per_node:
        nodes = min(needs.ranks, math.ceil(needs.ranks * needs.threads / cfg.cores_per_node))
        needs = Needs(needs.ranks, max(1, nodes), needs.threads, needs.memory)
    placement = Placement("script", cfg.starter or profile.starter, needs.nodes,
                          cfg.cores_per_node, mpi=profile.mpi)
    with tempfile.TemporaryDirectory(prefix="tunelab-script-") as tmp:
        ctx = study.context(point, Path(tmp), study_dir, placement=placement,
                            cores=cfg.cores_per_node)
        cmd = study.workload.command(ctx)
        files = {str(f.relative_to(tmp)): f.read_bytes()
                 for f in sorted(Path(tmp).rglob("*")) if f.is_file()}
    env = {**profile.env, **{k: str(v) for k, v in cfg.env.items()}, **ctx.env, **cmd.env}
    return JobScriptFiles(render(JobScript(
        scheduler=scheduler, name=job_name or f"tunelab-{study.workload.name}",
        walltime_s=walltime_s or cfg.walltime_s or suggest_walltime(winner.median),
        body=(shlex.join(portable_argv(cmd.argv)),), nodes=needs.nodes,
        tasks_per_node=needs.ranks_per_node, cpus_per_task=needs.threads,
        memory=cfg.memory or needs.memory, account=cfg.account,
        partition=cfg.partition, modules=tuple(cfg.modules),
        directives=tuple(cfg.directives), env=env,
        pbs_resources=cfg.pbs_resources or ("select" if profile.resources == "slurm"
                                            else profile.resources),
        workdir_mode=profile.workdir, account_flag=profile.account_flag,
        exclusive=cfg.isolation == "exclusive",
        cores_per_node=cfg.cores_per_node)), files)


_OPTION_OF = {"memory": "--mem", "account": "--project", "partition": "--queue",
              "modules": "--module", "directives": "--directive"}


def _with_options(cfg: LauncherConfig, given: dict[str, Any]) -> LauncherConfig:
    """``cfg`` with the command line's values in place of its own, each checked as the study
    file's launcher section checks it (``--mem -5GB`` is refused as ``memory: -5GB`` is)."""
    from pydantic import ValidationError

    update = {name: value for name, value in given.items() if value is not None}
    try:
        return type(cfg).model_validate({**cfg.model_dump(exclude_unset=True), **update})
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else ""
        flag = _OPTION_OF.get(name, name)
        message = str(error["msg"]).removeprefix("Value error, ")
        raise TunelabError(f"{flag}: {message}") from None
