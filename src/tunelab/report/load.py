"""A study's results read from its store: :func:`load_results`, what ``tunelab
compare|best|report`` start from.

It reads the runs table and the meta values the results need (the objective, the baseline,
the noise threshold, the ``repeats: auto`` plan, the planned runs, the figures' units) and
hands them to the pure step, :func:`tunelab.report.results.results_from_frame`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from tunelab.report.results import StudyResults, results_from_frame
from tunelab.stats import SequentialPlan, StatsError
from tunelab.workload import Direction, Objective

__all__ = ["load_results", "stored_units"]


def load_results(directory: str | Path, *, exclude_disturbed: bool = False) -> StudyResults:
    """Read a study directory's store and compute its results (``exclude_disturbed``:
    leave runs flagged disturbed out of every statistic).

    Uses the store's meta values ``study_name``, ``objective`` (JSON ``[fom, direction]``),
    ``baseline`` (point key, empty for none), ``noise_threshold``, ``repeats_auto`` (JSON
    ``[min, max]`` of a ``repeats: auto`` study) and ``spec``.
    """
    from tunelab.store import open_store

    directory = Path(directory)
    with open_store(directory) as store:
        runs = store.runs_frame()
        fom, direction = "wall_s", "minimize"
        raw = store.get_meta("objective")
        if raw:
            fom, direction = json.loads(raw)
        if direction not in ("minimize", "maximize"):
            raise StatsError(f"{directory}: stored objective direction {direction!r} is unknown")
        raw_noise = store.get_meta("noise_threshold")
        noise = float(raw_noise) if raw_noise else 0.02
        if not math.isfinite(noise):
            noise = 0.02
        spec_raw = store.get_meta("spec")
        auto = store.get_meta("repeats_auto")
        plan = SequentialPlan(*json.loads(auto)) if auto else None
        spec = json.loads(spec_raw) if spec_raw else {}
        units = stored_units(store.get_meta("fom_units"))
        return results_from_frame(
            runs,
            Objective(fom, cast(Direction, direction), units.get(fom, "")),
            store.get_meta("baseline") or None,
            name=store.get_meta("study_name") or directory.name,
            spec=spec,
            sysinfo=store.sysinfo(),
            noise_threshold=noise,
            directory=directory,
            spec_yaml=store.get_meta("spec_yaml") or "",
            study_file=store.get_meta("study_file") or "",
            exclude_disturbed=exclude_disturbed,
            plan=plan,
            planned=_planned_runs(store.get_meta("planned_runs"), spec, plan),
            fom_units=units,
        )


def _planned_runs(stored: str | None, spec: Mapping[str, Any],
                  plan: SequentialPlan | None) -> int:
    """The runs a study makes, as ``run`` stored it, when that number is exact (a grid or
    random search with fixed repeats); 0 otherwise (adaptive searches and ``repeats: auto``
    stop when they have seen enough: their number is an upper bound)."""
    search = spec.get("search") if isinstance(spec, Mapping) else None
    strategy = search.get("strategy", "grid") if isinstance(search, Mapping) else "grid"
    if plan is not None or strategy not in ("grid", "random") or not stored:
        return 0
    try:
        return max(int(stored), 0)
    except ValueError:
        return 0


def stored_units(raw: str | None) -> dict[str, str]:
    """The units of the store's meta ``fom_units`` (JSON, name -> unit); a unit that is not
    a short printable string is left out, and so is all of a value that is not such a
    mapping (a unit is only ever shown)."""
    try:
        units = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    if not isinstance(units, dict):
        return {}
    return {str(k): u for k, u in units.items()
            if isinstance(u, str) and u.isprintable() and len(u) <= 20}

