"""``--decode gpu``: JPEG decoded on the worker's GPU (nvJPEG through
``torchvision.io.decode_jpeg(device="cuda")``), cropped, resized and flipped there.

The loader processes then only read bytes: each sample is its file's bytes as a 1-D uint8
tensor (:class:`tunelab.bench.ddp.samples.Decoder` with ``encoded=True``), a batch is the list
of them, copied to the device from pinned memory; :func:`decode_batch` turns it into the
uint8 (N, 3, size, size) batch the step normalises, with the crop parameters of
RandomResizedCrop (scale 0.08-1, aspect 3/4-4/3) as the CPU path uses. The time it takes is
part of the batch's data wait (work the accelerator does for the input, not for training).

:func:`gpu_decode_unavailable` is the one capability check: CUDA present, torchvision's
``decode_jpeg`` importable, and a small JPEG decoded on the device; where it fails (the CPU
wheels here) ``--decode gpu`` is refused in one line before anything starts.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["crop_params", "decode_batch", "gpu_decode_unavailable"]


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


def decode_batch(encoded: Sequence[torch.Tensor], size: int, device: torch.device,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Decode ``encoded`` JPEGs (1-D uint8 tensors in host memory, pinned by the loader) on
    ``device``
    in one batched nvJPEG call; random-resized-crop each to ``size`` x ``size``, flip half
    of them; uint8 (N, 3, size, size) on ``device``."""
    import torch
    import torch.nn.functional as F
    from torchvision.io import ImageReadMode, decode_jpeg

    if not encoded:
        return torch.zeros((0, 3, size, size), dtype=torch.uint8, device=device)
    images = decode_jpeg(list(encoded), mode=ImageReadMode.RGB, device=device)
    out = torch.empty((len(images), 3, size, size), dtype=torch.uint8, device=device)
    flips = torch.rand(len(images), generator=generator) < 0.5
    for i, img in enumerate(images):
        top, left, h, w = crop_params(int(img.shape[1]), int(img.shape[2]), generator)
        patch = img[:, top:top + h, left:left + w].unsqueeze(0).float()
        patch = F.interpolate(patch, size=(size, size), mode="bilinear", align_corners=False)
        if flips[i]:
            patch = patch.flip(-1)
        out[i] = patch[0].round_().clamp_(0, 255).to(torch.uint8)
    return out


def crop_params(height: int, width: int, generator: torch.Generator | None = None,
                scale: tuple[float, float] = (0.08, 1.0),
                ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """RandomResizedCrop's parameters (top, left, h, w) for an image of that size: ten
    tries at a random area and aspect, else the central crop of the nearest aspect."""
    import torch

    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * float(torch.empty(1).uniform_(scale[0], scale[1], generator=generator))
        aspect = math.exp(float(torch.empty(1).uniform_(*log_ratio, generator=generator)))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,), generator=generator))
            left = int(torch.randint(0, width - w + 1, (1,), generator=generator))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w
