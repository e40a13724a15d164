"""Leopard's data: genome FASTA, DNase-seq bigWig, ChIP-seq labels, windows.

A data set is described by a manifest, ``leopard.json`` (paths relative to it)::

    {"fasta": "genome.fa",            # genome sequence (pyfaidx; a .fai is built beside it)
     "dnase": "dnase.bw",             # accessibility of the cell type (bigWig)
     "dnase_avg": "dnase_avg.bw",     # optional: average over cell types (6th channel)
     "labels": "labels.narrowPeak",   # bound regions: narrowPeak/BED, or a bigWig of 0/1/-1
     "ambiguous": "ambiguous.bed",    # optional: regions whose label is -1 (ignored)
     "split": {"train": ["chr1", ...], "val": ["chr4"], "test": ["chr5"]}}

Chromosomes are loaded whole into memory as compact arrays (sequence codes ``uint8``: A C G T
= 0 1 2 3, anything else 4; DNase ``float32``; labels ``int8`` in {-1, 0, 1}). Windows are
then cut with vectorised fancy indexing, never a Python loop per window. Training windows are
drawn with probability proportional to chromosome length (start uniform within the
chromosome), as Leopard did; evaluation windows tile the chromosomes.

The files are opened and read by :mod:`tunelab.leopard.genomefiles` (bigWig gaps read as 0; a
NaN value stored in a bigWig is an error).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tunelab.inputfile import read_input_json
from tunelab.leopard.errors import LeopardError
from tunelab.leopard.genomefiles import (
    check_bigwig_size,
    fasta_sizes,
    open_bigwig,
    open_fasta,
    paint,
    read_bigwig,
    read_intervals,
    read_sequence,
)

__all__ = [
    "ChromosomeSet",
    "Manifest",
    "WindowBatch",
    "build_inputs",
    "load_chromosomes",
    "load_manifest",
]

MANIFEST_NAME = "leopard.json"
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Manifest:
    """Resolved paths of one data set and its chromosome split."""

    path: Path
    fasta: Path
    dnase: Path
    labels: Path
    split: dict[str, list[str]]
    dnase_avg: Path | None = None
    ambiguous: Path | None = None

    def chromosomes(self, split: str) -> list[str]:
        """The chromosomes of ``split`` (train, val or test)."""
        return list(self.split[split])


def load_manifest(path: str | Path) -> Manifest:
    """Read ``leopard.json`` (or a directory holding it); paths must exist."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST_NAME
    raw = read_input_json(p, f"{p}: data manifest", error=LeopardError)
    if not isinstance(raw, dict):
        raise LeopardError(f"{p}: manifest must be a JSON object")
    for key in ("fasta", "dnase", "labels", "split"):
        if key not in raw:
            raise LeopardError(f"{p}: manifest lacks {key!r}")
    split = raw["split"]
    if not isinstance(split, dict) or any(
        not isinstance(split.get(s), list) or not split.get(s) for s in SPLITS
    ):
        raise LeopardError(f"{p}: 'split' must map train, val and test to chromosome lists")
    names = [c for s in SPLITS for c in split[s]]
    if len(set(names)) != len(names):
        raise LeopardError(f"{p}: a chromosome appears in more than one split")

    def resolve(key: str) -> Path | None:
        value = raw.get(key)
        if value is None:
            return None
        q = Path(value)
        q = q if q.is_absolute() else p.parent / q
        if not q.is_file():
            what = "is not a regular file" if os.path.lexists(q) else "file not found"
            raise LeopardError(f"{q}: {key} {what} (named in {p})")
        return q

    fasta, dnase, labels = resolve("fasta"), resolve("dnase"), resolve("labels")
    assert fasta is not None and dnase is not None and labels is not None
    return Manifest(
        path=p,
        fasta=fasta,
        dnase=dnase,
        labels=labels,
        split={s: [str(c) for c in split[s]] for s in SPLITS},
        dnase_avg=resolve("dnase_avg"),
        ambiguous=resolve("ambiguous"),
    )


# ------------------------------------------------------------------------- in memory


@dataclass
class WindowBatch:
    """Windows as compact arrays: ``seq`` (n, L) uint8, ``dnase`` and optional
    ``dnase_avg`` (n, L) float32, ``label`` (n, L) int8 in {-1, 0, 1}."""

    seq: np.ndarray
    dnase: np.ndarray
    label: np.ndarray
    dnase_avg: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.seq.shape[0])


