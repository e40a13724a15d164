"""The pure parts of the merge benchmark: metric formulas, data generation, hashing, options."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tunelab.bench.merge import data
from tunelab.bench.merge.config import MergeConfig, parse_fault
from tunelab.bench.merge.metrics import (
    WorkerIteration,
    data_processed_bytes,
    harmonic_mean,
    iteration_stats,
    per_iteration,
    summarize,
    throughput,
    worker_bandwidth,
)
from tunelab.errors import WorkloadError


def rec(rank: int, it: int, wall: float, tl: float, tr: float, bl: int, br: int,
        warmup: bool = False, rows: int = 0) -> WorkerIteration:
    return WorkerIteration(rank=rank, iteration=it, warmup=warmup, wall_s=wall,
                           exchange_left_s=tl, exchange_right_s=tr, bytes_sent_left=bl,
                           bytes_sent_right=br, bytes_recv=bl + br, merged_rows=rows)


def test_data_processed_is_two_tables_of_two_int64_columns() -> None:
    assert data_processed_bytes(1) == 32
    assert data_processed_bytes(1_000_000) == 32_000_000


def test_worker_bandwidth_and_edge_cases() -> None:
    assert worker_bandwidth(3000, 0.5) == 6000
    assert worker_bandwidth(0, 0.0) == 0.0
    assert worker_bandwidth(10, 0.0) == math.inf


def test_harmonic_mean_by_hand() -> None:
    assert harmonic_mean([2000.0, 6000.0]) == pytest.approx(3000.0)
    assert harmonic_mean([5.0]) == 5.0
    assert harmonic_mean([1.0, 0.0]) == 0.0
    assert harmonic_mean([4.0, math.inf]) == pytest.approx(8.0)
    with pytest.raises(ValueError):
        harmonic_mean([])


def test_throughput_formula() -> None:
    # 2 chunks x (2 tables x 2 columns x 8 bytes x 10 rows) / 0.1 s
    assert throughput(2, 10, 0.1) == pytest.approx(2 * 320 / 0.1)


def test_iteration_stats_by_hand() -> None:
    records = [
        rec(0, 0, wall=0.2, tl=0.25, tr=0.25, bl=600, br=400),    # 1000 B / 0.5 s = 2000
        rec(1, 0, wall=0.4, tl=0.1, tr=0.4, bl=1000, br=2000),   # 3000 B / 0.5 s = 6000
    ]
    s = iteration_stats(records, chunk_size=10)
    assert s.bandwidth == pytest.approx(3000.0)       # 2 / (1/2000 + 1/6000)
    assert s.bandwidth_min == 2000 and s.bandwidth_max == 6000
    assert s.bandwidth_median == pytest.approx(4000.0)
    assert s.wall_s == 0.4                             # the last worker to finish
    assert s.throughput == pytest.approx(2 * 320 / 0.4)
    assert s.bytes_sent == 4000
    # the slides' variant: mean of left- and right-phase bandwidths, then harmonic mean
    w0 = (600 / 0.25 + 400 / 0.25) / 2
    w1 = (1000 / 0.1 + 2000 / 0.4) / 2
    assert s.bandwidth_lr == pytest.approx(2 / (1 / w0 + 1 / w1))


def test_the_transfer_is_the_exchange_less_the_wait_for_the_peers() -> None:
    from dataclasses import replace

    from tunelab.bench.merge.config import MergeConfig
    from tunelab.bench.merge.report import fom_line

    records = [  # worker 0 waited 0.2 s of its 0.25 s left phase for worker 1 to arrive
        replace(rec(0, 0, wall=0.5, tl=0.25, tr=0.25, bl=600, br=400), sync_left_s=0.2,
                sync_right_s=0.05),
        replace(rec(1, 0, wall=0.5, tl=0.1, tr=0.4, bl=1000, br=2000), sync_left_s=0.0,
                sync_right_s=0.0),
    ]
    s = iteration_stats(records, chunk_size=10)
    assert s.bandwidth == pytest.approx(3000.0)                      # the seed's figure
    assert s.bandwidth_transfer == pytest.approx(2 / (0.25 / 1000 + 0.5 / 3000))
    assert s.sync_s == pytest.approx(0.25)
    summary = summarize([s], workers=2, chunk_size=10)
    line = json.loads(fom_line(MergeConfig(), summary))
    assert line["bandwidth_transfer"] == pytest.approx(s.bandwidth_transfer)
    untimed = iteration_stats([rec(0, 0, 0.5, 0.2, 0.2, 10, 10)], chunk_size=10)
    assert math.isnan(untimed.bandwidth_transfer)  # Dask: no count swap to time
    assert "bandwidth_transfer" not in json.loads(
        fom_line(MergeConfig(), summarize([untimed], workers=1, chunk_size=10)))


def test_summary_excludes_warmup_and_uses_sample_std() -> None:
    records = [rec(r, -1, 9.0, 1, 1, 1, 1, warmup=True) for r in range(2)]
    walls = [0.1, 0.2, 0.4]
    for it, wall in enumerate(walls):
        records += [rec(r, it, wall, 0.05, 0.05, 100, 100) for r in range(2)]
    stats = per_iteration(records, chunk_size=10)
    assert [s.iteration for s in stats] == [0, 1, 2]
    summary = summarize(stats, workers=2, chunk_size=10)
    tps = [2 * 320 / w for w in walls]
    assert summary.iterations == 3
    assert summary.throughput == pytest.approx(np.mean(tps))
    assert summary.throughput_std == pytest.approx(np.std(tps, ddof=1))
    assert summary.bandwidth == pytest.approx(200 / 0.1)
    assert summary.wall_s == pytest.approx(np.mean(walls))


def test_match_counts_rows_and_columns_sum_to_m() -> None:
    for workers, n, frac in [(2, 10, 0.3), (3, 7, 1.0), (4, 1000, 0.3), (5, 3, 0.5)]:
        m = data.match_counts(workers, n, frac)
        total = math.floor(frac * n)
        assert (m.sum(axis=0) == total).all() and (m.sum(axis=1) == total).all()
        assert data.expected_matches(workers, n, frac) == workers * total


@pytest.mark.parametrize(("workers", "n", "frac"), [(2, 50, 0.3), (3, 17, 1.0), (4, 40, 0.0)])
def test_generated_chunks_match_exactly_the_expected_keys(workers: int, n: int,
                                                          frac: float) -> None:
    lefts = [data.left_chunk(r, workers, n, 7)[0] for r in range(workers)]
    rights = [data.right_chunk(r, workers, n, frac, 7)[0] for r in range(workers)]
    left_keys = np.concatenate(lefts)
    right_keys = np.concatenate(rights)
    assert len(np.unique(left_keys)) == workers * n
    assert len(np.unique(right_keys)) == workers * n         # no key drawn twice
    assert all(len(r) == n for r in rights)
    assert np.isin(right_keys, left_keys).sum() == data.expected_matches(workers, n, frac)
    # every worker's right chunk holds keys of every worker's range (when any match)
    if frac == 1.0:
        for r in rights:
            assert set(np.unique(r // n)) == set(range(workers))


def test_partition_ids_match_an_independent_python_hash() -> None:
    keys = np.array([0, 1, 2, 12345, 2**40 + 17, 999_999], dtype=np.int64)
    for workers in (2, 3, 7):
        want = [((int(k) * 0x9E3779B97F4A7C15) % 2**64 >> 32) % workers for k in keys]
        assert data.partition_ids(keys, workers).tolist() == want


def test_partition_spreads_keys_over_workers() -> None:
    counts = np.bincount(data.partition_ids(np.arange(100_000, dtype=np.int64), 4), minlength=4)
    assert counts.min() > 24_000


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"chunk_size": 0}, "--chunk-size must be a positive"),
    ({"chunk_size": -5}, "got -5"),
    ({"workers": 1}, "--workers must be at least 2"),
    ({"transport": "carrier-pigeon"}, "--transport: unknown value 'carrier-pigeon'"),
    ({"backend": "polars"}, "--backend: unknown value 'polars'; choose one of pandas, cudf"),
    ({"mpi_pml": "cm"}, "--mpi-pml"),
    ({"frac_match": 1.5}, "--frac-match"),
    ({"iterations": 0}, "--iterations"),
])
def test_bad_options_are_one_line_errors(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(WorkloadError, match=None) as err:
        MergeConfig(**kwargs).validate()  # type: ignore[arg-type]
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_fault_parsing_and_config_round_trip() -> None:
    fault = parse_fault("rank=1,phase=exchange-right,iteration=2,action=hang")
    assert fault is not None
    assert (fault.rank, fault.phase, fault.iteration) == (1, "exchange-right", 2)
    cfg = MergeConfig(workers=3, fault=fault, mpi_args=("-x", "UCX_TLS")).validate()
    assert MergeConfig.from_dict(cfg.to_dict()) == cfg
    for bad in ("rank=x", "rank=0,phase=nowhere", "rank=0,action=explode", "nonsense"):
        with pytest.raises(WorkloadError):
            parse_fault(bad)
    with pytest.raises(WorkloadError, match="not a worker"):
        MergeConfig(workers=2, fault=parse_fault("rank=5")).validate()


def test_full_verification_threshold() -> None:
    assert MergeConfig(workers=4, chunk_size=250_000).full_verify
    assert not MergeConfig(workers=4, chunk_size=250_001).full_verify
    assert MergeConfig(workers=4, chunk_size=10**7, verify="full").full_verify
    assert not MergeConfig(workers=2, chunk_size=10, verify="count").full_verify
