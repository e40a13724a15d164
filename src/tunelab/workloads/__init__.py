"""The built-in workloads: ``command``, ``qe``, ``merge``, ``ddp``, ``leopard`` (``replay`` lives in
:mod:`tunelab.replay`). Each is found by name through the entry-point group
``tunelab.workloads``, like a third-party plugin. The contract they implement and the
registry live in :mod:`tunelab.workload`; they are re-exported here for plugins.
"""

from __future__ import annotations

from tunelab.workload import (
    Command,
    Objective,
    RunContext,
    Workload,
    WorkloadOptions,
    available_workloads,
    get_workload,
)

__all__ = [
    "Command",
    "Objective",
    "RunContext",
    "Workload",
    "WorkloadOptions",
    "available_workloads",
    "get_workload",
]
