"""A streaming bigWig writer for per-base tracks: what genome-wide prediction writes.

pyBigWig (libBigWig) stays tunelab's bigWig reader, and writes the files that want zoom
levels. Per-base prediction output is written here instead because libBigWig compresses every
block at zlib's default level 6, which ran at 4.9 Mbp/s on a 2-core EPYC: writing took a
third of a genome-wide prediction's time. Level 1 ran 31 Mbp/s on the same probabilities
(those of ``benchmarks/leopard_vs_keras.py --parts 3``), for a file about 10 % larger. The
blocks are deflated by ISA-L (the ``isal`` package: zlib's format, any zlib inflates it) at
its level 2, 3.4x zlib level 1 for the same size on 4-digit probabilities (319 vs 95 MB/s of
values, 61.1 vs 60.1 % of their size, 2-core EPYC), so that writing keeps up with a GPU.

The layout is UCSC's bigWig, version 4 (Kent et al., Bioinformatics 2010; libBigWig's
``bwWrite.c`` documents it too), without zoom levels::

    header (64 bytes) | total summary (40) | chromosome B+ tree | block count (8)
    | data blocks | R-tree index of the blocks | magic (4)

Every data block is a fixedStep section (type 3, step = span = 1) of at most
:data:`ITEMS_PER_BLOCK` float32 values, zlib-compressed on its own. Chromosomes are numbered
in the order they are given, which is the order their values must arrive in; the B+ tree
lists them sorted by name, as readers that search it expect.

**Parallel**: blocks are independent, so with ``threads > 0`` runs of up to
:data:`TASK_BLOCKS` blocks are rounded, summarised and compressed by a thread pool (numpy's
ufuncs and ISA-L release the GIL) and written in order as they complete: a whole genome
written by one thread would bound prediction on a GPU. The bytes do not depend on the thread
count (the summary's sums are added block by block, in file order), which
``tests/leopard/test_bigwig.py`` checks.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
from isal import isal_zlib

from tunelab.leopard.errors import LeopardError

__all__ = ["ITEMS_PER_BLOCK", "TASK_BLOCKS", "BigWigWriter", "check_bigwig_header"]

BIGWIG_MAGIC = 0x888FFC26
BPT_MAGIC = 0x78CA8C91
CIRTREE_MAGIC = 0x2468ACE0
#: values per data block: a block with its 24-byte header is 32 KiB uncompressed (libBigWig's)
ITEMS_PER_BLOCK = (32768 - 24) // 4
BLOCK_BYTES = 24 + 4 * ITEMS_PER_BLOCK
#: children per node of both trees (what UCSC's tools and libBigWig use)
FANOUT = 256
MAX_CHROMS = 1 << 24
#: blocks per task of the thread pool (about 1 MiB of values)
TASK_BLOCKS = 32
#: tasks in flight per thread before :meth:`BigWigWriter.add` waits for the oldest
_AHEAD_PER_THREAD = 4
_HEADER = struct.Struct("<IHHQQQHHQQIQ")
_SUMMARY = struct.Struct("<Qdddd")
_SECTION = struct.Struct("<IIIIIBBH")
_LEAF = struct.Struct("<IIIIQQ")
_RANGE = struct.Struct("<IIII")


class BigWigWriter:
    """Per-base values of the chromosomes ``sizes`` into a new bigWig at ``path``.

    Call :meth:`add` with each chromosome's values in ``sizes`` order and increasing
    positions (gaps are allowed: bases never added hold no value), then :meth:`close`.
    ``level`` is ISA-L's deflate level (0 fastest, 3 smallest); ``digits`` rounds the
    values (as ``np.round`` in float64) before they are stored; ``threads`` compress blocks
    in a pool (0: in the caller's thread), with the same bytes either way.
    """

    def __init__(self, path: str | Path, sizes: Sequence[tuple[str, int]],
                 level: int = 2, digits: int | None = None, threads: int = 0) -> None:
        if not 0 <= level <= 3:
            raise LeopardError(f"bigWig compression level must lie in [0, 3], got {level}")
        if not 0 < len(sizes) <= MAX_CHROMS:
            raise LeopardError(f"a bigWig holds 1 to {MAX_CHROMS:,} chromosomes, "
                               f"got {len(sizes):,}")
        names = [name.encode() for name, _ in sizes]
        for (name, length), raw in zip(sizes, names, strict=True):
            if not raw or b"\0" in raw:
                raise LeopardError(f"bigWig chromosome name {name!r} is empty or holds NUL")
            if not 0 < length < 1 << 32:
                raise LeopardError(f"bigWig chromosome {name!r}: length {length} must lie in "
                                   "[1, 2^32)")
        if len(set(names)) != len(names):
            raise LeopardError("bigWig chromosome names must be unique")
        self.path = Path(path)
        self.level, self.digits = level, digits
        self._ids = {name: i for i, (name, _) in enumerate(sizes)}
        self._lengths = [length for _, length in sizes]
        try:
            self._file = self.path.open("wb")
        except OSError as exc:
            raise LeopardError(f"{path}: cannot create the bigWig file "
                               f"({exc.strerror or exc})") from None
        self._pool = ThreadPoolExecutor(threads, "leopard-bigwig") if threads > 0 else None
        self._ahead = max(1, threads) * _AHEAD_PER_THREAD
        self._tasks: deque[Future[_Packed]] = deque()
        self._file.write(bytes(_HEADER.size + _SUMMARY.size))
        self._tree_at = self._file.tell()
        self._file.write(_chrom_tree(names, self._lengths, self._tree_at))
        self._data_at = self._file.tell()
        self._file.write(bytes(8))  # the block count, known at close
        self._blocks: list[tuple[int, int, int, int, int]] = []  # id, start, end, at, size
        self._chrom = -1
        self._next = 0  # the first position not yet added on the current chromosome
        self._pending: list[np.ndarray] = []
        self._pending_start = 0
        self._pending_n = 0
        self._count = 0
        self._min, self._max = np.inf, -np.inf
        self._sum = self._sum_squares = 0.0

    def add(self, chrom: str, start: int, values: np.ndarray) -> None:
        """Values for bases ``start, start + 1, ...`` of ``chrom``."""
        cid = self._ids.get(chrom)
        if cid is None:
            raise LeopardError(f"{self.path}: chromosome {chrom!r} is not in the header")
        if cid < self._chrom or (cid == self._chrom and start < self._next):
            raise LeopardError(f"{self.path}: {chrom}:{start} comes before what was already "
                               "written (values must arrive in order)")
        v = np.asarray(values)
        if v.dtype not in (np.float32, np.float64):
            v = v.astype(np.float64)
        if start < 0 or start + len(v) > self._lengths[cid]:
            raise LeopardError(f"{self.path}: {chrom}:{start}-{start + len(v)} lies outside "
                               f"the chromosome's {self._lengths[cid]:,} bp")
        if not len(v):
            return
        if cid != self._chrom or start != self._next:
            self._flush(everything=True)
            self._chrom, self._pending_start = cid, start
        self._next = start + len(v)
        self._pending.append(v)
        self._pending_n += len(v)
        if self._pending_n >= TASK_BLOCKS * ITEMS_PER_BLOCK:
            self._flush(everything=False)

    def _flush(self, everything: bool) -> None:
        """Hand the pending values on as full tasks, and the rest too when ``everything``."""
        if not self._pending_n:
            return
        run = np.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0]
        per_task = TASK_BLOCKS * ITEMS_PER_BLOCK
        full = len(run) // per_task * per_task
        stop = len(run) if everything else full
        for a in range(0, stop, per_task):
            self._submit(self._pending_start + a, run[a:min(a + per_task, stop)])
        rest = run[stop:]
        self._pending = [rest] if len(rest) else []
        self._pending_start += stop
        self._pending_n = len(rest)

    def _submit(self, start: int, values: np.ndarray) -> None:
        args = (self._chrom, start, values, self.digits, self.level)
        if self._pool is None:
            self._write(_pack(*args))
            return
        self._tasks.append(self._pool.submit(_pack, *args))
        while self._tasks and (self._tasks[0].done() or len(self._tasks) > self._ahead):
            self._write(self._tasks.popleft().result())

    def _write(self, packed: _Packed) -> None:
        blocks, (count, lo, hi, total, squares) = packed
        for cid, start, end, raw in blocks:
            at = self._file.tell()
            self._file.write(raw)
            self._blocks.append((cid, start, end, at, len(raw)))
        self._count += count
        self._min, self._max = min(self._min, lo), max(self._max, hi)
        self._sum += total
        self._sum_squares += squares

    def close(self) -> None:
        """Write what is pending, the index and the header; close the file."""
        try:
            self._flush(everything=True)
            while self._tasks:
                self._write(self._tasks.popleft().result())
            index_at = self._file.tell()
            self._file.write(_block_index(self._blocks, index_at))
            self._file.write(struct.pack("<I", BIGWIG_MAGIC))
            self._file.seek(0)
            self._file.write(_HEADER.pack(
                BIGWIG_MAGIC, 4, 0, self._tree_at, self._data_at, index_at, 0, 0, 0,
                _HEADER.size, BLOCK_BYTES, 0))
            lo, hi = (self._min, self._max) if self._count else (0.0, 0.0)
            self._file.write(_SUMMARY.pack(self._count, lo, hi, self._sum, self._sum_squares))
            self._file.seek(self._data_at)
            self._file.write(struct.pack("<Q", len(self._blocks)))
        finally:
            if self._pool is not None:
                for task in self._tasks:
                    task.cancel()
                self._pool.shutdown(wait=True)
            self._file.close()


#: compressed blocks ``(chromosome id, start, end, bytes)`` of a task, and its summary
#: ``(count, min, max, sum, sum of squares)``
_Packed = tuple[list[tuple[int, int, int, bytes]], tuple[int, float, float, float, float]]


def _pack(cid: int, start: int, values: np.ndarray, digits: int | None,
          level: int) -> _Packed:
    """Round, summarise and compress consecutive values of one chromosome into blocks of
    :data:`ITEMS_PER_BLOCK` (run by the pool's threads)."""
    if digits is not None:
        values = np.round(values.astype(np.float64, copy=False), digits)
    v = np.ascontiguousarray(values, dtype="<f4")
    blocks = []
    for a in range(0, len(v), ITEMS_PER_BLOCK):
        part = v[a:a + ITEMS_PER_BLOCK]
        s, e = start + a, start + a + len(part)
        head = _SECTION.pack(cid, s, e, 1, 1, 3, 0, len(part))
        blocks.append((cid, s, e, isal_zlib.compress(head + part.tobytes(), level)))
    # sums in float64 with one float64 array (the squares), not a float64 copy of the
    # values beside it; not np.dot for the squares: BLAS threads would spin beside the engine's
    summary = (len(v), float(v.min()), float(v.max()), float(v.sum(dtype=np.float64)),
               float(np.square(v, dtype=np.float64).sum()))
    return blocks, summary


def _tree(n: int, leaf: Callable[[int], bytes], leaf_width: int,
          branch_key: Callable[[int, int], bytes], branch_width: int, at: int) -> bytes:
    """A balanced tree of :data:`FANOUT` children per node over ``n`` leaf items, written
    root first, level by level, from file offset ``at``: node = ``is_leaf u8, 0 u8,
    count u16``, then ``leaf(i)`` items in a leaf, ``branch_key(lo, hi) + child offset u64``
    in a branch, where ``[lo, hi)`` are the leaf items under that child."""
    # each node: (first item, end item, first child, end child) on the level below
    level = [(i, min(i + FANOUT, n), i, min(i + FANOUT, n)) for i in range(0, n, FANOUT)]
    levels = [level or [(0, 0, 0, 0)]]
    while len(levels[-1]) > 1:
        below = levels[-1]
        levels.append([(below[j][0], below[min(j + FANOUT, len(below)) - 1][1], j,
                        min(j + FANOUT, len(below))) for j in range(0, len(below), FANOUT)])
    levels.reverse()  # root first
    offsets: list[list[int]] = []
    pos = at
    for depth, nodes in enumerate(levels):
        width = leaf_width if depth == len(levels) - 1 else branch_width
        offsets.append([])
        for node in nodes:
            offsets[-1].append(pos)
            pos += 4 + width * (node[3] - node[2])
    out = bytearray()
    for depth, nodes in enumerate(levels):
        is_leaf = depth == len(levels) - 1
        for _, _, c0, c1 in nodes:
            out += struct.pack("<BBH", is_leaf, 0, c1 - c0)
            if is_leaf:
                out += b"".join(leaf(i) for i in range(c0, c1))
            else:
                below = levels[depth + 1]
                for c in range(c0, c1):
                    out += branch_key(below[c][0], below[c][1])
                    out += struct.pack("<Q", offsets[depth + 1][c])
    return bytes(out)


def _chrom_tree(names: list[bytes], lengths: list[int], at: int) -> bytes:
    """The chromosome B+ tree: name -> (id, length), names sorted and NUL-padded."""
    key_size = max(len(n) for n in names)
    order = sorted(range(len(names)), key=lambda i: names[i])
    keys = [names[i].ljust(key_size, b"\0") for i in order]
    per_node = min(FANOUT, len(names))
    head = struct.pack("<IIIIQQ", BPT_MAGIC, per_node, key_size, 8, len(names), 0)
    body = _tree(len(names), lambda i: keys[i] + struct.pack("<II", order[i], lengths[order[i]]),
                 key_size + 8, lambda lo, hi: keys[lo], key_size + 8, at + len(head))
    return head + body


def _block_index(blocks: list[tuple[int, int, int, int, int]], at: int) -> bytes:
    """The R-tree over the data blocks (in file order, which is position order)."""
    first = blocks[0] if blocks else (0, 0, 0, 0, 0)
    last = blocks[-1] if blocks else (0, 0, 0, 0, 0)
    head = struct.pack("<IIQIIIIQII", CIRTREE_MAGIC, FANOUT, len(blocks), first[0], first[1],
                       last[0], last[2], at, ITEMS_PER_BLOCK, 0)

    def leaf(i: int) -> bytes:
        cid, start, end, offset, size = blocks[i]
        return _LEAF.pack(cid, start, cid, end, offset, size)

    def span(lo: int, hi: int) -> bytes:
        return _RANGE.pack(blocks[lo][0], blocks[lo][1], blocks[hi - 1][0], blocks[hi - 1][2])

    return head + _tree(len(blocks), leaf, _LEAF.size, span, _RANGE.size + 8, at + len(head))


#: the offsets a bigWig's 64-byte header holds
_BIGWIG_OFFSETS = (("chromosomeTreeOffset", 8), ("fullDataOffset", 16),
                   ("fullIndexOffset", 24))


def check_bigwig_header(path: Path, what: str) -> None:
    """Refuse in one line a file that is not a bigWig or is cut short: the header's offsets
    must lie inside the file (libBigWig only prints "bw is NULL!" on such a file)."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(64)
    if len(head) < 64 or int.from_bytes(head[:4], "little") != BIGWIG_MAGIC:
        raise LeopardError(f"{path}: not a bigWig file ({what}; {size} bytes, "
                           "no bigWig header)")
    for name, at in _BIGWIG_OFFSETS:
        offset = int.from_bytes(head[at:at + 8], "little")
        if offset >= size:
            raise LeopardError(f"{path}: truncated bigWig ({what}): header field {name} "
                               f"= {offset} but the file has {size} bytes")
    summary = int.from_bytes(head[44:52], "little")  # totalSummaryOffset (0: none)
    if summary:
        if summary + 8 > size:
            raise LeopardError(f"{path}: truncated bigWig ({what}): header field "
                               f"totalSummaryOffset = {summary} but the file has {size} bytes")
        with path.open("rb") as fh:
            fh.seek(summary)
            covered = int.from_bytes(fh.read(8), "little")
        if covered == 0:
            raise LeopardError(f"{path}: the {what} bigWig holds no values (its total "
                               "summary's basesCovered = 0)")
