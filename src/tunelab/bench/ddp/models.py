"""The models the benchmark trains: torchvision's ResNet-18/50, the Leopard U-Net and the
3-D U-Net of MLPerf's image segmentation benchmark (KiTS19 volumes).

:func:`build_model` returns the network and the shape of one input sample; with
``device="meta"`` it allocates nothing (parameter shapes only: what emulated compute needs).

torchvision 0.28.0 on PyPI is a CUDA build; its C++ operators (nms, roi_align …) do not load
against the CPU wheel of torch 2.13.0, and its package import then fails on the two
operators it registers without checking (``torchvision::nms``, ``torchvision::qnms``). The
models use none of those operators: :func:`import_torchvision_models` declares the two
schemas only when that failure happens, then imports again.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tunelab.errors import WorkloadError

if TYPE_CHECKING:
    import torch

__all__ = ["ModelSpec", "build_model", "flops_per_sample", "import_torchvision",
           "import_torchvision_models", "parameter_count"]

_MISSING_OPS = ("nms", "qnms")
_shim: Any = None  # keeps the torch.library fragment alive


@dataclass(frozen=True)
class ModelSpec:
    """What a model consumes: ``sample_shape`` of one input, ``task`` (``classify``: integer
    labels of ``classes`` classes; ``segment``: one 0/1 target per input position)."""

    name: str
    sample_shape: tuple[int, ...]
    task: str
    classes: int = 0
    unit: str = "images"


def import_torchvision() -> ModuleType:
    """``torchvision`` (models and transforms), or :class:`WorkloadError` saying how to
    install it."""
    if importlib.util.find_spec("torchvision") is None:
        raise WorkloadError("the resnet models and image datasets need torchvision: pip install "
                            "'tunelab[ddp]' (torchvision==0.28.0, the release that pairs with "
                            "torch 2.13.0)")
    try:
        import torchvision
        import torchvision.models
        import torchvision.transforms
    except RuntimeError as exc:
        if not any(f"torchvision::{op}" in str(exc) for op in _MISSING_OPS):
            raise WorkloadError(f"torchvision does not import: {exc}") from exc
        _declare_missing_ops()
        import torchvision
        import torchvision.models
        import torchvision.transforms
    return torchvision


def import_torchvision_models() -> ModuleType:
    """``torchvision.models``, or :class:`WorkloadError` saying how to install torchvision."""
    models: ModuleType = import_torchvision().models
    return models


def _declare_missing_ops() -> None:
    """Declare the operator schemas torchvision registers fake kernels for, and forget the
    half-imported package so it imports again."""
    global _shim
    import torch

    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    if _shim is None:
        _shim = torch.library.Library("torchvision", "FRAGMENT")
        for op in _MISSING_OPS:
            _shim.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def build_model(name: str, *, image_size: int = 224, window: int = 2048, patch: int = 128,
                device: str | torch.device = "cpu") -> tuple[torch.nn.Module, ModelSpec]:
    """The model ``name`` (``resnet18``, ``resnet50``, ``leopard``, ``unet3d``) on
    ``device``, randomly initialised, and what it consumes."""
    import torch

    if name in ("resnet18", "resnet50"):
        models = import_torchvision_models()
        with torch.device(device):
            model = getattr(models, name)(weights=None, num_classes=1000)
        return model, ModelSpec(name, (3, image_size, image_size), "classify", classes=1000)
    if name == "leopard":
        from tunelab.leopard.model import LeopardUNet

        with torch.device(device):
            model = LeopardUNet()
        return model, ModelSpec(name, (5, window), "segment", unit="windows")
    if name == "unet3d":
        from tunelab.bench.ddp.unet3d import UNet3D

        with torch.device(device):
            model = UNet3D()
        return model, ModelSpec(name, (1, patch, patch, patch), "segment3d", classes=3,
                                unit="volumes")
    raise WorkloadError(f"--model: unknown model {name!r}; choose one of resnet18, resnet50, "
                        "leopard, unet3d")


@functools.lru_cache(maxsize=16)
def flops_per_sample(name: str, *, image_size: int = 224, window: int = 2048,
                     patch: int = 128, batch: int = 2) -> float:
    """FLOPs one training sample costs (forward and backward), counted by
    ``torch.utils.flop_counter`` on one step of ``batch`` samples (at least 2: BatchNorm in
    training mode needs more than one value per channel) from the model's shapes on the meta
    device: nothing is computed (ResNet-50 at 224 px: about 24 GFLOP; 0.1-0.2 s after the
    model's import). Kept per model, shape and batch for the life of the process."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model, spec = build_model(name, image_size=image_size, window=window, patch=patch,
                              device="meta")
    batch = max(2, batch)
    with torch.device("meta"):
        x = torch.empty(batch, *spec.sample_shape)
    with FlopCounterMode(display=False) as counter:
        model.train()(x).float().sum().backward()
    return float(counter.get_total_flops()) / batch


def parameter_count(model: torch.nn.Module) -> int:
    """Trainable parameters (the values DDP all-reduces every step)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
