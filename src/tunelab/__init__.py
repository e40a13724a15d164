"""tunelab: run, tune and report performance experiments of HPC and AI workloads.

The public surface is a handful of nouns and factories, imported lazily so that
``tunelab --help`` stays instant::

    from tunelab import load_study, prepare_study, run_study, open_store
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "load_study": "tunelab.spec",
    "StudySpec": "tunelab.spec",
    "Point": "tunelab.space",
    "Space": "tunelab.space",
    "prepare_study": "tunelab.execute.study",
    "run_study": "tunelab.execute.runner",
    "open_store": "tunelab.store",
    "Workload": "tunelab.workload",
    "Command": "tunelab.workload",
    "Objective": "tunelab.workload",
    "RunContext": "tunelab.workload",
    "TunelabError": "tunelab.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tunelab' has no attribute {name!r}")
    return getattr(import_module(module), name)
