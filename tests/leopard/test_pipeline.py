"""The parallel prediction pipeline on a CPU: reader processes, writer threads and sections
give the serial pipeline's bytes; errors of a worker reach the caller in one line; nothing
is left behind."""

from __future__ import annotations

import multiprocessing
import os
import threading
from pathlib import Path

import numpy as np
import pyBigWig
import pytest
import torch

from tunelab.leopard.bigwig import ITEMS_PER_BLOCK, TASK_BLOCKS, BigWigWriter
from tunelab.leopard.data import load_chromosomes, load_manifest
from tunelab.leopard.errors import LeopardError
from tunelab.leopard.model import LeopardUNet
from tunelab.leopard.predict import (
    pipeline_workers,
    predict_chromosome,
    predict_genome,
)
from tunelab.leopard.readers import Region, Tracks, read_regions, region_reader, start_reading
from tunelab.leopard.tiling import Tiling, plan_sections


def _checkpoint(path: Path, channels: int = 5) -> LeopardUNet:
    torch.manual_seed(0)
    model = LeopardUNet(in_channels=channels, base_filters=4, depth=3).eval()
    torch.save({"arch": model.arch.to_dict(), "window": 512, "model": model.state_dict()},
               path)
    return model


def _shm_files() -> set[str]:
    return {p for p in os.listdir("/dev/shm") if p.startswith("tunelab-leopard-")} \
        if os.path.isdir("/dev/shm") else set()


