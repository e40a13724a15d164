"""Loaders on the real files the synthetic generator writes; sampling; inputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyBigWig
import pytest

from tunelab.leopard.data import (
    ChromosomeSet,
    WindowBatch,
    build_inputs,
    load_chromosomes,
    load_manifest,
)
from tunelab.leopard.genomefiles import read_intervals
from tunelab.leopard.synthetic import CONSENSUS
from tunelab.leopard.windows import load_windows


def test_manifest_and_split(synth: Path) -> None:
    m = load_manifest(synth.parent)
    assert m.split == {"train": ["chr1", "chr2"], "val": ["chr3"], "test": ["chr4"]}
    assert m.dnase_avg is not None and m.ambiguous is not None


def test_loaded_arrays_agree_with_the_files(synth: Path) -> None:
    m = load_manifest(synth)
    cs = load_chromosomes(m, ["chr2"], need_avg=True)
    # sequence: the FASTA text, re-read independently
    text = "".join(ln.strip() for ln in m.fasta.read_text().split(">chr2\n")[1]
                   .split(">")[0].splitlines())
    assert "".join("ACGTN"[c] for c in cs.seq) == text
    # DNase: pyBigWig's own values
    bw = pyBigWig.open(str(m.dnase))
    assert np.allclose(cs.dnase, bw.values("chr2", 0, 16_000, numpy=True), atol=1e-6)
    # labels: 1 inside narrowPeak intervals, -1 in ambiguous ones, 0 elsewhere
    peaks = [ln.split("\t") for ln in m.labels.read_text().splitlines()
             if ln.startswith("chr2\t")]
    assert peaks
    for p in peaks:
        assert (cs.label[int(p[1]):int(p[2])] == 1).all()
    amb = [ln.split("\t") for ln in m.ambiguous.read_text().splitlines()
           if ln.startswith("chr2\t")]
    for a in amb:
        assert (cs.label[int(a[1]):int(a[2])] == -1).all()
    assert 0 < cs.positive_fraction() < 0.2
    assert (cs.label == 0).mean() > 0.7


def test_synthetic_bound_sites_carry_the_motif_and_are_open(synth: Path) -> None:
    m = load_manifest(synth)
    cs = load_chromosomes(m, ["chr1"])
    peaks = read_intervals(m.labels, {"chr1": 16_000})["chr1"]
    hits = 0
    for s, e in peaks:
        core = "".join("ACGTN"[c] for c in cs.seq[s + 20:e - 20])
        rc = core[::-1].translate(str.maketrans("ACGT", "TGCA"))
        match = max(sum(a == b for a, b in zip(x, CONSENSUS, strict=True)) for x in (core, rc))
        hits += match >= 12
        assert cs.dnase[s:e].mean() > 3 * np.median(cs.dnase)
    assert hits >= 0.8 * len(peaks)


def test_sampling_is_proportional_to_length_and_stays_inside() -> None:
    lengths = np.array([1000, 3000])
    cs = ChromosomeSet(names=["a", "b"], lengths=lengths, offsets=np.array([0, 1000]),
                       seq=np.zeros(4000, np.uint8), dnase=np.zeros(4000, np.float32),
                       label=np.zeros(4000, np.int8))
    starts = cs.sample_starts(20_000, 100, np.random.default_rng(0))
    which, local = cs.locate(starts)
    assert abs((which == 0).mean() - 0.25) < 0.02
    assert (local >= 0).all() and (local + 100 <= lengths[which]).all()
    assert cs.tile_starts(400).tolist() == [0, 400, 1000, 1400, 1800, 2200, 2600,
                                        3000, 3400]


def test_build_inputs_one_hot_dnase_and_scale() -> None:
    b = WindowBatch(seq=np.array([[0, 1, 2, 3, 4]], np.uint8),
                    dnase=np.array([[1, 2, 3, 4, 5]], np.float32),
                    label=np.zeros((1, 5), np.int8),
                    dnase_avg=np.array([[1, 1, 1, 1, 1]], np.float32))
    x = build_inputs(b, 6, scale=np.array([2.0]))
    assert x.shape == (1, 6, 5)
    assert x[0, :4].T.tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1],
                                   [0, 0, 0, 0]]
    assert x[0, 4].tolist() == [2, 4, 6, 8, 10]
    assert x[0, 5].tolist() == [0, 2, 4, 6, 8]


def test_npz_windows_round_trip(windows: Path, synth: Path) -> None:
    tr = load_windows(windows / "train.npz")
    assert len(tr) == 32 and tr.window == 512
    # each window is the genome slice it claims to be
    m = load_manifest(synth)
    cs = load_chromosomes(m, ["chr1", "chr2"])
    for i in range(len(tr)):
        k = cs.names.index(str(tr.chrom[i]))
        g = cs.offsets[k] + tr.start[i]
        assert (tr.batch.seq[i] == cs.seq[g:g + 512]).all()
        assert (tr.batch.label[i] == cs.label[g:g + 512]).all()
    meta = json.loads((synth.parent / "leopard.json").read_text())
    assert meta["synthetic"]["chrom_length"] == 16_000


def test_read_intervals_skips_headers_and_foreign_contigs(tmp_path: Path) -> None:
    bed = tmp_path / "x.bed"
    bed.write_text("track name=x\n# c\nchr1\t5\t10\nchrUn_x\t1\t2\nchr1\t20\t30\textra\n")
    got = read_intervals(bed, {"chr1": 100})
    assert got["chr1"].tolist() == [[5, 10], [20, 30]]


def test_eval_windows_tile(windows: Path) -> None:
    val = load_windows(windows / "val.npz")
    assert len(val) == 16 and len(set(val.start.tolist())) == 16
    assert all(s % 512 == 0 for s in val.start.tolist())


def test_labels_as_bigwig_with_masked_bases(synth: Path, tmp_path: Path) -> None:
    """ChIP-seq labels given as a bigWig of 1 / 0 / -1 load like the narrowPeak + BED pair."""
    import shutil

    d = tmp_path / "d"
    shutil.copytree(synth.parent, d)
    m = load_manifest(d)
    names = ["chr1", "chr2", "chr3", "chr4"]
    ref = load_chromosomes(m, names)
    bw = pyBigWig.open(str(d / "labels.bw"), "w")
    bw.addHeader([(c, 16_000) for c in names])
    for c, off in zip(names, ref.offsets, strict=True):
        bw.addEntries(c, 0, values=ref.label[off:off + 16_000].astype(np.float64), span=1,
                      step=1)
    bw.close()
    man = json.loads((d / "leopard.json").read_text())
    man["labels"] = "labels.bw"
    del man["ambiguous"]
    (d / "leopard.json").write_text(json.dumps(man))
    got = load_chromosomes(load_manifest(d), names)
    assert (got.label == ref.label).all() and (got.label == -1).any()


def test_bigwig_regions_read_gaps_as_zero_and_refuse_stored_nan_or_infinity(
        tmp_path: Path) -> None:
    """Values are read first and checked only where one is not finite: a gap is 0, a stored
    NaN or infinity is a one-line error naming the file and chromosome, a region wholly in a
    gap is zeros, a track without gaps comes back as stored."""
    from tunelab.leopard.errors import LeopardError
    from tunelab.leopard.genomefiles import read_bigwig_region

    def track(name: str, values: list[float]) -> Any:
        path = tmp_path / name
        bw = pyBigWig.open(str(path), "w")
        bw.addHeader([("chr1", 1_000)])
        bw.addEntries("chr1", 100, values=values, span=1, step=1)  # bases 0-99: a gap
        bw.close()
        return pyBigWig.open(str(path))

    plain = track("plain.bw", [0.5] * 300)
    got = read_bigwig_region(plain, tmp_path / "plain.bw", "chr1", 50, 450)
    assert got.dtype == np.float32 and got.shape == (400,)
    assert np.array_equal(got, np.r_[np.zeros(50), np.full(300, 0.5), np.zeros(50)])
    full = read_bigwig_region(plain, tmp_path / "plain.bw", "chr1", 150, 350)
    assert np.array_equal(full, np.full(200, 0.5, np.float32))
    assert not read_bigwig_region(plain, tmp_path / "plain.bw", "chr1", 600, 700).any()
    for name, bad in (("nan.bw", float("nan")), ("inf.bw", float("inf")),
                      ("minf.bw", -float("inf"))):
        bw = track(name, [1.0] * 10 + [bad] + [1.0] * 10)
        with pytest.raises(LeopardError, match=rf"{name}: NaN or infinite value .* 'chr1'"):
            read_bigwig_region(bw, tmp_path / name, "chr1", 0, 1_000)
        # a region that does not hold the bad value reads as usual
        assert read_bigwig_region(bw, tmp_path / name, "chr1", 100, 105).tolist() == [1.0] * 5
