"""Samples read, decoded and batched inside data-loader processes, with the bytes counted.

Every batch is built by one thread (a loader process, or the training process itself with
``--loader-workers 0``) and carries a :class:`Batch` ``info`` dict: the samples it holds,
the bytes its files gave (``bytes``: counted as read), what the kernel counted for the same
thread over the same interval (``rchar``: bytes returned by read calls; ``device_bytes``:
bytes fetched from the block device, 0 on page-cache hits — both from
``/proc/thread-self/io``), the loader that made it, and the samples skipped as corrupt
(with their files).

* :class:`FileSamples` — map-style, one file per sample (JPEG folders, ``.npz`` volumes);
  the loader fetches a whole batch at once through ``__getitems__``.
* :class:`ShardStream` — iterable, WebDataset-style tar shards read sequentially; each
  loader process streams the shards the epoch's plan gives it and yields whole batches.
* :class:`MemorySamples` — decoded samples held in RAM (infinitely fast storage).

JPEGs are decoded with Pillow (torchvision 0.28's PyPI wheel ships ``torchvision.io``'s
decoders compiled for CUDA torch, which do not load against the CPU torch; see
docs/architecture.md) and cropped with torchvision's RandomResizedCrop parameters
(scale 0.08-1, aspect 3/4-4/3) to ``size`` x ``size``, flipped at random, as uint8 CHW.
"""

from __future__ import annotations

import io
import itertools
import os
import signal
import tarfile
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from torch.utils.data import IterableDataset

from tunelab.bench.ddp.cache import advise_files
from tunelab.bench.ddp.dataset import IMAGE_EXTS, DatasetIndex

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["Batch", "Decoder", "Encoded", "FileSamples", "MemorySamples", "ShardStream",
           "describe_error", "read_file", "thread_io"]

MAX_CORRUPT_NAMES = 5


class Batch(NamedTuple):
    """Inputs, targets and the accounting of one batch."""

    x: torch.Tensor
    y: torch.Tensor
    info: dict[str, Any]


class Encoded(NamedTuple):
    """The inputs of a ``--decode gpu`` batch: its files' bytes end to end in one uint8
    tensor, where each file ends, and their names (for a file the GPU cannot decode). One
    tensor crosses from a loader process as one shared-memory storage; a list of the files'
    tensors crossed as one storage (a file descriptor fetched over a socket) per file, about
    0.1-0.5 ms each, most of a batch's wait at 256 files."""

    data: torch.Tensor
    ends: tuple[int, ...]
    names: tuple[str, ...] = ()

    @staticmethod
    def join(files: Sequence[torch.Tensor], names: Sequence[str] = ()) -> Encoded:
        """The files' bytes (1-D uint8 tensors) end to end, with their names."""
        import torch

        data = torch.cat(list(files)) if files else torch.zeros(0, dtype=torch.uint8)
        return Encoded(data, tuple(itertools.accumulate(int(f.numel()) for f in files)),
                       tuple(names))

    def files(self) -> list[torch.Tensor]:
        """Each file's bytes: views of :attr:`data`."""
        starts = (0, *self.ends)[:len(self.ends)]
        return [self.data[a:b] for a, b in zip(starts, self.ends, strict=True)]

    def name(self, i: int) -> str:
        """File ``i``'s name (its place in the batch where names were not kept)."""
        return self.names[i] if i < len(self.names) else f"file {i + 1} of the batch"

    def without(self, drop: set[int]) -> Encoded:
        """The same batch without the files ``drop`` (their indices)."""
        keep = [i for i in range(len(self.ends)) if i not in drop]
        files = self.files()
        return Encoded.join([files[i] for i in keep],
                            [self.name(i) for i in keep] if self.names else ())


def thread_io() -> tuple[int, int] | None:
    """(rchar, read_bytes) of the calling thread, or None where the kernel has no
    per-task I/O accounting."""
    try:
        with open("/proc/thread-self/io", "rb") as f:
            text = f.read()
    except OSError:
        return None
    fields = dict(line.split(b": ") for line in text.splitlines() if b": " in line)
    return int(fields[b"rchar"]), int(fields[b"read_bytes"])


def read_file(path: str) -> bytes:
    """The whole file, through unbuffered read calls (what ``rchar`` counts)."""
    with open(path, "rb", buffering=0) as f:
        return f.readall()


