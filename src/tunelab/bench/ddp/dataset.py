"""A dataset on disk, indexed: which files, how many samples, how many bytes, which layout.

Three layouts, the ones training jobs read (``tunelab bench ddp make-data`` writes each):

* ``jpeg-folder``: ImageNet's ``train/<class>/<name>.JPEG`` (the class is the directory
  holding the image), one sample per file;
* ``tar-shards``: WebDataset-style tar files, each holding samples as members that share a
  key (``000123.jpg`` with ``000123.cls``), read sequentially;
* ``npz-volumes``: one ``.npz`` per 3-D volume (arrays ``x`` float32 (1, D, H, W) and ``y``
  uint8 labels), MLPerf Storage's UNet3D format.

:func:`index_dataset` reads ``tunelab-dataset.json`` (written by make-data) when every file
it lists still has its recorded size, and otherwise scans the directory (for tar shards:
the member headers only). A shard cut short is indexed with the samples it still holds and
named in ``notes``. Every error is one line naming the directory or file.
"""

from __future__ import annotations

import json
import os
import stat
import tarfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tunelab.errors import WorkloadError

__all__ = ["LAYOUTS", "MANIFEST", "DatasetIndex", "Entry", "index_dataset", "shard_plan",
           "write_manifest"]

LAYOUTS = ("jpeg-folder", "tar-shards", "npz-volumes")
MANIFEST = "tunelab-dataset.json"
MAX_FILES = 10_000_000
MAX_MANIFEST_BYTES = 1 << 30
MAX_FILE_BYTES = 4 << 30
MAX_SHARD_MEMBERS = 1_000_000
IMAGE_EXTS = (".jpg", ".jpeg")


@dataclass(frozen=True)
class Entry:
    """One file: its path relative to the root, size in bytes, samples it holds, and the
    class label of a JPEG (-1 where the file carries its own labels)."""

    path: str
    size: int
    samples: int = 1
    label: int = -1


@dataclass(frozen=True)
class DatasetIndex:
    """The files of a dataset and what they hold."""

    root: str
    layout: str
    entries: tuple[Entry, ...]
    like: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def samples(self) -> int:
        """Samples in all files."""
        return sum(e.samples for e in self.entries)

    @property
    def bytes(self) -> int:
        """Bytes in all files."""
        return sum(e.size for e in self.entries)

    @property
    def unit(self) -> str:
        """What a sample is: images or volumes."""
        return "volumes" if self.layout == "npz-volumes" else "images"

    def path(self, entry: Entry) -> str:
        """The absolute path of ``entry``."""
        return os.path.join(self.root, entry.path)

    def paths(self) -> list[str]:
        """Every file's absolute path."""
        return [self.path(e) for e in self.entries]


def _layout_of(name: str) -> str | None:
    low = name.lower()
    if low.endswith(IMAGE_EXTS):
        return "jpeg-folder"
    if low.endswith(".tar"):
        return "tar-shards"
    if low.endswith(".npz"):
        return "npz-volumes"
    return None


def _scan_files(root: Path) -> tuple[str, list[tuple[str, int]]]:
    """(layout, [(relative path, size)]) of every sample file below ``root``, sorted."""
    found: dict[str, list[tuple[str, int]]] = {}
    count = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            layout = _layout_of(name)
            if layout is None:
                continue
            count += 1
            if count > MAX_FILES:
                raise WorkloadError(f"--data files:{root}: more than {MAX_FILES:,} files")
            full = os.path.join(dirpath, name)
            try:
                info = os.stat(full)
            except OSError as exc:
                raise WorkloadError(f"cannot read {full}: {exc.strerror}") from None
            if not stat.S_ISREG(info.st_mode):  # a FIFO would block a loader for ever
                raise WorkloadError(f"{full}: not a regular file (a sample must be one)")
            size = info.st_size
            found.setdefault(layout, []).append((os.path.relpath(full, root), size))
    if not found:
        raise WorkloadError(f"--data files:{root}: no samples found (looked for .jpg/.jpeg "
                            "images, .tar shards and .npz volumes; make one with tunelab "
                            "bench ddp make-data)")
    if len(found) > 1:
        kinds = ", ".join(f"{len(v)} {k}" for k, v in sorted(found.items()))
        raise WorkloadError(f"--data files:{root}: mixes layouts ({kinds}); keep one per "
                            "directory")
    layout, files = next(iter(found.items()))
    return layout, files


def _labels(files: Sequence[tuple[str, int]]) -> list[int]:
    """Class numbers: the sorted names of the directories holding the images."""
    classes = sorted({str(Path(p).parent) for p, _ in files})
    number = {c: i for i, c in enumerate(classes)}
    return [number[str(Path(p).parent)] for p, _ in files]


