"""The search benchmark's small-space kind: spaces drawn apart, and the table it prints."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

search_efficiency = pytest.importorskip("search_efficiency")
search_landscapes = pytest.importorskip("search_landscapes")


@pytest.mark.parametrize("k", range(8))
def test_a_small_space_of_the_kind_has_one_best_within_reach_of_few(k):
    landscape = search_landscapes.generated(f"kind{k}")
    means = landscape.means()
    assert 6 <= len(means) <= 12
    near = sum(landscape.within(p, 0.05) for p in means)
    assert 1 <= near <= 3  # the best, maybe a close second, rarely a runner-up drawn near


def test_the_kind_table_has_one_line_per_space_and_the_means(capsys):
    search_efficiency.main(["--kind", "2", "--seeds", "2", "--jobs", "1",
                            "--fractions", "0.4", "--only", "auto, worst"])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("| kind") or
             line.startswith("| mean")]
    assert [line.split("|")[1].strip() for line in lines] == ["kind0", "kind1", "mean"]
    assert all(len(line.split("|")) == 7 for line in lines)  # name, points, near, P, oracle