def will_need(paths: Sequence[str]) -> None:
    """Ask the kernel to start reading all of ``paths`` now (``POSIX_FADV_WILLNEED``), so a
    batch's cold reads are queued to the device together instead of one file after
    another (a deep queue, as DLIO's parallel TFRecord reads have); the reads that follow
    find the pages arriving or there. Files that cannot be opened are left to the read that
    reports them."""
    advise_files(paths, os.POSIX_FADV_WILLNEED)


def _loader_id() -> int:
    import torch.utils.data as tud

    info = tud.get_worker_info()
    return -1 if info is None else int(info.id)


class _Account:
    """Counts one batch: bytes read, the kernel's view of the same interval, corrupt samples."""

    def __init__(self) -> None:
        self.start = thread_io()
        self.bytes = 0
        self.samples = 0
        self.corrupt = 0
        self.corrupt_files: list[str] = []
        self.fatal = ""

    def bad(self, where: str, why: str, fail: bool) -> None:
        self.corrupt += 1
        text = f"{where} ({why})"
        if len(self.corrupt_files) < MAX_CORRUPT_NAMES:
            self.corrupt_files.append(text)
        if fail and not self.fatal:
            self.fatal = f"corrupt sample {text}"

    def info(self) -> dict[str, Any]:
        end = thread_io()
        rchar = dev = -1
        if self.start is not None and end is not None:
            rchar, dev = end[0] - self.start[0], end[1] - self.start[1]
        return {"samples": self.samples, "bytes": self.bytes, "rchar": rchar,
                "device_bytes": dev, "loader": _loader_id(), "corrupt": self.corrupt,
                "corrupt_files": self.corrupt_files, "fatal": self.fatal,
                "ready": time.monotonic()}