def build_inputs(batch: WindowBatch, in_channels: int,
                 scale: np.ndarray | None = None) -> np.ndarray:
    """Model input ``(n, C, L)`` float32: one-hot A C G T (N = all zeros), DNase and, for
    ``C == 6``, DNase minus the cross-cell-type average. ``scale`` (n,) multiplies the
    DNase channels (augmentation)."""
    if in_channels not in (5, 6):
        raise LeopardError(f"in_channels must be 5 or 6, got {in_channels}")
    n, length = batch.seq.shape
    x = np.empty((n, in_channels, length), dtype=np.float32)
    x[:, :4] = batch.seq[:, None, :] == np.arange(4, dtype=np.uint8)[None, :, None]
    x[:, 4] = batch.dnase
    if in_channels == 6:
        if batch.dnase_avg is None:
            raise LeopardError("6 input channels need 'dnase_avg' in the data manifest")
        x[:, 5] = batch.dnase - batch.dnase_avg
    if scale is not None:
        x[:, 4:] *= scale.astype(np.float32)[:, None, None]
    return x


@dataclass
class ChromosomeSet:
    """Whole chromosomes concatenated in memory, with windows cut by global start."""

    names: list[str]
    lengths: np.ndarray
    offsets: np.ndarray
    seq: np.ndarray
    dnase: np.ndarray
    label: np.ndarray
    dnase_avg: np.ndarray | None = None
    source: str = ""
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def total_length(self) -> int:
        """Base pairs held."""
        return int(self.lengths.sum())

    def positive_fraction(self) -> float:
        """Fraction of labelled (non -1) bases that are bound."""
        valid = self.label >= 0
        return float((self.label == 1).sum() / max(int(valid.sum()), 1))

    def n_positions(self, window: int) -> int:
        """Number of distinct window starts that fit inside the chromosomes."""
        return int(np.clip(self.lengths - window + 1, 0, None).sum())

    def sample_starts(self, n: int, window: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` global window starts: chromosome with probability proportional to its
        length, start uniform within it (windows never cross chromosome ends)."""
        room = np.clip(self.lengths - window + 1, 0, None)
        if room.sum() == 0:
            raise LeopardError(f"{self.source}: no chromosome is as long as the window "
                               f"({window} bp)")
        weights = np.where(room > 0, self.lengths, 0).astype(np.float64)
        which = rng.choice(len(self.names), size=n, p=weights / weights.sum())
        local = (rng.random(n) * room[which]).astype(np.int64)
        return self.offsets[which] + local

    def tile_starts(self, window: int) -> np.ndarray:
        """Global starts of non-overlapping windows tiling every chromosome (the remainder
        at each chromosome's end is left out)."""
        parts = [off + np.arange(0, ln - window + 1, window, dtype=np.int64)
                 for off, ln in zip(self.offsets, self.lengths, strict=True)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def gather(self, starts: np.ndarray, window: int) -> WindowBatch:
        """The windows beginning at global ``starts`` (vectorised)."""
        idx = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(window, dtype=np.int64)
        return WindowBatch(
            seq=self.seq[idx],
            dnase=self.dnase[idx],
            label=self.label[idx],
            dnase_avg=None if self.dnase_avg is None else self.dnase_avg[idx],
        )

    def locate(self, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global starts -> (chromosome index, start within the chromosome)."""
        which = np.searchsorted(self.offsets, starts, side="right") - 1
        return which, np.asarray(starts) - self.offsets[which]


#: reads ``(chrom, start, end)`` regions, in order, yielding ``(sequence codes, DNase,
#: average DNase or None, release)`` for each (:mod:`tunelab.leopard.readers` in processes)
RegionReader = Callable[[list[tuple[str, int, int]]],
                        Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None,
                                       Callable[[], None]]]]
#: region length for a :data:`RegionReader`
LOAD_CHUNK = 16_000_000


def _check_memory(manifest: Manifest, chroms: Sequence[str], total: int, per_base: int
                  ) -> None:
    """Refuse, before allocating, chromosomes whose arrays (``per_base`` bytes a base) would
    not fit in the memory available now: one line, not an allocation error or the OOM
    killer later."""
    import psutil

    need, have = total * per_base, int(psutil.virtual_memory().available)
    if need > have:
        raise LeopardError(f"{manifest.fasta}: chromosomes {', '.join(chroms[:4])}"
                           f"{' …' if len(chroms) > 4 else ''} hold {total:,} bases: "
                           f"{need / 2**30:,.1f} GiB in memory, {have / 2**30:,.1f} GiB "
                           "available")


def load_chromosomes(manifest: Manifest, chroms: Sequence[str], need_avg: bool = False,
                     reader: RegionReader | None = None) -> ChromosomeSet:
    """Load ``chroms`` of a data set into memory, checking names, lengths and values; the
    sequence and signals read here, chromosome by chromosome, or by ``reader`` in regions of
    :data:`LOAD_CHUNK` bp (labels are always painted here)."""
    fa = open_fasta(manifest.fasta)
    sizes = fasta_sizes(fa)
    for c in chroms:
        if c not in sizes:
            have = ", ".join(list(sizes)[:8])
            raise LeopardError(f"{manifest.path}: chromosome {c!r} of the split is not in "
                               f"{manifest.fasta.name} (it has: {have})")
    dnase_bw = open_bigwig(manifest.dnase, "DNase")
    avg_bw = None
    if need_avg:
        if manifest.dnase_avg is None:
            raise LeopardError(f"{manifest.path}: 6 input channels need 'dnase_avg'")
        avg_bw = open_bigwig(manifest.dnase_avg, "average DNase")
    label_is_bw = manifest.labels.suffix.lower() in (".bw", ".bigwig")
    label_bw = open_bigwig(manifest.labels, "labels") if label_is_bw else None
    peaks = None if label_is_bw else read_intervals(manifest.labels, sizes)
    amb = read_intervals(manifest.ambiguous, sizes) if manifest.ambiguous else {}
    lengths = np.asarray([sizes[c] for c in chroms], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    total = int(lengths.sum())
    _check_memory(manifest, chroms, total, 10 if avg_bw is not None else 6)
    seq = np.empty(total, np.uint8)
    dnase = np.empty(total, np.float32)
    avg = np.empty(total, np.float32) if avg_bw is not None else None
    label = np.zeros(total, np.int8)
    tracks = [(dnase_bw, manifest.dnase, dnase), (avg_bw, manifest.dnase_avg, avg)]
    if reader is None:
        for c, off, n in zip(chroms, offsets.tolist(), lengths.tolist(), strict=True):
            codes = read_sequence(fa, manifest.fasta, c)
            if len(codes) != n:
                raise LeopardError(f"{manifest.fasta}: chromosome {c!r} reads {len(codes)} "
                                   f"bases, index says {n}")
            seq[off:off + n] = codes
            for bw, path, out in tracks:
                if bw is not None and out is not None and path is not None:
                    out[off:off + n] = read_bigwig(bw, path, c, n)
    else:
        for c in chroms:
            for bw, path, _ in tracks:
                if bw is not None and path is not None:
                    check_bigwig_size(bw, path, c, sizes[c])
        where = [(c, off + a, a, min(a + LOAD_CHUNK, n)) for c, off, n in
                 zip(chroms, offsets.tolist(), lengths.tolist(), strict=True)
                 for a in range(0, n, LOAD_CHUNK)]
        regions = reader([(c, a, b) for c, _, a, b in where])
        for (_, at, a, b), (s, d, v, release) in zip(where, regions, strict=True):
            seq[at:at + b - a] = s
            dnase[at:at + b - a] = d
            if avg is not None and v is not None:
                avg[at:at + b - a] = v
            release()
    for c, off, n in zip(chroms, offsets.tolist(), lengths.tolist(), strict=True):
        y = label[off:off + n]
        if label_bw is not None:
            v = read_bigwig(label_bw, manifest.labels, c, n)
            y[v > 0.5] = 1
            y[v < -0.5] = -1
        else:
            assert peaks is not None
            paint(n, peaks.get(c), 1, y)
        paint(n, amb.get(c), -1, y)
    for h in (dnase_bw, avg_bw, label_bw):
        if h is not None:
            h.close()
    if total and not (seq < 4).any():  # (a model would learn from DNase alone, silently)
        raise LeopardError(f"{manifest.fasta}: chromosomes {', '.join(chroms[:4])}"
                           f"{' …' if len(chroms) > 4 else ''} hold no A, C, G or T base "
                           "(all N or other codes)")
    return ChromosomeSet(names=list(chroms), lengths=lengths, offsets=offsets, seq=seq,
                         dnase=dnase, label=label, dnase_avg=avg, source=str(manifest.path))
