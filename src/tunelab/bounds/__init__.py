"""The machine's limits, measured, kept and joined to studies (``tunelab bounds``).

* :mod:`~tunelab.bounds.profile` — :class:`Bound` and :class:`Profile`, kept per machine
  (the sysinfo fingerprint) in ``$TUNELAB_BOUNDS_DIR`` or ``~/.cache/tunelab/bounds``;
* :mod:`~tunelab.bounds.compute` — GEMM FLOP/s per precision, the memory triad;
* :mod:`~tunelab.bounds.link` and :mod:`~tunelab.bounds.linkprobe` — bytes/s between ranks
  (one way, both ways, all-to-all) over the MPI stack a workload uses;
* :mod:`~tunelab.bounds.disk` — a directory's read rate, cold and warm;
* :mod:`~tunelab.bounds.measure` — the quick or thorough plan and the run that fills a profile;
* :mod:`~tunelab.bounds.match` — which bound a run's :class:`~tunelab.workload.Work` is
  judged against, and the fraction of it reached.

Names are imported on first use, so the link probe (run under ``mpirun``) starts light.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = ["Bound", "Match", "Plan", "Profile", "bound_label", "find_bound", "headroom_word",
           "load_profile", "make_plan", "measure", "profile_dir", "save_profile"]

_HOME = {"Bound": "profile", "Profile": "profile", "load_profile": "profile",
         "save_profile": "profile", "profile_dir": "profile", "Match": "match",
         "find_bound": "match", "bound_label": "match", "headroom_word": "match",
         "Plan": "measure", "make_plan": "measure", "measure": "measure"}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(import_module(f"tunelab.bounds.{_HOME[name]}"), name)
    raise AttributeError(f"module 'tunelab.bounds' has no attribute {name!r}")
