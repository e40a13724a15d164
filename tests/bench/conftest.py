"""Fixtures of the bench tests: one Dask cluster shared by every dask test."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def dask_scheduler() -> Any:
    """One local Dask cluster (2 worker processes) shared by every dask test."""
    pytest.importorskip("distributed")
    from distributed import LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           host="127.0.0.1", dashboard_address=None)
    try:
        yield cluster.scheduler_address
    finally:
        cluster.close()
