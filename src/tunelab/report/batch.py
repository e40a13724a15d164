"""Job scripts for a finished study's best configuration (``tunelab script``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tunelab.errors import StoreError

__all__ = ["best_job_script"]


def best_job_script(study_dir: str | Path, *, scheduler: str, **resources: Any) -> str:
    """The workload's job script (``pbs`` or ``slurm``) for the best point of ``study_dir``."""
    from tunelab.execute.runner import prepare_study
    from tunelab.report.summary import load_results
    from tunelab.space import Point
    from tunelab.spec import ENV_AXIS, StudySpec
    from tunelab.store import open_store

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
    point = Point.from_key(winner.point)
    env = spec.env_sets[str(point[ENV_AXIS])] if spec.env_sets is not None else {}
    return study.workload.job_script(study.space.values(point), scheduler=scheduler, env=env,
                                     measured_s=winner.median, **resources)
