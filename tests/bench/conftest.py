"""Fixtures of the bench tests: one Dask cluster shared by every dask test; ``cuda``-marked
tests skipped where no CUDA device is visible."""

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


def _cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the ``cuda`` tests cleanly on a machine without a CUDA device."""
    if not any(item.get_closest_marker("cuda") for item in items) or _cuda_devices():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run with -m cuda on a GPU machine)")
    for item in items:
        if item.get_closest_marker("cuda"):
            item.add_marker(skip)