def scan_shard(path: str) -> tuple[int, str | None]:
    """Samples a tar shard holds whole (keys with an image and a ``.cls`` member whose data
    lies inside the file), reading member headers only; and why it ends early (None when
    it is whole)."""
    parts: dict[str, set[str]] = {}
    members = 0
    problem = None
    try:
        size = os.path.getsize(path)
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                members += 1
                if members > MAX_SHARD_MEMBERS:
                    problem = f"more than {MAX_SHARD_MEMBERS:,} members"
                    break
                if not member.isfile() or member.offset_data + member.size > size:
                    continue
                key, _, ext = member.name.rpartition(".")
                parts.setdefault(key, set()).add(ext.lower())
    except (tarfile.TarError, EOFError, OSError) as exc:
        problem = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    whole = sum(1 for exts in parts.values()
                if "cls" in exts and any(e[1:] in exts for e in IMAGE_EXTS))
    return whole, problem


def _from_manifest(root: Path) -> DatasetIndex | None:
    path = root / MANIFEST
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_MANIFEST_BYTES:
            return None
        with path.open("rb") as f:  # a manifest tunelab wrote is one JSON object
            if f.read(2) != b'{"':
                return None
        doc = json.loads(path.read_text())
        layout = doc["layout"]
        entries = tuple(Entry(**e) for e in doc["entries"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if layout not in LAYOUTS or len(entries) > MAX_FILES:
        return None
    for e in entries:
        try:
            if os.stat(root / e.path).st_size != e.size:
                return None
        except OSError:
            return None
    return DatasetIndex(str(root), layout, entries, like=str(doc.get("like", "")))


def index_dataset(directory: str | Path) -> DatasetIndex:
    """Index the dataset in ``directory`` (see the module docstring)."""
    root = Path(directory).expanduser()
    if not root.exists():
        raise WorkloadError(f"--data files:{directory}: no such directory")
    if not root.is_dir():
        raise WorkloadError(f"--data files:{directory}: not a directory")
    root = root.resolve()
    cached = _from_manifest(root)
    if cached is not None:
        return cached
    layout, files = _scan_files(root)
    for rel, size in files:
        if size > MAX_FILE_BYTES:
            raise WorkloadError(f"{root / rel}: {size:,} bytes is more than the limit of "
                                f"{MAX_FILE_BYTES:,} per file")
    notes: list[str] = []
    if layout == "jpeg-folder":
        entries = [Entry(rel, size, 1, label)
                   for (rel, size), label in zip(files, _labels(files), strict=True)]
    elif layout == "tar-shards":
        entries = []
        for rel, size in files:
            n, problem = scan_shard(str(root / rel))
            if problem is not None:
                notes.append(f"shard {root / rel} is damaged after {n} readable samples "
                             f"({problem}); the rest is skipped")
            entries.append(Entry(rel, size, n))
    else:
        entries = [Entry(rel, size) for rel, size in files]
    return DatasetIndex(str(root), layout, tuple(entries), notes=tuple(notes))


def write_manifest(index: DatasetIndex, extra: dict[str, Any] | None = None) -> Path:
    """Write ``tunelab-dataset.json`` into the dataset's root (atomically)."""
    doc = {"layout": index.layout, "like": index.like, "samples": index.samples,
           "bytes": index.bytes, **(extra or {}),
           "entries": [asdict(e) for e in index.entries]}
    path = Path(index.root) / MANIFEST
    tmp = path.with_name(f".{MANIFEST}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)
    return path


def shard_plan(index: DatasetIndex, epoch: int, seed: int, world: int, loaders: int,
               batch: int) -> tuple[list[list[list[int]]], int]:
    """Which shards each rank's loader processes read in ``epoch`` (shards shuffled by
    ``seed`` and the epoch, dealt to the ranks, then to each rank's loaders) and the steps
    every rank can take (each loader batches its own stream and drops its remainder): the
    fewest over the ranks. ``plan[rank][loader]`` lists entry indices."""
    import numpy as np

    order = np.random.default_rng([seed, epoch]).permutation(len(index.entries)).tolist()
    streams = max(1, loaders)
    plan: list[list[list[int]]] = []
    steps = []
    for rank in range(world):
        mine = order[rank::world]
        per_loader = [mine[w::streams] for w in range(streams)]
        plan.append(per_loader)
        steps.append(sum(sum(index.entries[i].samples for i in idx) // batch
                         for idx in per_loader))
    return plan, min(steps) if steps else 0
