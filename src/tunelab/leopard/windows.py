"""Pre-extracted windows in ``.npz`` files: ``train.npz``, ``val.npz``, ``test.npz``.

Each file holds ``seq`` (n, L) uint8 codes, ``dnase`` (n, L) float32, optionally
``dnase_avg`` (n, L) float32, ``label`` (n, L) int8 in {-1, 0, 1}, ``chrom`` (n,) names and
``start`` (n,) int64. Reading them costs one ``np.load``: no FASTA or bigWig parsing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tunelab.leopard.data import (
    SPLITS,
    ChromosomeSet,
    WindowBatch,
    load_chromosomes,
    load_manifest,
)
from tunelab.leopard.errors import LeopardError

__all__ = ["WindowArrays", "WindowSource", "extract_windows", "load_windows", "save_windows"]


@dataclass
class WindowArrays:
    """A fixed set of windows held in memory."""

    batch: WindowBatch
    chrom: np.ndarray
    start: np.ndarray
    source: str = ""

    def __len__(self) -> int:
        return len(self.batch)

    @property
    def window(self) -> int:
        """Window length in bp."""
        return int(self.batch.seq.shape[1])

    def take(self, idx: np.ndarray) -> WindowBatch:
        """The windows at indices ``idx``."""
        b = self.batch
        return WindowBatch(seq=b.seq[idx], dnase=b.dnase[idx], label=b.label[idx],
                           dnase_avg=None if b.dnase_avg is None else b.dnase_avg[idx])


def save_windows(path: Path, arrays: WindowArrays) -> None:
    """Write ``arrays`` to ``path`` (uncompressed: loading speed matters more than size)."""
    b = arrays.batch
    extra = {} if b.dnase_avg is None else {"dnase_avg": b.dnase_avg}
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, seq=b.seq, dnase=b.dnase, label=b.label, chrom=arrays.chrom,
             start=arrays.start, **extra)  # type: ignore[arg-type]
    tmp.replace(path)


def load_windows(path: Path) -> WindowArrays:
    """Read a window file, checking array names, shapes, dtypes and values."""
    if not path.is_file():
        raise LeopardError(f"{path}: window file not found")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (OSError, ValueError) as exc:
        raise LeopardError(f"{path}: not a readable .npz window file ({exc})") from exc
    for key in ("seq", "dnase", "label"):
        if key not in data:
            raise LeopardError(f"{path}: window file lacks the array {key!r}")
    shape = data["seq"].shape
    if len(shape) != 2:
        raise LeopardError(f"{path}: 'seq' must be 2-D (windows, length), got {shape}")
    for key in ("dnase", "label", "dnase_avg"):
        if key in data and data[key].shape != shape:
            raise LeopardError(f"{path}: {key!r} has shape {data[key].shape}, 'seq' {shape}")
    for key in ("dnase", "dnase_avg"):
        if key in data and not np.isfinite(data[key]).all():
            raise LeopardError(f"{path}: NaN or infinite value in {key!r}")
    n = shape[0]
    batch = WindowBatch(seq=data["seq"].astype(np.uint8, copy=False),
                        dnase=data["dnase"].astype(np.float32, copy=False),
                        label=data["label"].astype(np.int8, copy=False),
                        dnase_avg=(data["dnase_avg"].astype(np.float32, copy=False)
                                   if "dnase_avg" in data else None))
    return WindowArrays(batch=batch,
                        chrom=data.get("chrom", np.asarray([""] * n)),
                        start=data.get("start", np.zeros(n, dtype=np.int64)),
                        source=str(path))


def _from_chromosomes(cs: ChromosomeSet, starts: np.ndarray, window: int) -> WindowArrays:
    which, local = cs.locate(starts)
    return WindowArrays(batch=cs.gather(starts, window),
                        chrom=np.asarray(cs.names)[which], start=local, source=cs.source)


def extract_windows(manifest_path: str | Path, out_dir: str | Path, window: int,
                    n_train: int, max_eval: int | None = None, seed: int = 0,
                    with_avg: bool | None = None, multiple: int = 32) -> dict[str, int]:
    """Cut windows from a data set into ``out_dir/{train,val,test}.npz``.

    Training windows are ``n_train`` length-proportional random draws; validation and test
    windows tile their chromosomes (at most ``max_eval`` of them, a seeded subset).
    Returns the number of windows per split.
    """
    if window <= 0 or window % multiple:
        raise LeopardError(f"window length {window} is not divisible by {multiple}")
    m = load_manifest(manifest_path)
    avg = m.dnase_avg is not None if with_avg is None else with_avg
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    counts = {}
    for split in SPLITS:
        cs = load_chromosomes(m, m.chromosomes(split), need_avg=avg)
        if split == "train":
            starts = np.sort(cs.sample_starts(n_train, window, rng))
        else:
            starts = eval_starts(cs, window, max_eval, seed)
        if len(starts) == 0:
            raise LeopardError(f"{m.path}: the {split} chromosomes are shorter than the "
                               f"window ({window} bp)")
        save_windows(out / f"{split}.npz", _from_chromosomes(cs, starts, window))
        counts[split] = len(starts)
    return counts


def eval_starts(cs: ChromosomeSet, window: int, max_eval: int | None, seed: int) -> np.ndarray:
    """Evaluation windows: a tiling of the chromosomes, or a seeded subset of ``max_eval``."""
    starts = cs.tile_starts(window)
    if max_eval is not None and 0 < max_eval < len(starts):
        pick = np.random.default_rng(seed + 7919).choice(len(starts), max_eval, replace=False)
        starts = np.sort(starts[pick])
    return starts


class WindowSource:
    """Windows by id: a genome (ids are global starts) or fixed arrays (ids are indices)."""

    def __init__(self, cs: ChromosomeSet | None, arrays: WindowArrays | None, window: int,
                 name: str) -> None:
        self.cs, self.arrays, self.window, self.name = cs, arrays, window, name

    def n_distinct(self) -> int:
        if self.arrays is not None:
            return len(self.arrays)
        assert self.cs is not None
        return self.cs.n_positions(self.window)

    def bases(self) -> int:
        if self.arrays is not None:
            return len(self.arrays) * self.window
        assert self.cs is not None
        return self.cs.total_length

    def plan(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.arrays is not None:
            k = math.ceil(n / len(self.arrays))
            return np.concatenate([rng.permutation(len(self.arrays)) for _ in range(k)])[:n]
        assert self.cs is not None
        return self.cs.sample_starts(n, self.window, rng)

    def eval_ids(self, max_eval: int | None, seed: int, drawn: int | None = None) -> np.ndarray:
        """Evaluation windows: every array, or a tiling of the genome (a seeded subset of
        ``max_eval``); with ``drawn``, that many windows drawn as training windows are (a
        seeded set, the same every epoch)."""
        rng = np.random.default_rng(seed + 7919)
        if self.arrays is not None:
            if drawn:
                return np.sort(rng.integers(0, len(self.arrays), drawn))
            return np.arange(len(self.arrays))
        assert self.cs is not None
        if drawn:
            return np.sort(self.cs.sample_starts(drawn, self.window, rng))
        return eval_starts(self.cs, self.window, max_eval, seed)

    def check_labels(self, split: str, ids: np.ndarray | None = None, where: str = "",
                     chunk: int = 256) -> None:
        """Refuse (one line) windows without a single bound base (label 1), all of the
        source (``ids`` None) or those of ``ids``: a model trained on them learns nothing,
        and their PR-AUC is undefined (Keras would print 0, as if the model were wrong)."""
        if ids is None:
            label = self.arrays.batch.label if self.arrays is not None else (
                self.cs.label if self.cs is not None else np.zeros(0, np.int8))
            if (label == 1).any():
                return
            what = ("every base is labelled -1 (ignored)" if label.size and (label < 0).all()
                    else "no base is labelled bound (1)")
            raise LeopardError(f"{where or self.name}: {what} in the {split} data: a model would "
                               "learn nothing and PR-AUC is undefined; check the labels")
        for i in range(0, len(ids), chunk):
            if (self.get(ids[i:i + chunk]).label == 1).any():
                return
        raise LeopardError(f"{self.name}: the {len(ids)} {split} windows evaluated hold no "
                           "bound base (label 1), so PR-AUC is undefined; evaluate more "
                           "windows (--max-eval-windows 0: all)")

    def get(self, ids: np.ndarray) -> WindowBatch:
        if self.arrays is not None:
            return self.arrays.take(ids)
        assert self.cs is not None
        return self.cs.gather(ids, self.window)
