"""Quantum ESPRESSO pw.x workload: input staging, command, output parser, job scripts, plots.

Only :class:`QEWorkload` is imported eagerly; :mod:`.plots` imports matplotlib when called.
"""

from __future__ import annotations

from tunelab.workloads.qe.options import QEOptions
from tunelab.workloads.qe.workload import QEWorkload, pw_rules

__all__ = ["QEOptions", "QEWorkload", "pw_rules"]
