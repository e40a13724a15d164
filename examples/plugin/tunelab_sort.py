"""A third-party tunelab workload in one file: time Python's sort on n random numbers."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from tunelab.errors import ParseError
from tunelab.workloads import Command, Objective, RunContext, Workload, WorkloadOptions

PROGRAM = ("import random, sys, time; xs = [random.random() for _ in range(int(sys.argv[1]))]; "
           "t = time.perf_counter(); xs.sort(); print(f'sort_s={time.perf_counter() - t:.6f}')")


class SortOptions(WorkloadOptions):
    """Fixed options (``workload.options`` in a study file)."""

    python: str = sys.executable


class SortWorkload(Workload):
    """Sort n random floats; the figure of merit is the time the sort took."""

    name = "sort"
    description = "Python's list.sort on n random floats (a plugin example)"
    Options = SortOptions

    @property
    def objective(self) -> Objective:
        return Objective("sort_s", "minimize")

    def default_space(self) -> dict[str, Any]:
        return {"n": [10_000, 100_000]}

    def command(self, ctx: RunContext) -> Command:
        return Command((self.options.python, "-c", PROGRAM, str(ctx.values["n"])), {}, None)

    def parse(self, stdout: str, stderr: str, run_dir: Path) -> dict[str, float]:
        match = re.search(r"sort_s=([0-9.]+)", stdout)
        if match is None:
            raise ParseError("no sort_s=… line in the output")
        return {"sort_s": float(match.group(1))}