def test_bigwig_bytes_do_not_depend_on_the_writer_threads(tmp_path: Path) -> None:
    """Tasks of TASK_BLOCKS blocks compressed by a pool, written in order: the same file
    as one thread writes (values rounded by the writer, a gap, several chromosomes)."""
    rng = np.random.default_rng(5)
    n = 2 * TASK_BLOCKS * ITEMS_PER_BLOCK + 12_345
    sizes = [("chr1", n), ("chr2", 70_000)]
    pieces = [("chr1", 0, rng.random(n // 3)), ("chr1", n // 3, rng.random(n - n // 3)),
              ("chr2", 0, rng.random(30_000).astype(np.float32)),
              ("chr2", 40_000, rng.random(30_000).astype(np.float32))]
    files = []
    for threads in (0, 1, 3):
        path = tmp_path / f"t{threads}.bw"
        w = BigWigWriter(path, sizes, digits=4, threads=threads)
        for chrom, start, values in pieces:
            w.add(chrom, start, values)
        w.close()
        files.append(path.read_bytes())
    assert files[0] == files[1] == files[2]
    bw = pyBigWig.open(str(tmp_path / "t3.bw"))
    got = bw.values("chr1", 0, n, numpy=True)
    want = np.round(np.concatenate([pieces[0][2], pieces[1][2]]), 4).astype(np.float32)
    assert np.array_equal(got, want)
    assert np.isnan(bw.values("chr2", 30_000, 40_000, numpy=True)).all()
    bw.close()


@pytest.mark.parametrize("workers", [1, 2], ids=["thread", "processes"])
def test_readers_read_what_this_process_reads(synth: Path, workers: int) -> None:
    m = load_manifest(synth)
    tracks = Tracks(m.fasta, m.dnase, m.dnase_avg)
    regions = [Region("chr2", 0, 16_000), Region("chr3", 100, 5_100, "tag"),
               Region("chr1", 7_000, 7_001), Region("chr4", 15_000, 16_000)]
    serial = [(r.region, tuple(a.copy() for a in r.arrays if a is not None))
              for r in read_regions(tracks, regions)]
    before = threading.active_count()
    parallel = []
    for r in read_regions(tracks, regions, workers=workers, longest=16_000):
        parallel.append((r.region, tuple(a.copy() for a in r.arrays if a is not None)))
        r.release()
    assert [r for r, _ in parallel] == regions  # in order, tags kept
    for (_, want), (_, got) in zip(serial, parallel, strict=True):
        assert len(want) == len(got) == 3
        for a, b in zip(want, got, strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b)
    cs = load_chromosomes(m, ["chr3"], need_avg=True)
    seq, dn, diff = serial[1][1]
    assert np.array_equal(seq, cs.seq[100:5_100]) and np.array_equal(dn, cs.dnase[100:5_100])
    assert np.allclose(diff, cs.dnase[100:5_100] - cs.dnase_avg[100:5_100])
    assert threading.active_count() == before and not _shm_files()


def test_started_readers_spawn_at_once_and_close_unasked(synth: Path) -> None:
    """start_reading spawns its processes and hands them the first regions before any is
    asked for (prediction on a GPU reads meanwhile); iterated, it reads what read_regions
    reads; closed without being iterated, it leaves no process or slot behind."""
    m = load_manifest(synth)
    tracks = Tracks(m.fasta, m.dnase)
    regions = [Region("chr1", a, a + 2_000) for a in range(0, 10_000, 2_000)]
    want = [tuple(a.copy() for a in r.arrays if a is not None)
            for r in read_regions(tracks, regions)]
    before = set(multiprocessing.active_children())
    reads = start_reading(tracks, regions, workers=2, longest=2_000)
    try:
        assert len(set(multiprocessing.active_children()) - before) == 2
        got = []
        for r in reads:
            got.append(tuple(a.copy() for a in r.arrays if a is not None))
            r.release()
    finally:
        reads.close()
    assert len(got) == len(want) == 5
    for w, g in zip(want, got, strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(w, g, strict=True))
    unasked = start_reading(tracks, regions, workers=2, longest=2_000)
    assert len(set(multiprocessing.active_children()) - before) == 2
    unasked.close()
    unasked.close()  # (idempotent)
    assert not set(multiprocessing.active_children()) - before and not _shm_files()
    assert next(unasked, None) is None


def test_a_worker_error_is_one_line_and_nothing_is_left(synth: Path, tmp_path: Path) -> None:
    bad = tmp_path / "nan.bw"
    bw = pyBigWig.open(str(bad), "w")
    bw.addHeader([("chr1", 16_000)])
    bw.addEntries("chr1", 0, values=[1.0] * 100 + [float("nan")] + [1.0] * 99, span=1, step=1)
    bw.close()
    m = load_manifest(synth)
    before = threading.active_count()
    regions = [Region("chr1", a, a + 1_000) for a in range(0, 8_000, 1_000)]
    with pytest.raises(LeopardError, match=r"nan\.bw: NaN or infinite value .* 'chr1'"):
        for r in read_regions(Tracks(m.fasta, bad), regions, workers=2, longest=1_000):
            r.release()
    assert threading.active_count() == before and not _shm_files()


def test_sections_predict_what_one_pass_predicts() -> None:
    """Windows across a section boundary are predicted for both sections: the values equal
    those of one pass over the chromosome, for any section length (stride < kept part
    too)."""
    rng = np.random.default_rng(2)
    n = 5_000
    seq = rng.integers(0, 5, n).astype(np.uint8)
    dnase = rng.gamma(1.0, 1.0, n).astype(np.float32)
    torch.manual_seed(0)
    model = LeopardUNet(base_filters=4, depth=3).eval()
    for stride in (None, 100):
        whole = predict_chromosome(model, seq, dnase, None, 256, batch_size=4, edge=32,
                                   stride=stride, section_bp=10 * n)
        for section in (97, 257, 999):
            cut = predict_chromosome(model, seq, dnase, None, 256, batch_size=4, edge=32,
                                     stride=stride, section_bp=section)
            assert np.allclose(cut, whole, rtol=0, atol=1e-6), (stride, section)
    t = Tiling.make(256, 32)
    secs = plan_sections(t, "c", n, 999)
    assert [(s.lo, s.hi) for s in secs][:2] == [(0, 999), (999, 1998)] and secs[-1].hi == n
    short = plan_sections(t, "c", 100, 999)  # shorter than a window: one, padded
    assert len(short) == 1 and short[0].region(256).end == 100


@pytest.mark.parametrize("suffix", [".bw", ".bedGraph"])
def test_parallel_pipeline_writes_the_serial_pipelines_file(synth: Path, tmp_path: Path,
                                                            suffix: str) -> None:
    """Reader processes, writer threads and a background writer against everything in
    turn: the same file, byte for byte, readable by pyBigWig."""
    _checkpoint(tmp_path / "m.pt", channels=6)
    common = {"device": "cpu", "precision": "fp32", "compile": "off", "batch_size": 3,
              "section_bp": 5_000}
    before = threading.active_count()
    a = predict_genome(tmp_path / "m.pt", synth, tmp_path / f"serial{suffix}",
                       ["chr4", "chr2"], readers=0, writers=0, **common)
    b = predict_genome(tmp_path / "m.pt", synth, tmp_path / f"parallel{suffix}",
                       ["chr4", "chr2"], readers=2, writers=2, **common)
    assert (a["readers"], a["writers"], b["readers"], b["writers"]) == (0, 0, 2, 2)
    assert a["sections"] == b["sections"] == 8 and a["bp"] == b["bp"] == 32_000
    assert (tmp_path / f"serial{suffix}").read_bytes() == \
        (tmp_path / f"parallel{suffix}").read_bytes()
    assert threading.active_count() == before and not _shm_files()
    if suffix == ".bw":
        bw = pyBigWig.open(str(tmp_path / "parallel.bw"))
        assert list(bw.chroms()) == ["chr4", "chr2"]
        v = bw.values("chr2", 0, 16_000, numpy=True)
        assert np.isfinite(v).all() and ((v > 0) & (v < 1)).all()
        bw.close()


def test_readers_started_before_the_runtime_choice_write_the_same_file(
        synth: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a GPU does (forced here on the CPU): the reader processes are running when the
    runtime is being chosen, and the file is byte for byte the one of the usual order; a
    failing runtime choice leaves no reader behind."""
    from tunelab.leopard import predict as predict_module
    from tunelab.leopard import runtime

    _checkpoint(tmp_path / "m.pt")
    common = {"device": "cpu", "precision": "fp32", "compile": "off", "batch_size": 3,
              "section_bp": 5_000, "readers": 2, "writers": 1}
    real_prepare = runtime.prepare
    readers_at_choice: list[int] = []

    def prepare(*args: object, **kwargs: object) -> runtime.Engine:
        readers_at_choice.append(len(multiprocessing.active_children()))
        return real_prepare(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runtime, "prepare", prepare)
    before = threading.active_count()
    children = len(multiprocessing.active_children())
    usual = predict_genome(tmp_path / "m.pt", synth, tmp_path / "usual.bw", ["chr4", "chr2"],
                           **common)
    monkeypatch.setattr(predict_module, "read_during_runtime_choice", lambda _: True)
    early = predict_genome(tmp_path / "m.pt", synth, tmp_path / "early.bw", ["chr4", "chr2"],
                           **common)
    assert readers_at_choice == [children, children + 2]
    assert early["readers"] == usual["readers"] == 2
    assert (tmp_path / "early.bw").read_bytes() == (tmp_path / "usual.bw").read_bytes()
    assert set(early["phases"]) == set(usual["phases"])
    assert early["wall_s"] == pytest.approx(sum(v for k, v in early["phases"].items()
                                                 if not k.endswith("wait_s")), rel=1e-6)

    def failing(*args: object, **kwargs: object) -> runtime.Engine:
        raise LeopardError("precision: unknown value 'fp8'")

    monkeypatch.setattr(runtime, "prepare", failing)
    with pytest.raises(LeopardError, match="fp8"):
        predict_genome(tmp_path / "m.pt", synth, tmp_path / "never.bw", ["chr4"], **common)
    assert len(multiprocessing.active_children()) == children and not _shm_files()
    assert threading.active_count() == before and not (tmp_path / "never.bw").exists()


def test_pipeline_workers_share_the_free_cores() -> None:
    assert pipeline_workers("cpu", 2, 2, None, None) == (0, 0, False)  # in turn
    assert pipeline_workers("cpu", 4, 2, None, None) == (1, 1, True)
    assert pipeline_workers("cuda", 16, 16, None, None) == (8, 7, True)
    assert pipeline_workers("cpu", 2, 2, 2, 1) == (2, 1, True)
    with pytest.raises(LeopardError, match="readers and writers must be >= 0"):
        pipeline_workers("cpu", 2, 2, -1, None)


def test_training_data_loaded_by_reader_processes_equals_the_serial_load(
        synth: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chromosomes cut into regions (chunk boundaries inside chromosomes), read by two
    processes, the average track as it is: the same arrays as reading here."""
    from tunelab.leopard import data

    monkeypatch.setattr(data, "LOAD_CHUNK", 5_000)
    m = load_manifest(synth)
    chroms = ["chr2", "chr1", "chr3"]
    serial = load_chromosomes(m, chroms, need_avg=True)
    reader = region_reader(Tracks(m.fasta, m.dnase, m.dnase_avg, difference=False), 2)
    parallel = load_chromosomes(m, chroms, need_avg=True, reader=reader)
    for name in ("lengths", "offsets", "seq", "dnase", "dnase_avg", "label"):
        a, b = getattr(serial, name), getattr(parallel, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert not _shm_files()
