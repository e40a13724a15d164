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

bigWig gaps (bases with no entry) read as 0; a NaN value stored in a bigWig is an error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tunelab.leopard.bigwig import check_bigwig_header
from tunelab.leopard.errors import LeopardError

__all__ = [
    "ChromosomeSet",
    "Manifest",
    "WindowBatch",
    "build_inputs",
    "check_bigwig_size",
    "check_bigwig_values",
    "fasta_sizes",
    "load_chromosomes",
    "load_manifest",
    "read_bigwig_region",
    "read_intervals",
    "sequence_codes",
]

MANIFEST_NAME = "leopard.json"
SPLITS = ("train", "val", "test")

# byte -> code: A C G T (either case) = 0 1 2 3, everything else (N, IUPAC) = 4
_LUT = np.full(256, 4, dtype=np.uint8)
for _i, _b in enumerate(b"ACGT"):
    _LUT[_b] = _i
    _LUT[ord(chr(_b).lower())] = _i


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
    if not p.is_file():
        raise LeopardError(f"{p}: data manifest not found")
    try:
        raw = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise LeopardError(f"{p}: not a valid JSON manifest ({exc})") from exc
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
            raise LeopardError(f"{q}: {key} file not found (named in {p})")
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


# ---------------------------------------------------------------------------- readers


def open_fasta(path: Path) -> Any:
    """A ``pyfaidx.Fasta`` for ``path``, with malformed files reported in one line."""
    import pyfaidx

    if not path.is_file():
        raise LeopardError(f"{path}: FASTA file not found")
    with path.open("rb") as fh:
        head = fh.read(1)
    if head != b">":
        raise LeopardError(f"{path}: not a FASTA file (does not start with '>')")
    try:
        fa = pyfaidx.Fasta(str(path), sequence_always_upper=False, rebuild=True,
                           build_index=True, as_raw=True)
    except Exception as exc:  # pyfaidx raises several types for malformed files
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LeopardError(f"{path}: malformed FASTA ({msg})") from exc
    _check_fasta_index(fa, path)
    return fa


