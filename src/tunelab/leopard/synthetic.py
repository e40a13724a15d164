"""A synthetic genome written as the real files Leopard reads.

:func:`write_synthetic` writes, into one directory:

* ``genome.fa`` — random sequence (AT-rich like a mammalian genome, 60 bases a line);
* ``dnase.bw`` — accessibility of the "cell type": low gamma noise everywhere, a peak around
  every bound site, peaks at *decoy* open regions that hold no motif, half-height peaks at
  ambiguous sites, nothing at unbound motifs;
* ``dnase_avg.bw`` — the cross-cell-type average (the 6th input channel): peaks at every
  motif site and decoy, half height, smoother noise;
* ``labels.narrowPeak`` — bound sites only (motif plus a 20-bp flank each side);
* ``ambiguous.bed`` — weakly bound sites, labelled -1 and ignored by loss and metrics;
* ``leopard.json`` — the manifest (train / val / test chromosome split).

Binding sites carry a CTCF-like motif sampled from a position weight matrix built around the
19-bp CTCF consensus ``TGGCCACCAGGGGGCGCTA`` (either strand). Only sites that are both a motif
*and* open are bound, so a model must read sequence and accessibility together to score well.

Large genomes (``workers > 0``): each chromosome is drawn from its own seeded stream
(``SeedSequence(seed).spawn``) by a pool of processes, and the bigWigs are written by
:class:`~tunelab.leopard.bigwig.BigWigWriter` with writer threads and no zoom levels — a
genome of hundreds of megabases in seconds instead of minutes. The genome depends on the seed
and on whether ``workers`` is 0 (one stream for every chromosome, the original order of
draws), never on how many workers there are.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tunelab.leopard.bigwig import BigWigWriter
from tunelab.leopard.errors import LeopardError

__all__ = ["SyntheticConfig", "ctcf_like_pwm", "write_synthetic"]

CONSENSUS = "TGGCCACCAGGGGGCGCTA"
FLANK = 20
_BASES = np.frombuffer(b"ACGTN", dtype=np.uint8)


@dataclass(frozen=True)
class SyntheticConfig:
    """Size and composition of a synthetic genome."""

    n_chroms: int = 6
    chrom_length: int = 200_000
    site_spacing: int = 2_500  # one motif site per this many bp on average
    bound_fraction: float = 0.5
    ambiguous_fraction: float = 0.15
    decoys_per_site: float = 0.5
    seed: int = 0
    val_chroms: int = 1
    test_chroms: int = 1

    def __post_init__(self) -> None:
        if self.n_chroms < self.val_chroms + self.test_chroms + 1:
            raise LeopardError(f"n_chroms={self.n_chroms} leaves no training chromosome")
        if self.chrom_length < 4 * self.site_spacing or self.site_spacing < 200:
            raise LeopardError("chrom_length must be >= 4 site spacings, site_spacing >= 200")


def ctcf_like_pwm(strength: float = 0.8) -> np.ndarray:
    """A (19, 4) position weight matrix: ``strength`` on the consensus base, the rest even;
    the two outermost positions are weaker."""
    pwm = np.full((len(CONSENSUS), 4), (1.0 - strength) / 3.0)
    for i, b in enumerate(CONSENSUS):
        pwm[i, "ACGT".index(b)] = strength
    for i in (0, len(CONSENSUS) - 1):
        pwm[i] = 0.25
    return pwm


def _peak(length: int, centre: np.ndarray, height: np.ndarray, sigma: float) -> np.ndarray:
    """Sum of Gaussian bumps (cut at 4 sigma) at ``centre`` with ``height``."""
    out = np.zeros(length, dtype=np.float64)
    half = int(4 * sigma)
    offs = np.arange(-half, half + 1)
    shape = np.exp(-0.5 * (offs / sigma) ** 2)
    idx = centre[:, None] + offs[None, :]
    ok = (idx >= 0) & (idx < length)
    np.add.at(out, idx[ok], (height[:, None] * shape[None, :])[ok])
    return out


def _streamed_chromosome(cfg: SyntheticConfig, seed: np.random.SeedSequence) -> dict:
    """One chromosome from its own stream (a worker process's task)."""
    return _chromosome(cfg, np.random.default_rng(seed), ctcf_like_pwm())


def _chromosome(cfg: SyntheticConfig, rng: np.random.Generator, pwm: np.ndarray) -> dict:
    n = cfg.chrom_length
    seq = rng.choice(4, size=n, p=[0.29, 0.21, 0.21, 0.29]).astype(np.uint8)
    m = pwm.shape[0]
    n_sites = n // cfg.site_spacing
    margin = m + 2 * FLANK + 200
    slot = cfg.site_spacing
    starts = (np.arange(n_sites) * slot + rng.integers(margin, slot - margin, n_sites))
    starts = starts[starts + m + margin < n]
    k = len(starts)
    # sample motif instances from the PWM, reverse-complement half of them
    cum = pwm.cumsum(axis=1)
    draws = rng.random((k, m))
    motifs = (draws[:, :, None] > cum[None, :, :]).sum(axis=2).astype(np.uint8)
    minus = rng.random(k) < 0.5
    motifs[minus] = 3 - motifs[minus][:, ::-1]
    seq[starts[:, None] + np.arange(m)[None, :]] = np.minimum(motifs, 3)
    status = rng.choice(3, size=k, p=[cfg.bound_fraction, cfg.ambiguous_fraction,
                                      1 - cfg.bound_fraction - cfg.ambiguous_fraction])
    centre = starts + m // 2
    # decoys: open chromatin without a motif, halfway between sites
    n_dec = int(k * cfg.decoys_per_site)
    dec = rng.choice(max(k - 1, 1), size=min(n_dec, max(k - 1, 1)), replace=False)
    dec_centre = ((centre[dec] + centre[np.minimum(dec + 1, k - 1)]) // 2).astype(np.int64)
    bound, amb = status == 0, status == 1
    h_site = np.where(bound, rng.uniform(2.0, 6.0, k), np.where(amb, rng.uniform(0.8, 2.0, k),
                                                                 0.0))
    h_dec = rng.uniform(2.0, 6.0, len(dec_centre))
    dnase = rng.gamma(0.6, 0.25, n) + _peak(n, np.concatenate([centre, dec_centre]),
                                            np.concatenate([h_site, h_dec]), 60.0)
    avg = (0.5 * _peak(n, np.concatenate([centre, dec_centre]),
                       np.concatenate([np.full(k, 2.0), 0.5 * h_dec]), 70.0)
           + rng.gamma(2.0, 0.08, n))
    span = np.stack([starts - FLANK, starts + m + FLANK], axis=1)
    return {"seq": seq, "dnase": dnase.astype(np.float32), "avg": avg.astype(np.float32),
            "bound": span[bound], "ambiguous": span[amb], "height": h_site[bound]}


def _write_fasta(path: Path, chroms: list[tuple[str, np.ndarray]]) -> None:
    """60 bases a line (the lines laid out by numpy, not one write per line)."""
    with path.open("wb") as fh:
        for name, codes in chroms:
            fh.write(f">{name}\n".encode())
            text = _BASES[codes]
            full = len(text) // 60
            lines = np.empty((full, 61), dtype=np.uint8)
            lines[:, :60] = text[:full * 60].reshape(full, 60)
            lines[:, 60] = ord("\n")
            fh.write(lines.tobytes())
            if len(text) > full * 60:
                fh.write(text[full * 60:].tobytes() + b"\n")


def _write_bigwig(path: Path, sizes: list[tuple[str, int]], tracks: list[np.ndarray],
                  threads: int = 0) -> None:
    """Values rounded to 3 digits; with zoom levels by pyBigWig, or (``threads > 0``) by
    tunelab's writer, without them."""
    if threads > 0:
        w = BigWigWriter(path, sizes, digits=3, threads=threads)
        for (name, _), values in zip(sizes, tracks, strict=True):
            w.add(name, 0, values)
        w.close()
        return
    import pyBigWig

    bw = pyBigWig.open(str(path), "w")
    bw.addHeader(sizes, maxZooms=4)
    for (name, _), values in zip(sizes, tracks, strict=True):
        vals = np.round(values.astype(np.float64), 3)
        bw.addEntries(name, 0, values=vals, span=1, step=1)
    bw.close()


def write_synthetic(out_dir: str | Path, cfg: SyntheticConfig | None = None,
                    workers: int = 0) -> Path:
    """Write a synthetic data set into ``out_dir`` (created; replaced atomically if it is a
    previous synthetic set) and return the manifest path. ``workers > 0``: chromosomes drawn
    in parallel from per-chromosome streams, bigWigs written fast (see the module
    docstring)."""
    cfg = cfg or SyntheticConfig()
    if workers < 0:
        raise LeopardError(f"workers must be >= 0, got {workers}")
    out = Path(out_dir)
    rng = np.random.default_rng(cfg.seed)
    pwm = ctcf_like_pwm()
    names = [f"chr{i + 1}" for i in range(cfg.n_chroms)]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".synth-", dir=out.parent))
    os.chmod(tmp, 0o755)
    try:
        if workers:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            seeds = np.random.SeedSequence(cfg.seed).spawn(cfg.n_chroms)
            with ProcessPoolExecutor(min(workers, cfg.n_chroms),
                                     mp_context=mp.get_context("spawn")) as pool:
                data = list(pool.map(_streamed_chromosome, [cfg] * cfg.n_chroms, seeds))
        else:
            data = [_chromosome(cfg, rng, pwm) for _ in names]
        _write_fasta(tmp / "genome.fa", [(c, d["seq"]) for c, d in zip(names, data,
                                                                        strict=True)])
        sizes = [(c, cfg.chrom_length) for c in names]
        _write_bigwig(tmp / "dnase.bw", sizes, [d["dnase"] for d in data], workers)
        _write_bigwig(tmp / "dnase_avg.bw", sizes, [d["avg"] for d in data], workers)
        with (tmp / "labels.narrowPeak").open("w") as fh:
            for c, d in zip(names, data, strict=True):
                for i, ((s, e), h) in enumerate(zip(d["bound"], d["height"], strict=True)):
                    score = int(min(1000, 150 * h))
                    fh.write(f"{c}\t{s}\t{e}\t{c}_peak{i}\t{score}\t.\t{h:.3f}\t-1\t-1\t"
                             f"{(e - s) // 2}\n")
        with (tmp / "ambiguous.bed").open("w") as fh:
            for c, d in zip(names, data, strict=True):
                for s, e in d["ambiguous"]:
                    fh.write(f"{c}\t{s}\t{e}\n")
        n_test, n_val = cfg.test_chroms, cfg.val_chroms
        split = {"train": names[: -(n_val + n_test)],
                 "val": names[-(n_val + n_test): -n_test],
                 "test": names[-n_test:]}
        manifest = {"fasta": "genome.fa", "dnase": "dnase.bw", "dnase_avg": "dnase_avg.bw",
                    "labels": "labels.narrowPeak", "ambiguous": "ambiguous.bed",
                    "split": split, "synthetic": asdict(cfg)}
        (tmp / "leopard.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            if not (out / "leopard.json").is_file():
                raise LeopardError(f"{out}: exists and is not a Leopard data set; "
                                   "refusing to replace it")
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out / "leopard.json"
