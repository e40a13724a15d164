"""Genome-wide prediction with a trained Leopard model: read, predict, write, in parallel.

The windows and sections a chromosome is predicted by are planned by
:mod:`tunelab.leopard.tiling`.

**Pipeline** (:func:`predict_genome`; the same code on a CPU and a GPU):

* *reading* — :func:`tunelab.leopard.readers.read_regions`: a section's region of the FASTA
  and bigWig(s) read by worker processes (one section each) into shared memory when cores
  are free, else in turn with the network;
* *predicting* — the region's compact arrays go to the device once (on CUDA through pinned
  memory and a side stream); windows are cut, one-hot encoded into channels-last input and
  their kept parts averaged into the section there, by torch operations; the network runs on
  batches of one shape (:mod:`tunelab.leopard.runtime`: BatchNorm folded, precision, CUDA
  graph or ``torch.compile`` where measured faster);
* *writing* — one device-to-host copy per section (on CUDA read back one section later, so
  the device never waits for it), written by :class:`~tunelab.leopard.tracks.TrackWriter`
  (a bigWig's blocks rounded and compressed by writer threads).

Memory stays bounded by a few sections, whatever the genome. Output is a bigWig
(``.bw``/``.bigwig``) or a bedGraph (anything else) of probabilities rounded to 4 digits.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tunelab.leopard.errors import LeopardError
from tunelab.leopard.readers import Loaded, Reading, Tracks, start_reading
from tunelab.leopard.tiling import Section, Tiling, plan_sections
from tunelab.leopard.tracks import TrackWriter

if TYPE_CHECKING:
    import torch

    from tunelab.leopard.model import Architecture
    from tunelab.leopard.runtime import Engine, Runtime

__all__ = ["predict_chromosome", "predict_genome"]

#: output bases per section: on a GPU large (fewer, longer reads), on a CPU a few seconds' work
SECTION_BP = {"cuda": 16_000_000, "cpu": 4_000_000}


class _SectionPredictor:
    """Cuts, encodes, predicts and stitches one section's windows on the engine's device."""

    def __init__(self, engine: Engine, tiling: Tiling, batch: int) -> None:
        import torch

        self.engine, self.tiling, self.batch = engine, tiling, batch
        dev = self.device = engine.device
        self.cuda = dev.type == "cuda"
        self.side = torch.cuda.Stream(dev) if self.cuda else None
        self.offsets = torch.arange(tiling.window, device=dev)
        self.codes = torch.arange(4, dtype=torch.uint8, device=dev)
        self.device_s = 0.0  # the device's time on the sections (CUDA: events)
        self._events: list[tuple[Any, Any]] = []

    def upload(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        """The region's arrays on the device: on CUDA copied (through pinned memory, by a
        side stream: the caller may release the arrays on return); on a CPU the same
        memory (release only after :meth:`run`)."""
        import torch

        if self.side is None:
            return [torch.from_numpy(a) for a in arrays]
        out = []
        cur = torch.cuda.current_stream(self.device)
        for a in arrays:
            host = torch.empty(len(a), dtype=torch.from_numpy(a[:0]).dtype, pin_memory=True)
            host.numpy()[:] = a
            with torch.cuda.stream(self.side):
                t = host.to(self.device, non_blocking=True)
            out.append(t)
        cur.wait_stream(self.side)
        for t in out:
            t.record_stream(cur)
        return out

    def encode(self, seq: torch.Tensor, dnase: torch.Tensor, diff: torch.Tensor | None,
               offsets: torch.Tensor) -> torch.Tensor:
        """Channels-last input ``(n, C, 1, window)`` of the windows at ``offsets`` of a region
        (its memory ``(n, window, C)``): one-hot A C G T (N: zeros), DNase, DNase - average."""
        import torch

        idx = offsets[:, None] + self.offsets
        x = torch.empty((len(offsets), self.tiling.window, 5 if diff is None else 6),
                        dtype=torch.float32, device=seq.device)
        torch.eq(seq[idx][:, :, None], self.codes, out=x[:, :, :4])
        x[:, :, 4] = dnase[idx]
        if diff is not None:
            x[:, :, 5] = diff[idx]
        return x.permute(0, 2, 1)[:, :, None, :]

    def run(self, sec: Section, arrays: list[torch.Tensor]) -> torch.Tensor:
        """The section's probabilities ``(hi - lo,)`` float32, on the device."""
        import torch

        w = self.tiling.window
        seq, dnase = arrays[0], arrays[1]
        diff = arrays[2] if len(arrays) > 2 else None
        a = int(sec.starts[0])
        short = int(sec.starts[-1]) + w - a - len(seq)
        if short > 0:  # a chromosome shorter than the window: pad with N / no signal
            seq = torch.cat([seq, seq.new_full((short,), 4)])
            dnase = torch.cat([dnase, dnase.new_zeros(short)])
            diff = None if diff is None else torch.cat([diff, diff.new_zeros(short)])
        dev = self.device
        t0 = time.perf_counter()
        events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                  ) if self.cuda else None
        if events is not None:
            events[0].record()
        starts, keep_lo, keep_hi = (self._small(a) for a in (sec.starts, sec.keep_lo,
                                                              sec.keep_hi))
        keep_lo, keep_hi = keep_lo[:, None], keep_hi[:, None]
        size = sec.hi - sec.lo
        total = torch.zeros(size, dtype=torch.float32, device=dev)
        count = torch.zeros(size, dtype=torch.float32, device=dev)
        for i in range(0, len(starts), self.batch):
            s = starts[i:i + self.batch]
            probs = self.engine(self.encode(seq, dnase, diff, s - a))
            pos = (s[:, None] - sec.lo) + self.offsets
            valid = ((self.offsets >= keep_lo[i:i + self.batch])
                     & (self.offsets < keep_hi[i:i + self.batch]) & (pos >= 0) & (pos < size))
            idx = pos.clamp_(0, size - 1).reshape(-1)
            total.index_add_(0, idx, (probs * valid).reshape(-1))
            count.index_add_(0, idx, valid.to(torch.float32).reshape(-1))
        out = total / count
        if events is not None:
            events[1].record()
            self._events.append(events)
        else:
            self.device_s += time.perf_counter() - t0
        return out

    def _small(self, a: np.ndarray) -> torch.Tensor:
        """A small host array on the device; on CUDA through pinned memory, without the
        stream synchronisation a copy from pageable memory makes."""
        import torch

        t = torch.from_numpy(np.ascontiguousarray(a))
        return t.pin_memory().to(self.device, non_blocking=True) if self.cuda else t

    def download(self, values: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``values`` on the host: on CUDA copied into pinned memory without waiting (the
        event says when it is there)."""
        import torch

        if not self.cuda:
            return values, None
        host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        host.copy_(values, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return host, done

    def settle(self) -> None:
        """Add up the device time of the finished sections (CUDA)."""
        for start, end in self._events:
            end.synchronize()
            self.device_s += start.elapsed_time(end) / 1000
        self._events.clear()


def _run(engine: Engine, tiling: Tiling, batch: int, loaded: Iterable[Loaded],
         put: Any) -> tuple[float, float, float]:
    """Predict every loaded section and ``put(chrom, start, values)`` them in order; return
    the device's seconds, the seconds spent waiting for the readers and in ``put`` (for the
    writers)."""
    import torch

    pred = _SectionPredictor(engine, tiling, batch)
    lag = 1 if pred.cuda else 0  # a section's values are read back one section later
    pending: deque[tuple[Section, torch.Tensor, Any]] = deque()
    waits = [0.0, 0.0]  # readers, writers

    def timed_put(chrom: str, start: int, values: np.ndarray) -> None:
        t = time.perf_counter()
        put(chrom, start, values)
        waits[1] += time.perf_counter() - t

    sections = iter(loaded)
    with torch.inference_mode():
        while True:
            t = time.perf_counter()
            item = next(sections, None)
            waits[0] += time.perf_counter() - t
            if item is None:
                break
            sec = item.region.tag
            arrays = pred.upload([a for a in item.arrays if a is not None])
            if pred.cuda:
                item.release()  # copied: the reader may refill its slot
            values = pred.run(sec, arrays)
            item.release()
            pending.append((sec, *pred.download(values)))
            while len(pending) > lag:
                _emit(pending.popleft(), timed_put)
        while pending:
            _emit(pending.popleft(), timed_put)
    pred.settle()
    return pred.device_s, waits[0], waits[1]


def _emit(item: tuple[Section, torch.Tensor, Any], put: Any) -> None:
    sec, host, done = item
    if done is not None:
        done.synchronize()
    put(sec.chrom, sec.lo, host.numpy())


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
                       amp: bool = False, stride: int | None = None,
                       section_bp: int | None = None) -> np.ndarray:
    """Per-base probabilities (float32) of one chromosome held in memory. ``model`` is a
    trained :class:`~tunelab.leopard.model.LeopardUNet` (predicted in fp32, or with the
    precision :mod:`~tunelab.leopard.runtime` picks when ``amp``) or a prepared ``Engine``."""
    tiling = Tiling.make(window, edge, stride)
    engine = _engine_for(model, device, window, batch_size, amp)
    if engine.in_channels == 6 and dnase_avg is None:
        raise LeopardError("a 6-channel model needs the average DNase track (dnase_avg)")
    n = len(seq)
    diff = None if engine.in_channels == 5 else np.asarray(dnase - dnase_avg, np.float32)
    sections = plan_sections(tiling, "chrom", n, section_bp or SECTION_BP["cpu"])

    def loaded() -> Iterator[Loaded]:
        for sec in sections:
            r = sec.region(window)
            yield Loaded(r, (seq[r.start:r.end], np.asarray(dnase[r.start:r.end], np.float32),
                             None if diff is None else diff[r.start:r.end]))

    out = np.empty(n, np.float32)

    def put(_: str, start: int, values: np.ndarray) -> None:
        out[start:start + len(values)] = values

    _run(engine, tiling, batch_size, loaded(), put)
    return out


def read_during_runtime_choice(device_type: str) -> bool:
    """Whether prediction's readers start before its runtime is chosen and read meanwhile:
    on a GPU, where the choice runs (CUDA's start, the capture, its probe); not on a CPU,
    whose probe of the cores they would disturb."""
    return device_type == "cuda"


def pipeline_workers(device_type: str, cores: int, engine_threads: int,
                     readers: int | None, writers: int | None) -> tuple[int, int, bool]:
    """``(reader processes, writer threads, background writing)``: the cores the engine leaves
    free (a GPU leaves all but the main thread's) split between reading and writing;
    ``readers`` / ``writers`` override. Beside an engine that uses every core, a reader or
    writer stalls all of its threads at each parallel step (a 2-core machine predicted ~1.5x
    faster without them), so there everything runs in turn."""
    free = max(cores - 1, 0) if device_type == "cuda" else max(cores - engine_threads, 0)
    r = (free + 1) // 2 if readers is None else readers
    w = free // 2 if writers is None else writers
    if r < 0 or w < 0:
        raise LeopardError(f"readers and writers must be >= 0, got {readers}, {writers}")
    return r, w, free > 0 or w > 0


#: windows per forward pass when not asked: a GPU wants fuller batches than a CPU
BATCH = {"cuda": 256, "cpu": 32}


def predict_genome(checkpoint: str | Path, data: str | Path, out: str | Path,
                   chroms: list[str] | None = None, batch_size: int | None = None,
                   edge: int | None = None, device: str = "auto", *,
                   window: int | None = None, stride: int | None = None,
                   precision: str = "auto", compile: str = "auto",
                   threads: int | None = None, zoom_levels: int = 0,
                   readers: int | None = None, writers: int | None = None,
                   section_bp: int | None = None) -> dict[str, Any]:
    """Predict ``chroms`` (default: the manifest's test split) of a data set into ``out``.

    ``window`` defaults to the training window, ``edge`` to an eighth of the training window
    (the context the network learnt with; ample for its ~1.2 kb receptive field), ``stride``
    to ``window - 2 * edge``. A bigWig gets ``zoom_levels`` summary levels (0 by default:
    computing them when the file is closed cost about as much as predicting, here).
    ``batch_size`` defaults to :data:`BATCH` of the device, ``readers`` (processes) and
    ``writers`` (threads) to the cores the engine leaves free (:func:`pipeline_workers`),
    ``section_bp`` to :data:`SECTION_BP` of the device.

    Returns ``bp``, ``seconds`` (the device's work: encoding, forward passes, stitching),
    ``bp_per_s``, ``bp_per_s_end_to_end`` and ``wall_s`` (this call from loading the
    checkpoint to the track closed: loading the model, choosing the runtime, reading,
    predicting, writing; not the process's start and imports nor the CPU bound measured
    after it, which ``tunelab leopard predict`` adds as ``process_s``), ``window``,
    ``stride``, ``edge``, ``precision``, ``compiled``, ``graphed``, ``threads``, ``readers``,
    ``writers``, ``sections``,
    ``runtime`` (one line saying what was chosen and why) and ``phases``: where the wall time
    went (``load_s``: checkpoint and inputs checked; ``runtime_s``: the runtime chosen (on a
    GPU the readers are reading meanwhile); ``start_s``: writer and readers started;
    ``run_s``: sections read, predicted and handed to the writers, of which ``read_wait_s``
    waiting for the readers and ``write_wait_s`` for the writers; ``close_s``: the writers
    finishing, the file closed).
    """
    import torch

    from tunelab.leopard.data import load_manifest
    from tunelab.leopard.genomefiles import (
        check_bigwig_size,
        fasta_sizes,
        open_bigwig,
        open_fasta,
    )
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
    if batch_size is not None and batch_size < 1:
        raise LeopardError(f"batch size must be at least 1, got {batch_size}")
    if section_bp is not None and section_bp < 1:
        raise LeopardError(f"section length must be at least 1 bp, got {section_bp}")
    tiling = Tiling.make(window, edge, stride)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    batch_size = batch_size or BATCH.get(torch.device(device).type, BATCH["cpu"])
    m = load_manifest(data)
    fa = open_fasta(m.fasta)
    all_sizes = fasta_sizes(fa)
    fa.close()
    chroms = chroms or m.chromosomes("test")
    for c in chroms:
        if c not in all_sizes:
            raise LeopardError(f"{m.fasta}: no chromosome {c!r} to predict")
    if arch.in_channels == 6 and m.dnase_avg is None:
        raise LeopardError(f"{m.path}: a 6-channel model needs 'dnase_avg'")
    tracks = Tracks(m.fasta, m.dnase, m.dnase_avg if arch.in_channels == 6 else None)
    for path, what in ((tracks.dnase, "DNase"), (tracks.dnase_avg, "average DNase")):
        if path is not None:  # names and lengths here; values are checked as they are read
            bw = open_bigwig(path, what)
            try:
                for c in chroms:
                    check_bigwig_size(bw, path, c, all_sizes[c])
            finally:
                bw.close()
    n_windows = sum(len(tiling.starts(max(all_sizes[c], window))) for c in chroms)
    t_load = time.perf_counter()
    dev_type = torch.device(device).type
    sections = [s for c in chroms for s in plan_sections(
        tiling, c, all_sizes[c], section_bp or SECTION_BP.get(dev_type, SECTION_BP["cpu"]))]
    longest = max(int(s.starts[-1]) + window - int(s.starts[0]) for s in sections)
    bp = sum(s.hi - s.lo for s in sections)
    regions = (s.region(window) for s in sections)
    cores = len(os.sched_getaffinity(0))
    loaded: Reading | None = None
    try:
        if read_during_runtime_choice(dev_type):
            # (the engine's threads count on a CPU only)
            n_readers, n_writers, background = pipeline_workers(dev_type, cores, 1, readers,
                                                                writers)
            loaded = start_reading(tracks, regions, n_readers, longest)
        t_early = time.perf_counter()
        engine = prepare(model, device, precision, compile, threads, window, batch_size,
                         expected_windows=n_windows)
        t_runtime = time.perf_counter()
        if loaded is None:
            n_readers, n_writers, background = pipeline_workers(
                dev_type, cores, engine.runtime.threads, readers, writers)
            loaded = start_reading(tracks, regions, n_readers, longest)
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        writer = TrackWriter(out, [(c, all_sizes[c]) for c in chroms],
                             zoom_levels=zoom_levels, background=background, threads=n_writers)
        t_start = time.perf_counter()
        try:
            device_s, read_wait, write_wait = _run(engine, tiling, batch_size, loaded,
                                                   writer.put)
        finally:
            t_run = time.perf_counter()
            writer.close()
    finally:
        if loaded is not None:
            loaded.close()
    total = time.perf_counter() - t0
    phases = {"load_s": t_load - t0, "runtime_s": t_runtime - t_early,
              "start_s": (t_early - t_load) + (t_start - t_runtime), "run_s": t_run - t_start,
              "read_wait_s": read_wait, "write_wait_s": write_wait,
              "close_s": total - (t_run - t0)}
    rt = engine.runtime
    bound = _bound(arch, window, rt, n_windows, device_s) if dev_type == "cpu" else {}
    return {**bound, "bp": float(bp), "seconds": device_s, "bp_per_s": bp / max(device_s, 1e-9),
            "bp_per_s_end_to_end": bp / max(total, 1e-9), "wall_s": total,
            "window": float(window), "stride": float(tiling.stride),
            "edge": float(tiling.edge), "windows": float(n_windows),
            "precision": rt.precision, "compiled": rt.compiled, "graphed": rt.graphed,
            "threads": rt.threads, "readers": n_readers, "writers": n_writers,
            "sections": len(sections), "runtime": rt.summary(), "phases": phases}


def _bound(arch: Architecture, window: int, rt: Runtime, n_windows: int, device_s: float
           ) -> dict[str, float]:
    """The windows/s of the forward passes beside the CPU's GEMM rate in the precision they
    ran in, measured now with the engine's threads (:mod:`tunelab.leopard.bound`)."""
    from tunelab.leopard.bound import measure_bound
    from tunelab.leopard.model import flops_per_window
    from tunelab.leopard.runtime import probe_bounds

    bound = measure_bound(rt.precision, flops_per_window(arch, window, train=False),
                          threads=rt.threads)
    rate = n_windows / max(device_s, 1e-9)
    for _ in range(2):  # measured under a busier moment than the run's: again
        if bound.fraction(rate) <= 1:
            break
        bound = bound.remeasured()
    probe_bounds(rt, arch, bound)  # the runtime line's probed rates beside their bounds
    return {"windows_per_s": rate, "bound_fraction": bound.fraction(rate),
            "gemm_flops_per_s": bound.flops_per_s, "flops_per_window": bound.flops_per_window}
