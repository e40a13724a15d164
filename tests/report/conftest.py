"""Hand-built runs tables for the report tests (seeded numpy data, store layout)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from tunelab.workload import Objective

INJECTED = "<script>alert('x')</script>"


def key(**params: object) -> str:
    return json.dumps(params, sort_keys=True)


def make_runs(points: dict[str, tuple[float, int, list[str]]], seed: int = 0) -> pd.DataFrame:
    """``points``: env name -> (mean wall time, successful repeats, statuses of failures)."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, object]] = []
    for point_id, (env, (mean, n_ok, failures)) in enumerate(points.items()):
        values = list(rng.normal(mean, 0.02 * mean, n_ok)) + [math.nan] * len(failures)
        statuses = ["ok"] * n_ok + failures
        for repeat, (status, value) in enumerate(zip(statuses, values, strict=True)):
            rows.append(
                {
                    "run_id": len(rows) + 1,
                    "point_id": point_id,
                    "point": key(env=env, np=2),
                    "repeat": repeat,
                    "status": status,
                    "reason": None if status == "ok" else f"{status}: rank 1 said <boom> & died",
                    "rc": 0 if status == "ok" else 137,
                    "wall_s": value,
                    "started_at": "2026-11-22T03:00:00",
                    "ended_at": "2026-11-22T03:00:01",
                    "host": "node1",
                    "env": env,
                    "np": 2,
                    "fom.wall_s": value,
                }
            )
    return pd.DataFrame(rows)


class CountedReads(pd.DataFrame):
    """A runs table that counts the columns and row selections read from it (what a read
    returns is a plain DataFrame or Series, whose own reads are not counted): a reader that
    selects each point's rows from the whole table reads it once per point."""

    _metadata = ["reads"]

    def __getitem__(self, key: object) -> object:
        self.reads += 1
        return super().__getitem__(key)


def counted_reads(runs: pd.DataFrame) -> CountedReads:
    """``runs`` as a :class:`CountedReads` table with its count at 0."""
    counted = CountedReads(runs)
    counted.reads = 0
    return counted


@pytest.fixture
def runs() -> pd.DataFrame:
    return make_runs(
        {
            "baseline": (10.0, 6, []),
            "am": (7.0, 6, ["failed"]),
            "same": (10.0, 6, []),
            "slow": (13.0, 5, ["timeout"]),
            INJECTED: (11.5, 6, []),
            "broken": (10.0, 0, ["failed", "failed"]),
        }
    )


@pytest.fixture
def objective() -> Objective:
    return Objective("wall_s", "minimize")


@pytest.fixture
def baseline() -> str:
    """The baseline point's key."""
    return key(env="baseline", np=2)


@pytest.fixture
def injected() -> str:
    """A parameter value that must never reach a page as markup."""
    return INJECTED


@pytest.fixture
def runs_factory() -> Callable[..., pd.DataFrame]:
    return make_runs