class Decoder:
    """Bytes of one sample -> (input tensor, target tensor).

    ``images``: a JPEG -> uint8 (3, size, size), label from the index. ``volumes``: an
    ``.npz`` with ``x`` (1, D, H, W) float32 and ``y`` uint8 -> a random ``patch``^3 crop
    (zero-padded where the volume is smaller). With ``decode=False`` the bytes are read and
    dropped, and a zero sample of the decoded shape stands in (MLPerf Storage's method); with
    ``encoded=True`` the bytes themselves are the sample (decoded on the GPU later).
    """

    def __init__(self, unit: str, size: int, patch: int, decode: bool,
                 encoded: bool = False) -> None:
        self.unit = unit
        self.size = size
        self.patch = patch
        self.decode = decode
        #: keep the file's bytes (a 1-D uint8 tensor) for the GPU to decode (--decode gpu)
        self.encoded = encoded
        self._blank: tuple[torch.Tensor, torch.Tensor] | None = None

    def shape(self) -> tuple[int, ...]:
        """Shape of one decoded input."""
        if self.unit == "images":
            return (3, self.size, self.size)
        return (1, self.patch, self.patch, self.patch)

    def blank(self, label: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A zero sample of the decoded shape (and its target); the same tensors every time
        (a batch of blanks is one expanded view, not copies)."""
        import torch

        if self._blank is None:
            p = self.patch
            self._blank = ((torch.zeros(self.shape(), dtype=torch.uint8),
                            torch.zeros((), dtype=torch.long)) if self.unit == "images" else
                           (torch.zeros(self.shape()), torch.zeros((p, p, p), dtype=torch.uint8)))
        x, y = self._blank
        if self.unit == "images":
            return x, torch.tensor(max(label, 0))
        return x, y

    def __call__(self, data: bytes, label: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode ``data``; raises ValueError (or Pillow's and numpy's errors) if corrupt."""
        if self.encoded:  # decoded on the GPU later; what is no JPEG at all is named here
            import torch

            if not data.startswith(b"\xff\xd8\xff"):
                raise ValueError("not a JPEG file (no start-of-image marker)")
            return torch.frombuffer(bytearray(data), dtype=torch.uint8), torch.tensor(
                max(label, 0))
        if not self.decode:
            return self.blank(label)
        if self.unit == "images":
            return self._image(data, label)
        return self._volume(data)

    def _image(self, data: bytes, label: int) -> tuple[torch.Tensor, torch.Tensor]:
        import numpy as np
        import torch
        from PIL import Image

        from tunelab.bench.ddp.models import import_torchvision

        transforms = import_torchvision().transforms
        with Image.open(io.BytesIO(data)) as im:
            img = im.convert("RGB")
        top, left, h, w = transforms.RandomResizedCrop.get_params(img, (0.08, 1.0),
                                                                  (3 / 4, 4 / 3))
        img = img.resize((self.size, self.size), Image.Resampling.BILINEAR,
                         box=(left, top, left + w, top + h))
        if torch.rand(()) < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        arr = np.asarray(img, dtype=np.uint8)
        return torch.from_numpy(arr.transpose(2, 0, 1).copy()), torch.tensor(max(label, 0))

    def _volume(self, data: bytes) -> tuple[torch.Tensor, torch.Tensor]:
        import numpy as np
        import torch

        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            x, y = z["x"], z["y"]
        if x.ndim != 4 or y.shape != x.shape or x.shape[0] != 1:
            raise ValueError(f"expected x and y of one shape (1, D, H, W), got {x.shape} and "
                             f"{y.shape}")
        x = _crop(x[0], self.patch)
        y = _crop(y[0], self.patch)
        return (torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[None],
                torch.from_numpy(np.ascontiguousarray(y, dtype=np.uint8)))


def _crop(vol: np.ndarray, patch: int) -> np.ndarray:
    """A random patch^3 crop of a 3-D array, zero-padded where it is smaller."""
    import numpy as np
    import torch

    pads = [(0, max(0, patch - n)) for n in vol.shape]
    if any(p for _, p in pads):
        vol = np.pad(vol, pads)
    starts = [int(torch.randint(0, n - patch + 1, ())) for n in vol.shape]
    return vol[tuple(slice(s, s + patch) for s in starts)]


def _stack(xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor], decoder: Decoder,
           names: Sequence[str] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    if decoder.encoded:  # JPEG bytes of different lengths, end to end; decoded on the GPU
        return (Encoded.join(xs, names),  # type: ignore[return-value]
                torch.stack(list(ys)) if ys else torch.zeros(0, dtype=torch.long))
    if not xs:
        x, y = decoder.blank(0)
        return x[None][:0], y[None][:0]
    n = len(xs)
    # undecoded samples are one blank: a view of it n times, not n copies
    same = all(x is xs[0] for x in xs)
    x = xs[0].expand(n, *xs[0].shape) if same else torch.stack(list(xs))
    y = ys[0].expand(n, *ys[0].shape) if all(v is ys[0] for v in ys) else torch.stack(list(ys))
    return x, y


class FileSamples:
    """Map-style: sample i is file i of the index (JPEG folders, ``.npz`` volumes)."""

    def __init__(self, index: DatasetIndex, decoder: Decoder, fail_on_corrupt: bool) -> None:
        self.index = index
        self.decoder = decoder
        self.fail = fail_on_corrupt

    def __len__(self) -> int:
        return len(self.index.entries)

    def __getitem__(self, i: int) -> Batch:
        return self.__getitems__([i])

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        """The batch of ``indices``: every file read whole, decoded, stacked."""
        acc = _Account()
        xs, ys, names = [], [], []
        paths = [self.index.path(self.index.entries[i]) for i in indices]
        will_need(paths)  # every read of the batch queued at once, not one after another
        for i, path in zip(indices, paths, strict=True):
            entry = self.index.entries[i]
            try:
                data = read_file(path)
            except OSError as exc:
                acc.bad(path, f"cannot read: {exc.strerror}", True)
                continue
            acc.bytes += len(data)
            try:
                x, y = self.decoder(data, entry.label)
            except Exception as exc:  # Pillow, numpy and zipfile raise many kinds
                acc.bad(path, describe_error(exc), self.fail)
                continue
            xs.append(x)
            ys.append(y)
            names.append(path)
        acc.samples = len(xs)
        x, y = _stack(xs, ys, self.decoder, names)
        return Batch(x, y, acc.info())


def describe_error(exc: BaseException) -> str:
    """Why a sample could not be read or decoded, in one line: the error's type and text."""
    text = " ".join(str(exc).split())[:160]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _CountingFile(io.RawIOBase):
    """A raw file that counts the bytes its reads return."""

    def __init__(self, path: str) -> None:
        self._f = open(path, "rb", buffering=0)  # noqa: SIM115 - closed in close()
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = self._f.readinto(b) or 0
        self.count += n
        return n

    def close(self) -> None:
        self._f.close()
        super().close()


class ShardStream(IterableDataset["Batch"]):
    """Iterable: WebDataset-style tar shards, read sequentially, whole batches yielded.

    An ``IterableDataset``, so the DataLoader hands every loader process the whole stream
    (each picks its own shards) instead of asking for a length and indices.

    ``plan()`` gives, per epoch, the entry indices each loader of this rank reads (see
    :func:`tunelab.bench.ddp.dataset.shard_plan`); the epoch number is shared with the
    loader processes through ``epoch`` (a ``multiprocessing.Value``), so persistent loaders
    follow it. A shard that ends early (truncated, damaged headers) ends that shard: the
    samples lost are counted as corrupt, or the run fails with ``--on-corrupt fail``.
    """

    def __init__(self, index: DatasetIndex, decoder: Decoder, batch: int,
                 plans: dict[int, list[list[int]]], epoch: Any, fail_on_corrupt: bool) -> None:
        self.index = index
        self.decoder = decoder
        self.batch = batch
        self.plans = plans
        self.epoch = epoch
        self.fail = fail_on_corrupt

    def __iter__(self) -> Iterator[Batch]:
        loader = max(0, _loader_id())
        mine = self.plans[int(self.epoch.value)][loader]
        box = [_Account()]  # the batch being filled; _shard adds to whichever it is
        xs: list[torch.Tensor] = []
        ys: list[torch.Tensor] = []
        names: list[str] = []
        for i in mine:
            entry = self.index.entries[i]
            for x, y, name in self._shard(self.index.path(entry), entry.samples, box):
                xs.append(x)
                ys.append(y)
                names.append(name)
                if len(xs) == self.batch:
                    box[0].samples = len(xs)
                    bx, by = _stack(xs, ys, self.decoder, names)
                    yield Batch(bx, by, box[0].info())
                    box[0], xs, ys, names = _Account(), [], [], []
            if box[0].fatal:
                break
        if box[0].fatal or box[0].corrupt:  # a short last batch carries what went wrong
            box[0].samples = len(xs)
            bx, by = _stack(xs, ys, self.decoder, names)
            yield Batch(bx, by, box[0].info())

    def _shard(self, path: str, expected: int, box: list[_Account],
               ) -> Iterator[tuple[torch.Tensor, torch.Tensor, str]]:
        raw = _CountingFile(path)
        counted = 0
        seen = 0
        pending: dict[str, dict[str, bytes]] = {}
        try:
            with tarfile.open(fileobj=raw, mode="r|") as tar:
                for member in tar:
                    if not member.isfile():
                        continue
                    key, _, ext = member.name.rpartition(".")
                    f = tar.extractfile(member)
                    payload = f.read() if f is not None else b""
                    box[0].bytes += raw.count - counted
                    counted = raw.count
                    parts = pending.setdefault(key, {})
                    parts[ext.lower()] = payload
                    image = next((parts[e[1:]] for e in IMAGE_EXTS if e[1:] in parts), None)
                    if image is None or "cls" not in parts:
                        continue
                    del pending[key]
                    seen += 1
                    try:
                        x, y = self.decoder(image, int(parts["cls"] or b"0"))
                    except Exception as exc:
                        box[0].bad(f"{path}:{key}", describe_error(exc), self.fail)
                        continue
                    yield x, y, f"{path}:{key}"
        except (tarfile.TarError, EOFError, OSError) as exc:
            lost = max(1, expected - seen)
            box[0].bad(path, f"shard ends early after {seen} of {expected} samples: "
                             f"{describe_error(exc)}", self.fail)
            box[0].corrupt += lost - 1
        finally:
            box[0].bytes += raw.count - counted
            raw.close()


class MemorySamples:
    """Map-style over decoded samples in RAM (``x``: inputs, ``y``: targets). ``blank``:
    every batch is a view of sample 0 (what files give with ``--decode off``)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, blank: bool = False) -> None:
        self.x = x
        self.y = y
        self.blank = blank

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __getitem__(self, i: int) -> Batch:
        return self.__getitems__([i])

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        """The batch of ``indices`` (gathered from RAM)."""
        import torch

        acc = _Account()
        acc.samples = n = len(indices)
        if self.blank:
            return Batch(self.x[0].expand(n, *self.x.shape[1:]),
                         self.y[0].expand(n, *self.y.shape[1:]), acc.info())
        idx = torch.as_tensor(list(indices), dtype=torch.long)
        return Batch(self.x.index_select(0, idx), self.y.index_select(0, idx), acc.info())


def signal_text(text: str) -> str:
    """``Killed`` -> ``SIGKILL`` (strsignal text to a signal name), else the text."""
    for sig in signal.Signals:
        if signal.strsignal(sig) == text:
            return sig.name
    return text


def loader_pid_file(status_dir: str, rank: int, loader: int) -> str:
    """Where a loader process of ``rank`` records its pid."""
    return os.path.join(status_dir, f"rank-{rank}-loader-{loader}.pid")
