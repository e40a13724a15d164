"""Genome-wide prediction with a trained Leopard model.

Each chromosome is tiled with windows at two offsets, 0 and half a window (all starts are
multiples of ``window / 2``, plus one window flush with the chromosome's end). From every
window only the centre ``[edge, window - edge)`` is kept (the chromosome's own ends are kept
too), where the U-Net sees context on both sides; the kept predictions are averaged per base.
``edge <= window / 4`` guarantees every base is covered.

The hot path is batched: the chromosome's arrays sit on the device, a batch of windows is one
fancy-index gather, one forward pass and one ``index_add_`` into the per-base sums. Output is
a bigWig (``.bw``/``.bigwig``) or a bedGraph (anything else) of probabilities.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tunelab.leopard.errors import LeopardError

if TYPE_CHECKING:
    import torch

__all__ = ["predict_chromosome", "predict_genome"]


def predict_chromosome(model: torch.nn.Module, seq: np.ndarray, dnase: np.ndarray,
                       dnase_avg: np.ndarray | None, window: int, batch_size: int = 32,
                       edge: int | None = None, device: str | torch.device = "cpu",
                       amp: bool = False) -> np.ndarray:
    """Per-base probabilities (float32) of one chromosome."""
    import torch

    in_channels = model.arch.in_channels  # type: ignore[union-attr]
    if window % 2:
        raise LeopardError(f"window length {window} must be even")
    edge = window // 8 if edge is None else edge
    if not 0 <= edge <= window // 4:
        raise LeopardError(f"edge {edge} must lie in [0, window/4 = {window // 4}]")
    if in_channels == 6 and dnase_avg is None:
        raise LeopardError("a 6-channel model needs the average DNase track (dnase_avg)")
    n = len(seq)
    dev = torch.device(device)
    pad = max(0, window - n)
    length = n + pad
    seq_t = torch.from_numpy(np.pad(seq, (0, pad), constant_values=4)).to(dev)
    dn_t = torch.from_numpy(np.pad(dnase, (0, pad))).to(dev)
    diff_t = None
    if in_channels == 6:
        assert dnase_avg is not None
        diff_t = torch.from_numpy(np.pad(dnase - dnase_avg, (0, pad))).to(dev)
    half = window // 2
    starts = np.unique(np.concatenate([np.arange(0, length - window + 1, half),
                                       [length - window]])).astype(np.int64)
    base_w = torch.ones(window, device=dev)
    if edge:
        base_w[:edge] = 0
        base_w[window - edge:] = 0
    first_w = base_w.clone()
    first_w[:edge] = 1
    last_w = base_w.clone()
    if edge:
        last_w[window - edge:] = 1
    total = torch.zeros(length, dtype=torch.float32, device=dev)
    count = torch.zeros(length, dtype=torch.float32, device=dev)
    ar = torch.arange(window, device=dev)
    codes = torch.arange(4, device=dev, dtype=seq_t.dtype)[None, :, None]
    starts_t = torch.from_numpy(starts).to(dev)
    model.eval()
    with torch.no_grad():
        for i in range(0, len(starts_t), batch_size):
            s = starts_t[i:i + batch_size]
            idx = s[:, None] + ar[None, :]
            chans = [(seq_t[idx][:, None, :] == codes).float(), dn_t[idx][:, None, :]]
            if diff_t is not None:
                chans.append(diff_t[idx][:, None, :])
            x = torch.cat(chans, dim=1)
            with torch.autocast(dev.type, enabled=amp):
                p = torch.sigmoid(model(x).float())
            w = base_w.expand(len(s), window).clone()
            w[s == 0] = first_w
            w[s == length - window] = last_w if length - window > 0 else 1.0
            flat = idx.reshape(-1)
            total.index_add_(0, flat, (p * w).reshape(-1))
            count.index_add_(0, flat, w.reshape(-1))
    out = (total / count.clamp_min(1e-12))[:n]
    return out.float().cpu().numpy()


def _writer(path: Path, sizes: list[tuple[str, int]]) -> Any:
    if path.suffix.lower() in (".bw", ".bigwig"):
        import pyBigWig

        bw = pyBigWig.open(str(path), "w")
        if bw is None:
            raise LeopardError(f"{path}: cannot create the bigWig file")
        bw.addHeader(sizes)
        return bw
    return path.open("w")


def _write(handle: Any, chrom: str, values: np.ndarray, digits: int = 4) -> None:
    v = np.round(values.astype(np.float64), digits)
    if hasattr(handle, "addEntries"):
        handle.addEntries(chrom, 0, values=v, span=1, step=1)
        return
    change = np.flatnonzero(np.diff(v)) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [len(v)]])
    lines = [f"{chrom}\t{s}\t{e}\t{v[s]:.{digits}f}\n" for s, e in zip(
        starts.tolist(), ends.tolist(), strict=True)]
    handle.writelines(lines)


def predict_genome(checkpoint: str | Path, data: str | Path, out: str | Path,
                   chroms: list[str] | None = None, batch_size: int = 32,
                   edge: int | None = None, device: str = "auto") -> dict[str, float]:
    """Predict ``chroms`` (default: the manifest's test split) of a data set into ``out``.

    Returns ``bp``, ``seconds`` (prediction only), ``bp_per_s`` and ``bp_per_s_end_to_end``
    (including reading inputs and writing the track).
    """
    import torch

    from tunelab.leopard.data import fasta_sizes, load_chromosomes, load_manifest, open_fasta
    from tunelab.leopard.model import Architecture, LeopardUNet
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
    window = int(ck.get("window", 10240))
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       ("cpu" if device == "auto" else device))
    model.to(dev)
    m = load_manifest(data)
    fa = open_fasta(m.fasta)
    all_sizes = fasta_sizes(fa)
    chroms = chroms or m.chromosomes("test")
    for c in chroms:
        if c not in all_sizes:
            raise LeopardError(f"{m.fasta}: no chromosome {c!r} to predict")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    handle = _writer(out, [(c, all_sizes[c]) for c in chroms])
    seconds, bp = 0.0, 0
    try:
        for c in chroms:
            cs = load_chromosomes(m, [c], need_avg=arch.in_channels == 6)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            probs = predict_chromosome(model, cs.seq, cs.dnase, cs.dnase_avg, window,
                                       batch_size, edge, dev, amp=dev.type == "cuda")
            seconds += time.perf_counter() - t
            bp += len(probs)
            _write(handle, c, probs)
    finally:
        handle.close()
    total = time.perf_counter() - t0
    return {"bp": float(bp), "seconds": seconds, "bp_per_s": bp / max(seconds, 1e-9),
            "bp_per_s_end_to_end": bp / max(total, 1e-9), "window": float(window)}
