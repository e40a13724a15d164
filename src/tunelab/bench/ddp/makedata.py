"""``tunelab bench ddp make-data DIR --like imagenet|unet3d --samples N``: a seeded dataset
whose samples weigh what the real ones weigh (scale the count to the disk, not the size).

* ``imagenet``: JPEG images whose sizes follow a log-normal law with the mean of MLPerf
  Storage's ResNet-50 records (114,660 bytes, about 112 KiB; ImageNet's training JPEGs
  average about 110 KB), in ImageNet's shapes (4:3, 3:4, 3:2, 2:3, 1:1); the content is a
  smooth colour field plus luminance texture, whose strength is chosen per image to reach
  its drawn size (one re-encode corrects a miss of more than 15 %). Layout ``folder``
  (``DIR/n00000042/n00000042_1234.JPEG``, 1,000 classes) or ``shards`` (WebDataset tar files
  of 1,251 samples, ``00001234.jpg`` + ``00001234.cls``: 1,024 such files hold ImageNet).
* ``unet3d``: one ``case_NNNNN.npz`` per volume (``x`` float32 (1, D, 256, 256), ``y`` uint8
  labels 0-2), sizes drawn from a normal law with MLPerf Storage's UNet3D mean and standard
  deviation (146,600,628 and 68,341,808 bytes), at least 128 slices.

Samples are made in parallel processes (numpy and Pillow; no per-pixel Python), each from
its own seed ``(seed, index)``, so a dataset is the same whatever the process count.
``--sample-scale`` (tests only) shrinks every sample; the manifest records it.
"""

from __future__ import annotations

import io
import math
import os
import shutil
import tarfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunelab.bench.ddp.dataset import DatasetIndex, Entry, write_manifest
from tunelab.errors import WorkloadError

__all__ = ["IMAGENET_MEAN_BYTES", "LIKE", "UNET3D_MEAN_BYTES", "UNET3D_STD_BYTES",
           "MakeDataConfig", "jpeg_target_bytes", "make_dataset", "make_jpeg", "volume_shape"]

LIKE = ("imagenet", "unet3d")
IMAGENET_MEAN_BYTES = 114_660      # MLPerf Storage resnet50 record_length_bytes
IMAGENET_LOG_SIGMA = 0.55          # spread of the log-normal law of image sizes
IMAGENET_MIN_BYTES, IMAGENET_MAX_BYTES = 6_000, 2_000_000
UNET3D_MEAN_BYTES = 146_600_628    # MLPerf Storage unet3d record_length_bytes
UNET3D_STD_BYTES = 68_341_808      # ... record_length_bytes_stdev
UNET3D_SIDE = 256
UNET3D_MIN_SLICES = 128
MAX_SAMPLES = 10_000_000
JPEG_QUALITY = 90
# measured bytes per pixel of the generated content at JPEG quality 90, by texture strength
_BPP = (0.178, 0.249, 0.356, 0.472, 0.596, 0.737, 0.879)
_SIGMA = (1.0, 3.0, 6.0, 12.0, 25.0, 50.0, 90.0)
_ASPECTS = (4 / 3, 3 / 4, 3 / 2, 2 / 3, 1.0)
_ASPECT_P = (0.5, 0.15, 0.15, 0.05, 0.15)


@dataclass(frozen=True)
class MakeDataConfig:
    """What make-data writes."""

    directory: str
    like: str
    samples: int
    layout: str = "folder"
    seed: int = 0
    classes: int = 1000
    shard_samples: int = 1251
    scale: float = 1.0
    jobs: int = 0

    def validate(self) -> MakeDataConfig:
        """Self, or a one-line :class:`WorkloadError`."""
        if self.like not in LIKE:
            raise WorkloadError(f"--like: unknown value {self.like!r}; choose one of "
                                f"{', '.join(LIKE)}")
        if not 1 <= self.samples <= MAX_SAMPLES:
            raise WorkloadError(f"--samples must lie in 1..{MAX_SAMPLES:,}, got {self.samples}")
        layouts = ("folder", "shards") if self.like == "imagenet" else ("npz",)
        if self.layout not in layouts:
            raise WorkloadError(f"--layout {self.layout!r} does not fit --like {self.like}; "
                                f"choose one of {', '.join(layouts)}")
        if not 1 <= self.classes <= 100_000:
            raise WorkloadError(f"--classes must lie in 1..100000, got {self.classes}")
        if not 1 <= self.shard_samples <= 100_000:
            raise WorkloadError(f"--shard-samples must lie in 1..100000, got "
                                f"{self.shard_samples}")
        if not (math.isfinite(self.scale) and 1e-6 <= self.scale <= 1.0):
            raise WorkloadError(f"--sample-scale must lie in [1e-6, 1], got {self.scale}")
        if not 0 <= self.jobs <= 1024:
            raise WorkloadError(f"--jobs must lie in 0..1024, got {self.jobs}")
        return self

    @property
    def mean_bytes(self) -> float:
        """The mean sample size aimed at."""
        base = IMAGENET_MEAN_BYTES if self.like == "imagenet" else UNET3D_MEAN_BYTES
        return base * self.scale


