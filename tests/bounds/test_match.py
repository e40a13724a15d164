"""Which bound a run's work is judged against: what must agree, what is matched to the
nearest measured value (and said so)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunelab.bounds.match import bound_label, find_bound, headroom_word
from tunelab.bounds.profile import Bound, Profile
from tunelab.workload import Work

MiB = 1 << 20


def link(stack: str, pattern: str, size: int, value: float, ranks: int = 2) -> Bound:
    return Bound("link", {"stack": stack, "pattern": pattern, "ranks": ranks, "nodes": 1,
                          "message_bytes": size}, value)


@pytest.fixture
def profile(tmp_path: Path) -> Profile:
    (tmp_path / "data").mkdir()
    return Profile("abc", {}, "now", (
        Bound("gemm", {"precision": "fp32", "device": "cpu", "threads": 1}, 20e9),
        Bound("gemm", {"precision": "fp32", "device": "cpu", "threads": 2}, 40e9),
        Bound("gemm", {"precision": "bf16", "device": "cpu", "threads": 2}, 80e9),
        link("mpi-ucx", "alltoall", MiB, 1e9), link("mpi-ucx", "alltoall", 4 * MiB, 2e9),
        link("mpi-ucx", "oneway", 4 * MiB, 4e9), link("mpi-ob1", "alltoall", 4 * MiB, 3e9),
        Bound("storage", {"directory": str(tmp_path), "cache": "cold"}, 5e8),
        Bound("storage", {"directory": str(tmp_path), "cache": "warm"}, 5e9),
    ))


def test_gemm_work_meets_the_bound_of_its_precision_and_threads(profile: Profile):
    m = find_bound(profile, Work("gemm", 10e9, {"precision": "bf16", "threads": 2}))
    assert m is not None and m.bound.value == 80e9 and m.fraction == pytest.approx(0.125)
    assert m.approx == ()
    one = find_bound(profile, Work("gemm", 10e9, {"precision": "fp32", "threads": 1}))
    assert one is not None and one.fraction == pytest.approx(0.5)
    # 4 threads were never measured: the nearest count stands in, and the match says so
    four = find_bound(profile, Work("gemm", 10e9, {"precision": "fp32", "threads": 4}))
    assert four is not None and four.bound.variant["threads"] == 2
    assert four.approx == ("threads 2 (measured) for 4",)
    assert find_bound(profile, Work("gemm", 1e9, {"precision": "fp16"})) is None


def test_link_work_needs_its_stack_and_pattern_and_takes_the_nearest_size(profile: Profile):
    m = find_bound(profile, Work("link", 1.5e9, {"stack": "mpi-ucx", "pattern": "alltoall",
                                                 "ranks": 2, "message_bytes": 4_000_000}))
    assert m is not None and m.bound.variant["message_bytes"] == 4 * MiB
    assert m.fraction == pytest.approx(0.75)
    assert m.approx == ("message_bytes 4.00 MiB (measured) for 3.81 MiB",)
    small = find_bound(profile, Work("link", 0.5e9, {"stack": "mpi-ucx", "ranks": 2,
                                                     "message_bytes": 900_000}))
    assert small is not None and small.bound.value == 1e9  # pattern defaults to alltoall
    assert find_bound(profile, Work("link", 1e9, {"stack": "tcp", "ranks": 2})) is None
    assert find_bound(profile, Work("link", 1e9, {"stack": "mpi-ob1", "pattern": "oneway"})) \
        is None


def test_storage_work_finds_the_bound_of_its_directory_or_its_parent(profile: Profile,
                                                                      tmp_path: Path):
    same = find_bound(profile, Work("storage", 2.5e8, {"directory": str(tmp_path)}))
    assert same is not None and same.fraction == pytest.approx(0.5) and same.approx == ()
    below = find_bound(profile, Work("storage", 1e9, {"directory": str(tmp_path / "data"),
                                                      "cache": "warm"}))
    assert below is not None and below.bound.value == 5e9 and below.approx
    assert find_bound(profile, Work("storage", 1.0, {"directory": "/proc/self"})) is None


def test_a_rate_that_is_not_a_number_is_not_judged(profile: Profile):
    assert find_bound(profile, Work("gemm", float("nan"), {"precision": "fp32"})) is None


def test_words():
    assert headroom_word(0.92) == "little room left"
    assert headroom_word(0.6) == "some room left"
    assert headroom_word(0.17) == "room to gain"
    assert headroom_word(1.4).startswith("above the measured limit")
    assert bound_label(link("mpi-ucx", "alltoall", 4 * MiB, 1.0)) == \
        "link mpi-ucx all-to-all, 2 ranks, 4.00 MiB"
    assert bound_label(Bound("gemm", {"precision": "bf16", "threads": 8}, 1.0)) == \
        "bf16 GEMM, 8 threads"


def test_a_message_size_far_from_every_measured_one_has_no_link_bound(profile: Profile):
    """The merge with 10,000-row chunks exchanges 39 KiB messages; a quick profile measures
    1 and 4 MiB. Judged against the 1 MiB bound it sat at 0.06 ('room to gain') where
    latency, not bandwidth, sets the rate: more than 4x from every measured size, no bound."""
    def work(size: int) -> Work:
        return Work("link", 5e7, {"stack": "mpi-ucx", "pattern": "alltoall", "ranks": 2,
                                  "message_bytes": size})

    assert find_bound(profile, work(40_000)) is None
    assert find_bound(profile, work(64 * MiB)) is None
    near = find_bound(profile, work(400_000))  # 2.6x below 1 MiB: still stands for it
    assert near is not None and near.bound.value == 1e9 and near.approx
