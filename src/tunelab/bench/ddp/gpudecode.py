"""``--decode gpu``: JPEG decoded on the worker's GPU (nvJPEG through
``torchvision.io.decode_jpeg(device="cuda")``), cropped, resized and flipped there, while the
step runs.

The loader processes only read bytes: a batch's inputs are its files' bytes end to end
(:class:`tunelab.bench.ddp.samples.Encoded`, one shared-memory storage). :class:`DecodeAhead`
is a thread of the training process that takes the next batches from the loaders and
decodes them on a CUDA stream of its own while the step of the current batch runs on the
default one; the step gets a batch when its decode has finished (the wait for it is the
batch's data wait, as for CPU-decoded batches). Without it the decode ran between steps:
the GPU idled while it did (AU 38-53 % on one H200, 8-12 loaders, where Pillow in 8 loader
processes kept it 97 % busy).

:func:`decode_batch` decodes a batch in one batched nvJPEG call, then crops it with
RandomResizedCrop's parameters (scale 0.08-1, aspect 3/4-4/3; :func:`crop_boxes`, drawn for
the whole batch at once), resizes bilinearly and flips half the images in a fixed number of
kernels for the whole batch (:func:`resize_crops`; a loop over the images launched ~8
kernels an image, ~2,000 a batch of 256).

:func:`gpu_decode_unavailable` is the one capability check: CUDA present, torchvision's
``decode_jpeg`` importable, and a small JPEG decoded on the device; where it fails (the CPU
wheels here) ``--decode gpu`` is refused in one line before anything starts.
"""

from __future__ import annotations

import io
import math
import queue
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from tunelab.bench.ddp.samples import Batch, Encoded

__all__ = ["DecodeAhead", "UndecodableImages", "crop_boxes", "decode_batch",
           "gpu_decode_unavailable", "resize_crops"]


class UndecodableImages(Exception):
    """Files of a batch that the GPU's decoder refused: ``bad`` holds (index in the batch,
    why) for each."""

    def __init__(self, bad: list[tuple[int, str]]) -> None:
        super().__init__("; ".join(f"file {i + 1}: {why}" for i, why in bad))
        self.bad = bad


def _tiny_jpeg() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(buf, "JPEG")
    return buf.getvalue()


def gpu_decode_unavailable() -> str | None:
    """Why JPEG cannot be decoded on a GPU here (None: it can)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device is visible (nvJPEG decodes on a GPU)"
    try:
        from tunelab.bench.ddp.models import import_torchvision

        import_torchvision()
        from torchvision.io import decode_jpeg
    except Exception as exc:  # a CPU wheel of torchvision, a missing extension
        return f"torchvision has no JPEG decoder here ({' '.join(str(exc).split())[:120]})"
    try:
        data = torch.frombuffer(bytearray(_tiny_jpeg()), dtype=torch.uint8)
        out = decode_jpeg([data], device="cuda")
        if tuple(out[0].shape) != (3, 16, 16):
            return f"torchvision's decode_jpeg on the GPU gave shape {tuple(out[0].shape)}"
    except Exception as exc:
        return (f"torchvision's decode_jpeg cannot decode on the GPU "
                f"({' '.join(str(exc).split())[:160]})")
    return None


def decode_batch(encoded: Encoded, size: int, device: torch.device,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Decode the batch's JPEGs on ``device`` in one batched nvJPEG call; random-resized-crop
    each to ``size`` x ``size``, flip half of them; uint8 (N, 3, size, size) on ``device``.
    Files the decoder refuses raise :class:`UndecodableImages` naming their places."""
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg

    files = encoded.files()
    if not files:
        return torch.zeros((0, 3, size, size), dtype=torch.uint8, device=device)
    try:
        images = decode_jpeg(files, mode=ImageReadMode.RGB, device=device)
    except RuntimeError as exc:  # one bad file fails the batch: find which, one by one
        from tunelab.bench.ddp.samples import describe_error

        bad = []
        for i, f in enumerate(files):
            try:
                decode_jpeg([f], mode=ImageReadMode.RGB, device=device)
            except RuntimeError as one:
                bad.append((i, describe_error(one)))
        if not bad:
            raise
        raise UndecodableImages(bad) from exc
    sizes = torch.tensor([img.shape[1:] for img in images], dtype=torch.long)
    boxes = crop_boxes(sizes, generator)
    flips = torch.rand(len(images), generator=generator) < 0.5
    return resize_crops(images, boxes, flips, size)