# ---------------------------------------------------------------------------------- images


def _sigma_for(bpp: float) -> float:
    """Texture strength that gives ``bpp`` bytes per pixel (log-linear interpolation)."""
    import numpy as np

    return float(np.exp(np.interp(bpp, _BPP, np.log(_SIGMA))))


def _render(rng: Any, w: int, h: int, sigma: float) -> bytes:
    import numpy as np
    from PIL import Image

    grid = rng.integers(0, 256, (max(2, h // 24), max(2, w // 24), 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(grid).resize((w, h), Image.Resampling.BICUBIC),
                     dtype=np.float32)
    img = img + rng.normal(0.0, sigma, (h, w, 1)).astype(np.float32)
    out = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(out, "JPEG",
                                                                quality=JPEG_QUALITY)
    return out.getvalue()


def _draw(rng: Any, scale: float) -> tuple[float, float, float]:
    """An image's target bytes, bytes per pixel and aspect ratio."""
    mu = math.log(IMAGENET_MEAN_BYTES) - IMAGENET_LOG_SIGMA ** 2 / 2
    target = float(min(max(rng.lognormal(mu, IMAGENET_LOG_SIGMA), IMAGENET_MIN_BYTES),
                       IMAGENET_MAX_BYTES)) * scale
    return target, float(rng.uniform(0.35, 0.65)), float(rng.choice(_ASPECTS, p=_ASPECT_P))


def jpeg_target_bytes(seed: int, index: int, scale: float = 1.0) -> float:
    """The size drawn for image ``index`` (its JPEG lands within 15 % of it)."""
    import numpy as np

    return _draw(np.random.default_rng([seed, index]), scale)[0]


def make_jpeg(seed: int, index: int, scale: float = 1.0) -> bytes:
    """Sample ``index`` of an ImageNet-like dataset: a JPEG of a drawn size."""
    import numpy as np

    rng = np.random.default_rng([seed, index])
    target, bpp, aspect = _draw(rng, scale)
    pixels = max(64.0, target / bpp)
    w = max(8, round(math.sqrt(pixels * aspect)))
    h = max(8, round(pixels / w))
    data = _render(rng, w, h, _sigma_for(bpp))
    got = len(data) / (w * h)
    if abs(len(data) - target) > 0.15 * target:  # correct a miss once
        data = _render(rng, w, h, _sigma_for(bpp + (bpp - got)))
    return data


def _jpeg_chunk(root: str, seed: int, indices: Sequence[int], classes: int,
                scale: float) -> list[Entry]:
    out = []
    for i in indices:
        label = i % classes
        folder = f"n{label:08d}"
        rel = os.path.join(folder, f"{folder}_{i}.JPEG")
        data = make_jpeg(seed, i, scale)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
        out.append(Entry(rel, len(data), 1, label))
    return out


def _shard(root: str, seed: int, shard: int, indices: Sequence[int], classes: int,
           scale: float) -> list[Entry]:
    rel = f"shard-{shard:06d}.tar"
    tmp = os.path.join(root, f".{rel}.tmp")
    with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in indices:
            for name, payload in ((f"{i:08d}.jpg", make_jpeg(seed, i, scale)),
                                  (f"{i:08d}.cls", str(i % classes).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                info.mtime = 0
                tar.addfile(info, io.BytesIO(payload))
    os.replace(tmp, os.path.join(root, rel))
    return [Entry(rel, os.path.getsize(os.path.join(root, rel)), len(indices))]


# --------------------------------------------------------------------------------- volumes


def volume_shape(seed: int, index: int, scale: float = 1.0) -> tuple[int, int, int]:
    """(slices, side, side) of volume ``index``: 5 bytes per voxel (float32 image + uint8
    labels) make its drawn size."""
    import numpy as np

    rng = np.random.default_rng([seed, index, 3])
    target = max(float(rng.normal(UNET3D_MEAN_BYTES, UNET3D_STD_BYTES)),
                 5.0 * UNET3D_MIN_SLICES * UNET3D_SIDE ** 2) * scale
    side = max(8, round(UNET3D_SIDE * scale ** (1 / 3)))
    slices = max(8, round(target / (5 * side * side)))
    return slices, side, side


def _volume(root: str, seed: int, index: int, scale: float) -> list[Entry]:
    import numpy as np

    d, h, w = volume_shape(seed, index, scale)
    rng = np.random.default_rng([seed, index])
    x = rng.standard_normal((1, d, h, w), dtype=np.float32)
    y = (x > 2.0).astype(np.uint8) + (x > 3.0).astype(np.uint8)  # sparse "kidney" and "tumour"
    rel = f"case_{index:05d}.npz"
    tmp = os.path.join(root, f".{rel}.tmp.npz")
    np.savez(tmp, x=x, y=y)
    os.replace(tmp, os.path.join(root, rel))
    return [Entry(rel, os.path.getsize(os.path.join(root, rel)))]


# ---------------------------------------------------------------------------------- driver


def _tasks(cfg: MakeDataConfig) -> list[tuple[Callable[..., list[Entry]], tuple[Any, ...], int]]:
    root = cfg.directory
    if cfg.like == "unet3d":
        return [(_volume, (root, cfg.seed, i, cfg.scale), 1) for i in range(cfg.samples)]
    if cfg.layout == "shards":
        k = cfg.shard_samples
        return [(_shard, (root, cfg.seed, s, range(s * k, min(cfg.samples, (s + 1) * k)),
                          cfg.classes, cfg.scale), min(cfg.samples, (s + 1) * k) - s * k)
                for s in range(math.ceil(cfg.samples / k))]
    chunk = 64
    return [(_jpeg_chunk, (root, cfg.seed, range(a, min(cfg.samples, a + chunk)), cfg.classes,
                           cfg.scale), min(cfg.samples, a + chunk) - a)
            for a in range(0, cfg.samples, chunk)]


def _size(nbytes: float) -> str:
    """Bytes in GB, or MB below 1 GB (so that a small disk's figures do not read 0.0 GB)."""
    return f"{nbytes / 1e9:,.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:,.1f} MB"


def _prepare_directory(cfg: MakeDataConfig) -> None:
    """Check the target and the free space first, then make the directory and the class
    folders; a one-line :class:`WorkloadError` (nothing left behind) otherwise."""
    root = Path(cfg.directory)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise WorkloadError(f"{root} exists and is not an empty directory; choose a new one")
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    need = cfg.samples * cfg.mean_bytes * 1.1
    try:
        free = shutil.disk_usage(existing).free
    except OSError as exc:
        raise WorkloadError(f"cannot create {root}: {exc.strerror}") from None
    if need > 0.9 * free:
        raise WorkloadError(f"about {_size(need)} needed, {_size(free)} free on the disk of "
                            f"{root}; make fewer samples")
    fresh = not root.exists()
    folders: list[Path] = []
    try:
        root.mkdir(parents=True, exist_ok=True)
        if cfg.like == "imagenet" and cfg.layout == "folder":
            for label in range(min(cfg.classes, cfg.samples)):
                folders.append(root / f"n{label:08d}")
                folders[-1].mkdir()
    except OSError as exc:
        for path in [root] if fresh else folders:
            shutil.rmtree(path, ignore_errors=True)
        raise WorkloadError(f"cannot create {exc.filename or root}: {exc.strerror}") from None


def make_dataset(cfg: MakeDataConfig,
                 progress: Callable[[int, int], None] | None = None) -> DatasetIndex:
    """Write the dataset ``cfg`` describes and its manifest; flush it to the disk (so its
    pages can be dropped for cold reads). ``progress(done, total)`` after every task."""
    cfg.validate()
    _prepare_directory(cfg)
    root = str(Path(cfg.directory).resolve())
    cfg = MakeDataConfig(**{**cfg.__dict__, "directory": root})
    jobs = cfg.jobs or os.cpu_count() or 1
    tasks = _tasks(cfg)
    entries: list[Entry] = []
    done = 0
    started = time.perf_counter()
    if progress:
        progress(0, cfg.samples)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(fn, *args): n for fn, args, n in tasks}
        for fut in as_completed(futures):
            try:
                entries.extend(fut.result())
            except OSError as exc:
                for other in futures:
                    other.cancel()
                raise WorkloadError(f"cannot write into {root}: "
                                    f"{exc.strerror or exc}") from None
            done += futures[fut]
            if progress:
                progress(done, cfg.samples)
    entries.sort(key=lambda e: e.path)
    layout = {"folder": "jpeg-folder", "shards": "tar-shards", "npz": "npz-volumes"}[cfg.layout]
    index = DatasetIndex(root, layout, tuple(entries), like=cfg.like)
    write_manifest(index, {"seed": cfg.seed, "sample_scale": cfg.scale,
                           "mean_sample_bytes": index.bytes / max(1, index.samples),
                           "made_s": round(time.perf_counter() - started, 3),
                           "generator": "tunelab bench ddp make-data"})
    os.sync()
    return index
