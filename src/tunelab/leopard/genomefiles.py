"""Opening and reading a Leopard data set's files: the genome FASTA (sequence codes), bigWig
tracks (DNase, labels; sizes and stored NaN/infinite values checked) and BED / narrowPeak
intervals, each bad file refused in one line.

bigWig gaps (bases with no entry) read as 0; a NaN value stored in a bigWig is an error.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tunelab.leopard.bigwig import check_bigwig_header
from tunelab.leopard.errors import LeopardError

__all__ = [
    "check_bigwig_size",
    "check_bigwig_values",
    "fasta_sizes",
    "open_bigwig",
    "open_fasta",
    "paint",
    "read_bigwig",
    "read_bigwig_region",
    "read_intervals",
    "read_sequence",
    "sequence_codes",
]

# byte -> code: A C G T (either case) = 0 1 2 3, everything else (N, IUPAC) = 4
_LUT = np.full(256, 4, dtype=np.uint8)
for _i, _b in enumerate(b"ACGT"):
    _LUT[_b] = _i
    _LUT[ord(chr(_b).lower())] = _i



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
    for lineno, line in _bed_lines(path):
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


MAX_BED_LINE_BYTES = 1 << 16
"""The longest line a BED file is read for (a real one is some 100 bytes)."""


def _bed_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of the BED file ``path``, read one at a time: a
    line longer than :data:`MAX_BED_LINE_BYTES` (gigabytes of zeros) stops the reading."""
    try:
        with path.open("rb") as fh:
            lineno = 0
            while raw := fh.readline(MAX_BED_LINE_BYTES + 1):
                lineno += 1
                if len(raw) > MAX_BED_LINE_BYTES:
                    raise LeopardError(f"{path}: line {lineno} is longer than "
                                       f"{MAX_BED_LINE_BYTES:,} bytes: not a BED file")
                yield lineno, raw.decode("utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise LeopardError(f"{path}: unreadable BED file ({exc})") from exc


def paint(length: int, intervals: np.ndarray | None, value: int, out: np.ndarray) -> None:
    """Set ``out[start:end] = value`` for each interval (vectorised with a difference array)."""
    if intervals is None or len(intervals) == 0:
        return
    diff = np.zeros(length + 1, dtype=np.int32)
    np.add.at(diff, intervals[:, 0], 1)
    np.add.at(diff, intervals[:, 1], -1)
    out[np.cumsum(diff[:-1]) > 0] = value