def crop_boxes(sizes: torch.Tensor, generator: torch.Generator | None = None,
               scale: tuple[float, float] = (0.08, 1.0),
               ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> torch.Tensor:
    """RandomResizedCrop's parameters for images of ``sizes`` ((N, 2): height, width), as
    (N, 4) int64 rows (top, left, h, w): ten tries at a random area and aspect, the first
    that fits, else the central crop of the nearest aspect (torchvision's rule), drawn for
    the whole batch at once."""
    import torch

    n = int(sizes.shape[0])
    height = sizes[:, 0:1].double()
    width = sizes[:, 1:2].double()
    target = height * width * torch.empty(n, 10, dtype=torch.float64).uniform_(
        scale[0], scale[1], generator=generator)
    aspect = torch.empty(n, 10, dtype=torch.float64).uniform_(
        math.log(ratio[0]), math.log(ratio[1]), generator=generator).exp_()
    w = torch.sqrt(target * aspect).round_()
    h = torch.sqrt(target / aspect).round_()
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = fits.to(torch.uint8).argmax(dim=1, keepdim=True)  # the first try that fits
    h, w = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0]
    height, width = height[:, 0], width[:, 0]
    u = torch.rand(n, 2, dtype=torch.float64, generator=generator)
    top = (u[:, 0] * (height - h + 1)).floor_()
    left = (u[:, 1] * (width - w + 1)).floor_()
    # no try fitted: the central crop, of the image's aspect clamped to the range
    in_ratio = width / height
    narrow, wide = in_ratio < ratio[0], in_ratio > ratio[1]
    cw = torch.where(wide, (height * ratio[1]).round(), width)
    ch = torch.where(narrow, (width / ratio[0]).round(), height)
    fitted = fits.any(dim=1)
    h = torch.where(fitted, h, ch)
    w = torch.where(fitted, w, cw)
    top = torch.where(fitted, top, ((height - ch) / 2).floor())
    left = torch.where(fitted, left, ((width - cw) / 2).floor())
    return torch.stack([top, left, h, w], dim=1).long()


