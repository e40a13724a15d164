"""Workload registry: built-in and third-party workloads, found by name.

Workloads register through the entry-point group ``tunelab.workloads`` (``name =
"package.module:Class"``). A plugin that fails to import is skipped with a warning and listed
with the reason by ``tunelab workloads``; asking for it by name raises that reason.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

from tunelab.errors import WorkloadError
from tunelab.workloads.base import Command, Objective, RunContext, Workload, WorkloadOptions

__all__ = [
    "Command",
    "Objective",
    "RunContext",
    "Workload",
    "WorkloadOptions",
    "available_workloads",
    "get_workload",
]

_log = logging.getLogger(__name__)
ENTRY_POINT_GROUP = "tunelab.workloads"


def available_workloads() -> dict[str, type[Workload] | str]:
    """Every registered workload: name -> class, or name -> reason it failed to load."""
    found: dict[str, type[Workload] | str] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            cls = ep.load()
        except Exception as exc:  # a broken plugin must not break tunelab
            _log.warning("workload %r could not be loaded: %s", ep.name, exc)
            found[ep.name] = f"failed to load {ep.value}: {exc}"
            continue
        if not (isinstance(cls, type) and issubclass(cls, Workload)):
            found[ep.name] = f"{ep.value} is not a tunelab Workload subclass"
            continue
        found[ep.name] = cls
    return dict(sorted(found.items()))


def get_workload(name: str) -> type[Workload]:
    """The workload class registered as ``name``; a clear error naming the valid ones."""
    registry = available_workloads()
    entry = registry.get(name)
    if entry is None:
        valid = ", ".join(registry) or "none"
        raise WorkloadError(f"unknown workload {name!r}; installed workloads: {valid}")
    if isinstance(entry, str):
        raise WorkloadError(f"workload {name!r} is installed but unusable: {entry}")
    return entry
