"""tunelab's bigWig writer, read back by pyBigWig (libBigWig), an independent reader."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pyBigWig
import pytest

from tunelab.leopard.bigwig import ITEMS_PER_BLOCK, BigWigWriter
from tunelab.leopard.errors import LeopardError
from tunelab.leopard.tracks import TrackWriter


def _values(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.round(rng.random(n), 4).astype(np.float32)


def test_values_intervals_and_summary_read_back(tmp_path: Path) -> None:
    """Chromosomes in non-sorted name order, values in uneven pieces with a gap, blocks
    spanning piece boundaries, enough blocks for a two-level index."""
    rng = np.random.default_rng(0)
    sizes = [("chr2", 300 * ITEMS_PER_BLOCK + 5), ("chr10", 70_001), ("chrM", 17)]
    want = {c: _values(rng, n) for c, n in sizes}
    gap = (1_000, 1_900)  # on chr10, never added: no value there
    w = BigWigWriter(tmp_path / "t.bw", sizes)
    for chrom, n in sizes:
        pos = 0
        while pos < n:
            end = min(n, pos + int(rng.integers(1, 3 * ITEMS_PER_BLOCK)))
            if chrom == "chr10" and pos < gap[1] and end > gap[0]:
                w.add(chrom, pos, want[chrom][pos:gap[0]])
                pos = gap[1]
                continue
            w.add(chrom, pos, want[chrom][pos:end])
            pos = end
    w.close()

    bw = pyBigWig.open(str(tmp_path / "t.bw"))
    assert bw.chroms() == dict(sizes)
    for chrom, n in sizes:
        got = bw.values(chrom, 0, n, numpy=True)
        expect = want[chrom].copy()
        if chrom == "chr10":
            expect[gap[0]:gap[1]] = np.nan
        assert np.array_equal(got, expect, equal_nan=True), chrom
        for _ in range(10):  # queries through the index, not only whole chromosomes
            a = int(rng.integers(0, n))
            b = int(rng.integers(a + 1, n + 1))
            assert np.array_equal(bw.values(chrom, a, b, numpy=True), expect[a:b],
                                  equal_nan=True)
    first = bw.intervals("chrM")
    assert first[0] == (0, 1, pytest.approx(float(want["chrM"][0])))
    covered = np.concatenate([want["chr2"], want["chr10"][:gap[0]], want["chr10"][gap[1]:],
                              want["chrM"]]).astype(np.float64)
    h = bw.header()  # (pyBigWig gives the summary's sums as integers)
    assert h["nBasesCovered"] == len(covered) and h["nLevels"] == 0
    assert h["sumData"] == int(covered.sum())
    raw = (tmp_path / "t.bw").read_bytes()  # the total summary, at the header's offset
    count, lo, hi, total, squares = struct.unpack_from("<Qdddd", raw,
                                                       struct.unpack_from("<Q", raw, 0x2C)[0])
    assert (count, lo, hi) == (len(covered), covered.min(), covered.max())
    assert total == pytest.approx(covered.sum(), rel=1e-12)
    assert squares == pytest.approx((covered ** 2).sum(), rel=1e-12)
    assert bw.stats("chr2", type="mean", exact=True)[0] == pytest.approx(
        want["chr2"].astype(np.float64).mean(), rel=1e-9)
    bw.close()


def test_a_thousand_chromosomes_are_found_by_name(tmp_path: Path) -> None:
    """More chromosomes than one node of the name tree holds (a scaffold-level assembly)."""
    sizes = [(f"scaffold_{i}", 10 + i % 7) for i in range(1_000)]
    w = BigWigWriter(tmp_path / "s.bw", sizes)
    for i, (chrom, n) in enumerate(sizes):
        w.add(chrom, 0, np.full(n, i, np.float32))
    w.close()
    bw = pyBigWig.open(str(tmp_path / "s.bw"))
    assert bw.chroms() == dict(sizes)
    for i in (0, 255, 256, 511, 999):
        chrom, n = sizes[i]
        assert bw.values(chrom, 0, n) == [float(i)] * n


def test_a_file_without_values_is_still_a_bigwig(tmp_path: Path) -> None:
    BigWigWriter(tmp_path / "e.bw", [("chr1", 100)]).close()
    bw = pyBigWig.open(str(tmp_path / "e.bw"))
    assert bw.chroms() == {"chr1": 100} and bw.header()["nBasesCovered"] == 0
    assert np.isnan(bw.values("chr1", 0, 100, numpy=True)).all()


def test_compression_level_changes_the_bytes_never_the_values(tmp_path: Path) -> None:
    values = np.round(np.sin(np.arange(200_000) / 500) ** 2, 4).astype(np.float32)
    files = []
    for level in (0, 1, 3):
        path = tmp_path / f"{level}.bw"
        w = BigWigWriter(path, [("c", len(values))], level=level)
        w.add("c", 0, values)
        w.close()
        files.append(path.read_bytes())
        got = pyBigWig.open(str(path)).values("c", 0, len(values), numpy=True)
        assert np.array_equal(got, values)
    assert len(files[1]) < len(files[0]) and files[1] != files[2]


@pytest.mark.parametrize(("call", "message"), [
    (lambda w: w.add("chrX", 0, np.zeros(3)), "'chrX' is not in the header"),
    (lambda w: w.add("a", 95, np.zeros(10)), "a:95-105 lies outside the chromosome's 100 bp"),
    (lambda w: (w.add("a", 10, np.zeros(5)), w.add("a", 12, np.zeros(5))),
     "a:12 comes before what was already written"),
    (lambda w: (w.add("b", 0, np.zeros(5)), w.add("a", 50, np.zeros(5))),
     "a:50 comes before what was already written"),
])
def test_values_out_of_order_or_place_are_refused(tmp_path: Path, call, message: str) -> None:
    w = BigWigWriter(tmp_path / "x.bw", [("a", 100), ("b", 50)])
    with pytest.raises(LeopardError, match=message):
        call(w)
    w.close()


@pytest.mark.parametrize(("sizes", "level", "message"), [
    ([("a", 10)], 4, "compression level must lie in"),
    ([], 1, "holds 1 to"),
    ([("a", 10), ("a", 5)], 1, "names must be unique"),
    ([("", 10)], 1, "is empty or holds NUL"),
    ([("a", 0)], 1, "length 0 must lie in"),
])
def test_a_bad_header_is_one_line(tmp_path: Path, sizes, level: int, message: str) -> None:
    with pytest.raises(LeopardError, match=message):
        BigWigWriter(tmp_path / "x.bw", sizes, level=level)


def test_an_uncreatable_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(LeopardError, match="cannot create the bigWig file"):
        BigWigWriter(tmp_path / "missing" / "x.bw", [("a", 10)])


def test_zoom_levels_are_left_to_pybigwig(tmp_path: Path) -> None:
    """Prediction writes its own bigWig unless zoom levels are asked for; both hold the same
    values."""
    values = np.round(np.random.default_rng(1).random(5_000), 4)
    got = []
    for zooms in (0, 2):
        path = tmp_path / f"z{zooms}.bw"
        w = TrackWriter(path, [("c", 5_000)], zoom_levels=zooms, background=False)
        assert w.kind == ("bigwig" if zooms == 0 else "pybigwig")
        w.put("c", 0, values)
        w.close()
        bw = pyBigWig.open(str(path))
        assert (bw.header()["nLevels"] > 0) == (zooms > 0)
        got.append(bw.values("c", 0, 5_000, numpy=True))
    assert np.array_equal(got[0], got[1])