def resize_crops(images: Sequence[torch.Tensor], boxes: torch.Tensor, flips: torch.Tensor,
                 size: int) -> torch.Tensor:
    """Crop each uint8 (3, H, W) image to its box (top, left, h, w), resize it bilinearly to
    ``size`` x ``size`` (what ``F.interpolate(mode="bilinear", align_corners=False)`` computes
    on the crop, up to float rounding), mirror it where ``flips``; uint8 (N, 3, size, size) on
    the images' device, in a fixed number of kernels for the whole batch: the images end to
    end in one buffer, each output pixel's four source pixels gathered from it."""
    import torch

    device = images[0].device
    dims = torch.tensor([img.shape[1:] for img in images], dtype=torch.long)
    plane = dims[:, 0] * dims[:, 1]
    offset = torch.cumsum(3 * plane, 0) - 3 * plane
    meta = torch.stack([offset, plane, dims[:, 1], *boxes.long().unbind(1),
                        flips.long()], dim=1).to(device, non_blocking=True)
    offset, plane, width, top, left, h, w, flip = (c[:, None] for c in meta.unbind(1))
    flat = torch.cat([img.reshape(-1) for img in images])
    dst = torch.arange(size, device=device, dtype=torch.float32)
    # mirrored images read their columns right to left
    dst_x = torch.where(flip.bool(), size - 1 - dst, dst)

    def axis(extent: torch.Tensor, start: torch.Tensor, at: torch.Tensor,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """First source index, step to the second (0 at the crop's last pixel) and the two
        weights of each output position along one axis, as PyTorch's bilinear kernel."""
        src = ((at + 0.5) * (extent.float() / size) - 0.5).clamp_min_(0.0)
        first = src.long()  # src >= 0: truncation is the floor
        step = (first < extent - 1).long()
        far = src - first.float()
        return first + start, step, 1.0 - far, far

    y0, y_step, h0, h1 = axis(h, top, dst[None, :])
    x0, x_step, w0, w1 = axis(w, left, dst_x)
    channel = (plane * torch.arange(3, device=device))[:, :, None, None]  # (N, 3, 1, 1)
    row0 = (offset + y0 * width)[:, None, :, None]
    row1 = row0 + (y_step * width)[:, None, :, None]
    col0 = x0[:, None, None, :]
    col1 = col0 + x_step[:, None, None, :]

    def at(row: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
        return flat[channel + row + col].float()

    wl, wr = w0[:, None, None, :], w1[:, None, None, :]
    out = h0[:, None, :, None] * (wl * at(row0, col0) + wr * at(row0, col1))
    out += h1[:, None, :, None] * (wl * at(row1, col0) + wr * at(row1, col1))
    return out.round_().clamp_(0, 255).to(torch.uint8)


#: what :meth:`DecodeAhead.next` returns: inputs and targets on the device, the batch's
#: accounting, and the seconds the fetch spent dropping the page cache for a new epoch
Ready = tuple[Any, Any, dict[str, Any], float]
#: a batch in the queue: :data:`Ready` and the CUDA event recorded when its decode was queued
_Item = tuple[Any, Any, dict[str, Any], float, Any]


class DecodeAhead:
    """Fetch (``fetch``: the next batch from the loaders and its page-cache drop seconds)
    and decode (``decode``, by default :func:`decode_batch`) up to ``depth`` batches ahead,
    in a thread, on a CUDA stream of its own, ``limit`` batches in all; :meth:`next` hands
    them over in order.

    Files the decoder refuses (:class:`UndecodableImages`) are corrupt samples, as the
    loaders' decoder counts them: left out of the batch, counted and named in its accounting
    and handed to ``check`` (the data source's, which keeps the names and raises
    under ``--on-corrupt fail``, ``fail_on_corrupt``). An error of the fetch or the decode is
    raised by the :meth:`next` that would have returned that batch. On a CPU ``device``
    (tests) the same thread runs without streams."""

    def __init__(self, fetch: Callable[[], tuple[Batch, float]], size: int,
                 device: torch.device, seed: int, limit: int, depth: int = 2,
                 decode: Callable[..., Any] | None = None, fail_on_corrupt: bool = False,
                 check: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._fetch = fetch
        self._fail = fail_on_corrupt
        self._check = check
        self._decode: Callable[..., Any] = decode if decode is not None else decode_batch
        self._size = size
        self._device = device
        self._seed = seed
        self._limit = limit
        self._queue: queue.Queue[_Item | BaseException] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="decode-ahead", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._work()
        except BaseException as exc:  # set-up failed (a stream): said where a batch is due
            self._put(exc)

    def _work(self) -> None:
        import contextlib

        import torch

        stream = torch.cuda.Stream(self._device) if self._device.type == "cuda" else None
        generator = torch.Generator().manual_seed(self._seed)
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for _ in range(self._limit):
                if self._stop.is_set():
                    return
                item: _Item | BaseException
                try:
                    batch, drop = self._fetch()
                    x, y = self._decoded(batch, generator)
                    y = y.to(self._device, non_blocking=True)
                    done = None
                    if stream is not None:
                        done = torch.cuda.Event()
                        done.record(stream)
                    item = (x, y, batch.info, drop, done)
                except BaseException as exc:  # handed to the training thread
                    item = exc
                if not self._put(item) or isinstance(item, BaseException):
                    return

    def _decoded(self, batch: Batch, generator: torch.Generator) -> tuple[Any, Any]:
        """The batch decoded, without the files the decoder refuses (see the class)."""
        encoded: Encoded = batch.x  # type: ignore[assignment]  # (--decode gpu's inputs)
        y = batch.y
        try:
            return self._decode(encoded, self._size, self._device, generator), y
        except UndecodableImages as exc:
            bad = exc.bad
        texts = [f"{encoded.name(i)} (undecodable on the GPU: {why})" for i, why in bad]
        info = batch.info  # this process's copy: the step's accounting of the batch
        info["corrupt"] = info.get("corrupt", 0) + len(bad)
        info["samples"] = info.get("samples", len(y)) - len(bad)
        info.setdefault("corrupt_files", []).extend(texts)
        if self._check is not None:
            self._check({"corrupt_files": texts,
                         "fatal": f"corrupt sample {texts[0]}" if self._fail else ""})
        drop = {i for i, _ in bad}
        keep = [i for i in range(len(y)) if i not in drop]
        return self._decode(encoded.without(drop), self._size, self._device, generator), y[keep]

    def _put(self, item: _Item | BaseException) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def next(self) -> Ready:
        """The next decoded batch (waiting for it: the data wait)."""
        import torch

        if self._failed is not None:
            raise self._failed
        while True:
            try:
                item = self._queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._failed = RuntimeError(
                        f"the decoding thread has handed over all {self._limit} batches "
                        "it was to decode")
                    raise self._failed from None
        if isinstance(item, BaseException):
            self._failed = item
            raise item
        x, y, info, drop, done = item
        if done is not None:  # the decode's kernels have finished; its memory is ours now
            done.synchronize()
            current = torch.cuda.current_stream(self._device)
            x.record_stream(current)
            y.record_stream(current)
        return x, y, info, drop

    def close(self, wait_s: float = 10.0) -> None:
        """Stop fetching; wait up to ``wait_s`` for a fetch in progress to end."""
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(wait_s)
