"""The link probe over real mpirun and mpi4py (tiny sizes): one way, both ways and
all-to-all, through ob1 and the UCX PML; its argument errors; the stacks' variables."""

from __future__ import annotations

import shutil

import pytest

from tunelab.bounds.link import link_rates, stack_env
from tunelab.bounds.linkprobe import (
    CACHE_MULTIPLE,
    MAX_SETS,
    _iterations,
    buffer_sets,
    default_working_set,
    last_level_cache,
    main,
)
from tunelab.errors import TunelabError


def test_stacks_select_the_pml_as_the_merge_benchmark_does():
    assert stack_env("mpi-ob1") == {"OMPI_MCA_pml": "ob1"}
    assert stack_env("mpi-ucx") == {"OMPI_MCA_pml": "ucx", "OMPI_MCA_pml_ucx_tls": "any",
                                    "OMPI_MCA_pml_ucx_devices": "any"}
    assert stack_env("tcp") == {}
    with pytest.raises(TunelabError, match="unknown link stack 'infiniband'"):
        stack_env("infiniband")


def test_tcp_probe_measures_every_pattern_over_sockets():
    run = link_rates("tcp", patterns=["oneway", "bothways", "alltoall"], sizes=[4096, 65536],
                     ranks=3, repeats=2, block_bytes=1 << 19)
    got = {(r.pattern, r.message_bytes): r for r in run.results}
    assert set(got) == {(p, s) for p in ("oneway", "bothways", "alltoall")
                        for s in (4096, 65536)}
    assert all(len(r.samples) == 2 and min(r.samples) > 0 and r.ranks == 3
               for r in run.results)
    assert "tunelab.bounds.tcpprobe" in run.argv


def test_tcp_probe_failure_is_one_line():
    with pytest.raises(TunelabError, match="the tcp link probe failed") as info:
        link_rates("tcp", patterns=["oneway"], sizes=[-5], ranks=2, repeats=1)
    assert "\n" not in str(info.value)


def test_probe_refuses_an_unknown_pattern(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as info:
        main(["--patterns", "oneway,sideways"])
    assert info.value.code == 2 and "unknown pattern 'sideways'" in capsys.readouterr().err
    assert _iterations(1 << 20, 64 << 20) == 64 and _iterations(1 << 30, 1) == 3


def test_receive_buffers_cycle_through_more_than_the_cache():
    """A workload receives into memory it has not touched lately: the probe's receive sets
    with its send buffer hold four last-level caches (a quarter of the memory available
    shared by the ranks of a host at the most), so a reused buffer is long out of cache."""
    llc = last_level_cache()
    assert llc >= 1 << 20
    ws = default_working_set(2)
    assert ws <= CACHE_MULTIPLE * llc and ws > 0
    for size, ranks in ((4 << 20, 2), (1 << 20, 3), (65536, 8)):
        sets = buffer_sets(size, ranks, ws)
        held = size * (1 + sets * (ranks - 1))
        assert held >= ws or sets == MAX_SETS
        assert size * (1 + (sets - 1) * (ranks - 1)) < ws  # no set more than needed
    assert buffer_sets(1 << 30, 2, ws) == 1  # one message beyond the working set: one set
    assert buffer_sets(16, 2, ws) == MAX_SETS
    assert default_working_set(10**9) < ws  # many ranks on one host share the memory


needs_mpi = pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun")


@pytest.mark.slow
@needs_mpi
@pytest.mark.parametrize("stack", ["mpi-ob1", "mpi-ucx"])
def test_probe_measures_every_pattern_and_size(stack: str):
    pytest.importorskip("mpi4py")
    run = link_rates(stack, patterns=["oneway", "bothways", "alltoall"],
                     sizes=[4096, 65536], ranks=2, repeats=2, block_bytes=1 << 20)
    got = {(r.pattern, r.message_bytes): r for r in run.results}
    assert set(got) == {(p, s) for p in ("oneway", "bothways", "alltoall")
                        for s in (4096, 65536)}
    assert all(len(r.samples) == 2 and min(r.samples) > 0 and r.ranks == 2
               for r in run.results)
    assert run.nodes == 1 and "tunelab.bounds.linkprobe" in run.argv


@pytest.mark.slow
@needs_mpi
def test_three_ranks_all_to_all():
    pytest.importorskip("mpi4py")
    run = link_rates("mpi-ob1", patterns=["alltoall", "bothways"], sizes=[8192], ranks=3,
                     repeats=1, block_bytes=1 << 18)
    assert [r.ranks for r in run.results] == [3, 3]
    assert all(r.samples[0] > 0 for r in run.results)
