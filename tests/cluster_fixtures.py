"""Pytest fixtures for virtual nodes and the virtual Slurm cluster (registered by
``tests/conftest.py``; usable from every test directory).

* ``virtual_cluster`` (session): 2 virtual nodes with Slurm on them, started once per test
  session, torn down at its end; a second partition ``restricted`` admits only account
  ``proj1``; the partitions' time limit is one hour. Skips with the reason when the machine
  cannot run it (not root, Slurm not installed).
* ``slurm_env``: ``SLURM_CONF`` of that cluster set in this test's environment.
* ``slurm_installed``: for a test that starts its own cluster: skips, with the same reason,
  where one cannot run.
* ``vnodes_factory``: makes sets of virtual nodes (``factory(n, rate=None)``) and tears every
  one down after the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tunelab.cluster.slurm import PartitionLimits, VirtualCluster, slurm_unavailable_reason
from tunelab.cluster.vnodes import VirtualNodes, allocate, unavailable_reason


def _skip_without_slurm() -> None:
    reason = slurm_unavailable_reason()
    if reason is not None:
        pytest.skip(f"virtual Slurm cluster unavailable: {reason}")


@pytest.fixture(scope="session")
def virtual_cluster() -> Iterator[VirtualCluster]:
    """A 2-node virtual Slurm cluster for the whole session."""
    _skip_without_slurm()
    cluster = VirtualCluster.start(
        2, limits=PartitionLimits(max_time="1:00:00", allow_accounts=("proj1",)),
        slurmd_timeout_s=10)
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def slurm_installed() -> None:
    """Nothing, where a virtual Slurm cluster can run; else the test is skipped."""
    _skip_without_slurm()


@pytest.fixture
def slurm_env(virtual_cluster: VirtualCluster,
              monkeypatch: pytest.MonkeyPatch) -> VirtualCluster:
    """The session's virtual cluster, with ``SLURM_CONF`` set for this test."""
    for key, value in virtual_cluster.env.items():
        monkeypatch.setenv(key, value)
    return virtual_cluster


@pytest.fixture
def vnodes_factory() -> Iterator[Callable[..., VirtualNodes]]:
    """Make virtual-node sets inside a test; all are torn down after it."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"virtual nodes unavailable: {reason}")
    made: list[VirtualNodes] = []

    def make(n: int, rate: str | None = None) -> VirtualNodes:
        vn = allocate(n, rate=rate)
        made.append(vn)
        return vn

    try:
        yield make
    finally:
        for vn in made:
            vn.down()
