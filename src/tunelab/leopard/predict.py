"""Genome-wide prediction with a trained Leopard model, streamed: read, predict, write.

**Tiling.** Each chromosome is covered by windows of ``window`` bp (the training length by
default; a U-Net is fully convolutional, so a longer prediction window only adds context) at
starts ``0, stride, 2*stride, ...`` plus one window flush with the chromosome's end. From
every window only the centre ``[edge, window - edge)`` is kept, where the network sees
context on both sides (the chromosome's own ends are kept too); where kept parts overlap the
predictions are averaged. The default ``stride = window - 2*edge`` predicts every base once
(only the flush window overlaps its neighbour); ``stride = window / 2`` is the older scheme
that averages two predictions per base at twice the cost. ``edge <= window / 4`` and
``stride <= window - 2*edge`` guarantee every base is covered.

**Pipeline.** The next group of windows is read from the FASTA and the bigWig(s) (only the
region the group spans) and encoded as channels-last model input; the network runs
(:mod:`tunelab.leopard.runtime`: BatchNorm folded, precision and kernels chosen for the
machine); every finished stretch of bases is appended to the output track as soon as no later
window can touch it. Reading and writing run in their own threads, overlapping the network,
when the engine leaves a core free, and in turn with it otherwise. Memory stays bounded by a
few groups of windows, whatever the chromosome's length. Output is a bigWig
(``.bw``/``.bigwig``, :mod:`tunelab.leopard.bigwig`) or a bedGraph (anything else) of
probabilities rounded to 4 digits.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tunelab.leopard.bigwig import BigWigWriter
from tunelab.leopard.errors import LeopardError
from tunelab.leopard.prefetch import prefetch

if TYPE_CHECKING:
    import torch

    from tunelab.leopard.runtime import Engine

__all__ = ["Tiling", "encode_windows", "predict_chromosome", "predict_genome"]

#: groups of windows read ahead of the network, and finished stretches queued for writing
_READ_AHEAD = 2
_WRITE_AHEAD = 4


@dataclass(frozen=True)
class Tiling:
    """Where windows start and which part of each is kept (see the module docstring)."""

    window: int
    edge: int
    stride: int

    @classmethod
    def make(cls, window: int, edge: int | None = None, stride: int | None = None) -> Tiling:
        """Defaults ``edge = window / 8``, ``stride = window - 2 * edge``; checked."""
        if window <= 0 or window % 2:
            raise LeopardError(f"window length {window} must be even and positive")
        edge = window // 8 if edge is None else edge
        if not 0 <= edge <= window // 4:
            raise LeopardError(f"edge {edge} must lie in [0, window/4 = {window // 4}]")
        stride = window - 2 * edge if stride is None else stride
        if not 0 < stride <= window - 2 * edge:
            raise LeopardError(f"stride {stride} must lie in [1, window - 2*edge = "
                               f"{window - 2 * edge}] so that every base is covered")
        return cls(window, edge, stride)

    def starts(self, length: int) -> np.ndarray:
        """Window starts over a sequence of ``length`` bp (at least ``window`` long)."""
        last = max(length - self.window, 0)
        starts = np.arange(0, last + 1, self.stride, dtype=np.int64)
        return starts if starts[-1] == last else np.append(starts, last)

    def kept(self, start: int, length: int) -> tuple[int, int]:
        """The part ``[lo, hi)`` of the window at ``start`` whose predictions are used."""
        lo = 0 if start == 0 else self.edge
        hi = self.window if start + self.window >= length else self.window - self.edge
        return lo, hi


def encode_windows(seq: np.ndarray, dnase: np.ndarray, diff: np.ndarray | None,
                   offsets: np.ndarray, window: int) -> np.ndarray:
    """Model input for the windows at ``offsets`` of a region, ``(N, window, C)`` float32:
    channels last, i.e. the memory of a ``(N, C, 1, window)`` channels-last tensor."""
    idx = offsets[:, None] + np.arange(window, dtype=np.int64)
    channels = 5 if diff is None else 6
    x = np.empty((len(offsets), window, channels), dtype=np.float32)
    codes = seq[idx]
    for b in range(4):
        np.equal(codes, b, out=x[:, :, b])  # writes 0/1 as float32
    x[:, :, 4] = dnase[idx]
    if diff is not None:
        x[:, :, 5] = diff[idx]
    return x


def _as_input(x: np.ndarray) -> torch.Tensor:
    """``(N, L, C)`` array -> the ``(N, C, 1, L)`` channels-last tensor over the same memory."""
    import torch

    return torch.from_numpy(x).permute(0, 2, 1)[:, :, None, :]


# A reader returns (sequence codes, DNase, DNase - average or None) of [a, b) of one chromosome.
Reader = Callable[[int, int], tuple[np.ndarray, np.ndarray, np.ndarray | None]]


def _groups(tiling: Tiling, length: int, batch: int) -> list[np.ndarray]:
    starts = tiling.starts(length)
    return [starts[i:i + batch] for i in range(0, len(starts), batch)]


def _read_group(read: Reader, starts: np.ndarray, length: int, window: int) -> np.ndarray:
    a, b = int(starts[0]), int(starts[-1]) + window
    seq, dn, diff = read(a, min(b, length))
    if b > length:  # a chromosome shorter than the window: pad with N / no signal
        extra = b - max(length, a)
        seq = np.concatenate([seq, np.full(extra, 4, np.uint8)])
        dn = np.concatenate([dn, np.zeros(extra, np.float32)])
        diff = None if diff is None else np.concatenate([diff, np.zeros(extra, np.float32)])
    return encode_windows(seq, dn, diff, starts - a, window)


def _stream(engine: Engine, read: Reader, length: int, tiling: Tiling, batch: int,
            timer: list[float], overlap: bool = True) -> Iterator[tuple[int, np.ndarray]]:
    """Finished stretches ``(start, probabilities)`` of one chromosome, in order; the next
    windows are read and encoded in a background thread when ``overlap``."""
    w = tiling.window
    padded = max(length, w)
    groups = _groups(tiling, padded, batch)
    reads = (_read_group(read, g, length, w) for g in groups)
    inputs = prefetch(reads, _READ_AHEAD, "leopard-reader") if overlap else reads
    acc_start = 0
    total = np.zeros(0, np.float32)
    count = np.zeros(0, np.float32)
    for i, (g, x) in enumerate(zip(groups, inputs, strict=True)):
        t = time.perf_counter()
        probs = engine(_as_input(x)).float().cpu().numpy()
        timer[0] += time.perf_counter() - t
        end = int(g[-1]) + w
        if end - acc_start > len(total):
            grow = end - acc_start - len(total)
            total = np.concatenate([total, np.zeros(grow, np.float32)])
            count = np.concatenate([count, np.zeros(grow, np.float32)])
        for s, p in zip(g.tolist(), probs, strict=True):
            lo, hi = tiling.kept(s, padded)
            a = s - acc_start
            total[a + lo:a + hi] += p[lo:hi]
            count[a + lo:a + hi] += 1
        done = int(groups[i + 1][0]) + tiling.edge if i + 1 < len(groups) else padded
        done = min(done, length)
        k = done - acc_start
        if k > 0:
            yield acc_start, total[:k] / count[:k]
            total, count, acc_start = total[k:], count[k:], done


def _engine_for(model: Any, device: str | torch.device, window: int, batch: int,
                amp: bool) -> Engine:
    from tunelab.leopard.runtime import Engine, prepare

    if isinstance(model, Engine):
        return model
    return prepare(model, device, precision="auto" if amp else "fp32", compile="off",
                   window=window, batch=batch)


def predict_chromosome(model: Any, seq: np.ndarray, dnase: np.ndarray,
                       dnase_avg: np.ndarray | None, window: int, batch_size: int = 32,
                       edge: int | None = None, device: str | torch.device = "cpu",
                       amp: bool = False, stride: int | None = None) -> np.ndarray:
    """Per-base probabilities (float32) of one chromosome held in memory. ``model`` is a
    trained :class:`~tunelab.leopard.model.LeopardUNet` (predicted in fp32, or with the
    precision :mod:`~tunelab.leopard.runtime` picks when ``amp``) or a prepared ``Engine``."""
    tiling = Tiling.make(window, edge, stride)
    engine = _engine_for(model, device, window, batch_size, amp)
    if engine.in_channels == 6 and dnase_avg is None:
        raise LeopardError("a 6-channel model needs the average DNase track (dnase_avg)")
    n = len(seq)
    diff = None if engine.in_channels == 5 else np.asarray(dnase - dnase_avg, np.float32)

    def read(a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        return seq[a:b], dnase[a:b], None if diff is None else diff[a:b]

    out = np.empty(n, np.float32)
    for start, values in _stream(engine, read, n, tiling, batch_size, [0.0]):
        out[start:start + len(values)] = values
    return out


# ------------------------------------------------------------------------ track writers


class _Writer:
    """Appends finished stretches to a bigWig or bedGraph, in a background thread when
    ``background`` (else at once, in the caller's). A bigWig is written by
    :class:`~tunelab.leopard.bigwig.BigWigWriter` (zlib level 1), or by pyBigWig when it
    wants zoom levels."""

    def __init__(self, path: Path, sizes: list[tuple[str, int]], digits: int = 4,
                 zoom_levels: int = 0, background: bool = True) -> None:
        self.path, self.digits = path, digits
        self.handle: Any
        self.kind = "bedgraph"
        bigwig = path.suffix.lower() in (".bw", ".bigwig")
        if bigwig and zoom_levels:
            import pyBigWig

            self.handle = pyBigWig.open(str(path), "w")
            if self.handle is None:
                raise LeopardError(f"{path}: cannot create the bigWig file")
            self.handle.addHeader(sizes, maxZooms=zoom_levels)
            self.kind = "pybigwig"
        elif bigwig:
            self.handle = BigWigWriter(path, sizes, level=1)
            self.kind = "bigwig"
        else:
            self.handle = path.open("w")
        self._q: queue.Queue[tuple[str, int, np.ndarray] | None] = queue.Queue(_WRITE_AHEAD)
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._work, name="leopard-writer",
                                            daemon=True)
            self._thread.start()

    def put(self, chrom: str, start: int, values: np.ndarray) -> None:
        """Queue (or write) ``values`` for bases ``start, start + 1, ...`` of ``chrom``."""
        if self._error is not None:
            raise LeopardError(f"{self.path}: writing failed ({self._error})")
        if self._thread is None:
            try:
                self._write(chrom, start, values)
            except Exception as exc:
                self._error = exc
                raise LeopardError(f"{self.path}: writing failed ({exc})") from None
            return
        self._q.put((chrom, start, values))

    def _work(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            if self._error is None:
                try:
                    self._write(*item)
                except Exception as exc:  # reported by put()/close() in the main thread
                    self._error = exc

    def _write(self, chrom: str, start: int, values: np.ndarray) -> None:
        v = np.round(values.astype(np.float64), self.digits)
        if self.kind == "bigwig":
            self.handle.add(chrom, start, v)
            return
        if self.kind == "pybigwig":
            self.handle.addEntries(chrom, start, values=v, span=1, step=1)
            return
        change = np.flatnonzero(np.diff(v)) + 1
        starts = np.concatenate([[0], change])
        ends = np.concatenate([change, [len(v)]])
        d = self.digits
        self.handle.writelines(f"{chrom}\t{start + s}\t{start + e}\t{v[s]:.{d}f}\n"
                               for s, e in zip(starts.tolist(), ends.tolist(), strict=True))

    def close(self) -> None:
        """Write what is queued, close the file; raise a writing error."""
        if self._thread is not None:
            self._q.put(None)
            self._thread.join()
        self.handle.close()
        if self._error is not None:
            raise LeopardError(f"{self.path}: writing failed ({self._error})")


def _file_reader(fa: Any, fasta: Path, bws: list[tuple[Any, Path]], chrom: str,
                 length: int) -> Reader:
    """A :data:`Reader` of one chromosome of open FASTA / bigWig handles (checked once)."""
    from tunelab.leopard.data import check_bigwig_chrom, sequence_codes

    for bw, path in bws:
        check_bigwig_chrom(bw, path, chrom, length)
    record = fa[chrom]

    def values(bw: Any, a: int, b: int) -> np.ndarray:
        v = bw.values(chrom, a, b, numpy=True)
        return np.nan_to_num(v, nan=0.0).astype(np.float32, copy=False)

    def read(a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        seq = sequence_codes(str(record[a:b]))
        if len(seq) != b - a:
            raise LeopardError(f"{fasta}: chromosome {chrom!r} reads {len(seq)} bases at "
                               f"{a}-{b}, index says {b - a}")
        dn = values(bws[0][0], a, b)
        diff = None if len(bws) == 1 else dn - values(bws[1][0], a, b)
        return seq, dn, diff

    return read


def predict_genome(checkpoint: str | Path, data: str | Path, out: str | Path,
                   chroms: list[str] | None = None, batch_size: int = 32,
                   edge: int | None = None, device: str = "auto", *,
                   window: int | None = None, stride: int | None = None,
                   precision: str = "auto", compile: str = "auto",
                   threads: int | None = None, zoom_levels: int = 0) -> dict[str, Any]:
    """Predict ``chroms`` (default: the manifest's test split) of a data set into ``out``.

    ``window`` defaults to the training window, ``edge`` to an eighth of the training window
    (the context the network learnt with; ample for its ~1.2 kb receptive field), ``stride``
    to ``window - 2 * edge``. A bigWig gets ``zoom_levels`` summary levels (0 by default:
    computing them when the file is closed cost about as much as predicting, here).

    Returns ``bp``, ``seconds`` (forward passes only), ``bp_per_s``, ``bp_per_s_end_to_end``
    (everything: loading the model, choosing the runtime, reading, predicting, writing),
    ``window``, ``stride``, ``edge``, ``precision``, ``compiled``, ``threads`` and
    ``runtime`` (one line saying what was chosen and why).
    """
    import torch

    from tunelab.leopard.data import fasta_sizes, load_manifest, open_bigwig, open_fasta
    from tunelab.leopard.model import Architecture, LeopardUNet
    from tunelab.leopard.runtime import prepare
    from tunelab.leopard.train import load_checkpoint

    t0 = time.perf_counter()
    ck = load_checkpoint(Path(checkpoint))
    try:
        arch = Architecture(**ck["arch"])
        model = LeopardUNet(arch)
        model.load_state_dict(ck["model"])
    except (TypeError, RuntimeError) as exc:
        raise LeopardError(f"{checkpoint}: weights do not fit the recorded architecture "
                           f"({str(exc).splitlines()[0]})") from exc
    trained = int(ck.get("window", 10240))
    window = int(window or trained)
    if edge is None:
        edge = min(trained // 8, window // 4)
    if not 0 <= zoom_levels <= 10:
        raise LeopardError(f"zoom levels must lie in [0, 10], got {zoom_levels}")
    if window % arch.multiple:
        raise LeopardError(f"window length {window} is not divisible by {arch.multiple}")
    if batch_size < 1:
        raise LeopardError(f"batch size must be at least 1, got {batch_size}")
    tiling = Tiling.make(window, edge, stride)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    m = load_manifest(data)
    fa = open_fasta(m.fasta)
    all_sizes = fasta_sizes(fa)
    chroms = chroms or m.chromosomes("test")
    for c in chroms:
        if c not in all_sizes:
            raise LeopardError(f"{m.fasta}: no chromosome {c!r} to predict")
    bws = [(open_bigwig(m.dnase, "DNase"), m.dnase)]
    if arch.in_channels == 6:
        if m.dnase_avg is None:
            raise LeopardError(f"{m.path}: a 6-channel model needs 'dnase_avg'")
        bws.append((open_bigwig(m.dnase_avg, "average DNase"), m.dnase_avg))
    n_windows = sum(len(tiling.starts(max(all_sizes[c], window))) for c in chroms)
    engine = prepare(model, device, precision, compile, threads, window, batch_size,
                     expected_windows=n_windows)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Reading and writing overlap the forward passes only on cores the engine leaves free:
    # beside an engine that uses every core, a reader or writer thread stalls all of its
    # threads at each parallel step (a 2-core machine predicted ~1.5x faster without them).
    overlap = engine.device.type != "cpu" or len(os.sched_getaffinity(0)) > engine.runtime.threads
    writer = _Writer(out, [(c, all_sizes[c]) for c in chroms], zoom_levels=zoom_levels,
                     background=overlap)
    timer, bp = [0.0], 0
    try:
        for c in chroms:
            n = all_sizes[c]
            read = _file_reader(fa, m.fasta, bws, c, n)
            for start, values in _stream(engine, read, n, tiling, batch_size, timer,
                                         overlap):
                writer.put(c, start, values)
                bp += len(values)
    finally:
        try:
            writer.close()
        finally:
            for bw, _ in bws:
                bw.close()
    total = time.perf_counter() - t0
    rt = engine.runtime
    return {"bp": float(bp), "seconds": timer[0], "bp_per_s": bp / max(timer[0], 1e-9),
            "bp_per_s_end_to_end": bp / max(total, 1e-9), "wall_s": total,
            "window": float(window), "stride": float(tiling.stride),
            "edge": float(tiling.edge), "windows": float(n_windows),
            "precision": rt.precision, "compiled": rt.compiled, "threads": rt.threads,
            "runtime": rt.summary()}