def _check_fasta_index(fa: Any, path: Path) -> None:
    """Refuse an index (``.fai``, which pyfaidx trusts when it is newer than the FASTA)
    whose records lie beyond the end of the file: its lengths would size the arrays."""
    size = path.stat().st_size
    for name, rec in fa.faidx.index.items():
        lines = -(-int(rec.rlen) // max(int(rec.lenc), 1))
        end = int(rec.offset) + int(rec.rlen) + lines * (int(rec.lenb) - int(rec.lenc)) - 1
        if end > size:
            fa.close()
            raise LeopardError(f"{path}.fai: chromosome {name!r} has length {rec.rlen} "
                               f"there, past the end of {path.name} ({size} bytes); delete "
                               "the stale index to rebuild it")


def fasta_sizes(fa: Any) -> dict[str, int]:
    """Chromosome name -> length of an open FASTA, in file order (from its index)."""
    return {name: int(rec.rlen) for name, rec in fa.faidx.index.items()}


def read_sequence(fa: Any, path: Path, chrom: str) -> np.ndarray:
    """Sequence codes (``uint8``, A C G T N = 0 1 2 3 4) of a whole chromosome."""
    try:
        seq = fa[chrom][:]
    except Exception as exc:
        raise LeopardError(f"{path}: cannot read chromosome {chrom!r} ({exc})") from exc
    return sequence_codes(str(seq))


def sequence_codes(text: str) -> np.ndarray:
    """Codes (``uint8``, A C G T N = 0 1 2 3 4, either case) of a sequence string."""
    return _LUT[np.frombuffer(text.encode("ascii", "replace"), dtype=np.uint8)]


def open_bigwig(path: Path, what: str) -> Any:
    """An open pyBigWig handle for reading, with a one-line error for bad files: not a
    bigWig, cut short, or holding no values at all (an empty track is no signal)."""
    import pyBigWig

    if not path.is_file():
        raise LeopardError(f"{path}: {what} bigWig not found")
    check_bigwig_header(path, what)
    try:
        bw = pyBigWig.open(str(path))
    except (RuntimeError, OSError) as exc:
        raise LeopardError(f"{path}: not a readable bigWig ({what})") from exc
    if bw is None or not bw.isBigWig():
        raise LeopardError(f"{path}: not a bigWig file ({what})")
    return bw


def read_bigwig(bw: Any, path: Path, chrom: str, length: int) -> np.ndarray:
    """Per-base values of ``chrom`` (checked to have the FASTA's ``length``) as ``float32``;
    gaps are 0, a stored NaN or infinity is an error."""
    check_bigwig_size(bw, path, chrom, length)
    return read_bigwig_region(bw, path, chrom, 0, length)


def read_bigwig_region(bw: Any, path: Path, chrom: str, start: int, end: int) -> np.ndarray:
    """Per-base values of ``[start, end)`` of ``chrom`` as ``float32``; gaps are 0, a stored
    NaN or infinity is an error.

    The values come first: where all are finite nothing needs checking (a track without
    gaps, as the synthetic genome's). Only a NaN needs the check's pass over the data
    (:func:`check_bigwig_values`), since a gap reads as NaN too; checking every region first
    had cost as much as reading it (0.82 s of 2.0 s for 32 Mbp, 2-core EPYC)."""
    values = bw.values(chrom, start, end, numpy=True)
    if len(values) != end - start:  # (a file without a single entry reads as [])
        raise LeopardError(f"{path}: the bigWig holds no values ({len(values)} read for "
                           f"{chrom}:{start}-{end})")
    finite = np.isfinite(values)
    if not finite.all():
        if np.isinf(values).any():  # a gap reads as NaN: an infinity is stored
            raise LeopardError(f"{path}: NaN or infinite value in the signal on {chrom!r}")
        check_bigwig_values(bw, path, chrom, start, end)
        values = np.where(finite, values, 0.0)
    return values.astype(np.float32, copy=False)


def check_bigwig_size(bw: Any, path: Path, chrom: str, length: int) -> None:
    """Check that ``chrom`` is in the bigWig with the FASTA's length."""
    sizes = bw.chroms()
    if chrom not in sizes:
        have = ", ".join(list(sizes)[:8])
        raise LeopardError(
            f"{path}: chromosome {chrom!r} not in this bigWig (it has: {have}); "
            "chromosome names must match the FASTA"
        )
    if sizes[chrom] != length:
        raise LeopardError(
            f"{path}: chromosome {chrom!r} has length {sizes[chrom]} here but {length} in "
            "the FASTA"
        )


def check_bigwig_values(bw: Any, path: Path, chrom: str, start: int, end: int) -> bool:
    """Check that ``[start, end)`` of ``chrom`` holds no stored NaN/infinity; return whether
    it has any entry at all."""
    # One pass over the region: the sum is None where nothing is stored, NaN or infinite
    # where a stored value is; only an undefined sum needs the coverage to tell which.
    total = bw.stats(chrom, start, end, type="sum", exact=True)[0]
    if total is not None and np.isfinite(total):
        return True
    if total is None and not bw.stats(chrom, start, end, type="coverage", exact=True)[0]:
        return False
    raise LeopardError(f"{path}: NaN or infinite value in the signal on {chrom!r}")


def read_intervals(path: Path, sizes: dict[str, int]) -> dict[str, np.ndarray]:
    """Intervals of a BED / narrowPeak file: chromosome -> ``(n, 2)`` int64 starts/ends.

    Header, ``track`` and ``browser`` lines and comments are skipped. Lines on chromosomes
    absent from the FASTA are ignored, unless no line matches any FASTA chromosome (then the
    naming schemes differ, e.g. ``1`` vs ``chr1``, and that is an error).
    """
    if not path.is_file():
        raise LeopardError(f"{path}: BED file not found")
    found: dict[str, list[tuple[int, int]]] = {}
    foreign: set[str] = set()
    n_lines = 0
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise LeopardError(f"{path}: unreadable BED file ({exc})") from exc
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith(("#", "track", "browser")):
            continue
        cols = line.split("\t") if "\t" in line else line.split()
        if len(cols) < 3:
            raise LeopardError(f"{path}: line {lineno}: expected at least 3 columns "
                               "(chrom, start, end)")
        chrom, s, e = cols[0], cols[1], cols[2]
        try:
            start, end = int(s), int(e)
        except ValueError:
            raise LeopardError(f"{path}: line {lineno}: start/end {s!r}, {e!r} are not "
                               "integers") from None
        if start < 0 or end <= start:
            raise LeopardError(f"{path}: line {lineno}: invalid interval {start}-{end}")
        n_lines += 1
        if chrom not in sizes:
            foreign.add(chrom)
            continue
        if end > sizes[chrom]:
            raise LeopardError(f"{path}: line {lineno}: end {end} beyond the length "
                               f"{sizes[chrom]} of {chrom!r}")
        found.setdefault(chrom, []).append((start, end))
    if n_lines and not found:
        ex = ", ".join(sorted(foreign)[:4])
        have = ", ".join(list(sizes)[:4])
        raise LeopardError(f"{path}: no chromosome name matches the FASTA (file has {ex}; "
                           f"FASTA has {have})")
    return {c: np.asarray(v, dtype=np.int64).reshape(-1, 2) for c, v in found.items()}


def paint(length: int, intervals: np.ndarray | None, value: int, out: np.ndarray) -> None:
    """Set ``out[start:end] = value`` for each interval (vectorised with a difference array)."""
    if intervals is None or len(intervals) == 0:
        return
    diff = np.zeros(length + 1, dtype=np.int32)
    np.add.at(diff, intervals[:, 0], 1)
    np.add.at(diff, intervals[:, 1], -1)
    out[np.cumsum(diff[:-1]) > 0] = value


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
