"""An inference-only form of the U-Net: BatchNorm folded away, channels-last, one dtype.

Every convolution of :class:`~tunelab.leopard.model.LeopardUNet` is ``Conv -> ReLU ->
BatchNorm``. In eval mode the BatchNorm is a per-channel affine map ``y = a * x + b``; it
cannot move *before* the ReLU, so :func:`fold_batchnorm` pushes it forward into whatever
consumes it:

* a convolution (``k`` taps, ``"same"`` zero padding): weights ``W[o, c, j] * a[c]``, bias
  ``bias[o] + sum_{c, j} W[o, c, j] * b[c]``. The zero padding of the original sits *after*
  the BatchNorm, so near the window's two ends the folded convolution would count shifts the
  original never saw; the missing taps are subtracted at the first and last ``k // 2``
  positions (a few hundred numbers per convolution), which makes the fold exact;
* a max-pool: ``pool(a * x + b) = a * pool(x) + b`` when every ``a >= 0``, so the affine
  passes through; a channel with ``a < 0`` (a trained negative gamma) makes the affine be
  applied there instead (exact either way);
* the transposed convolution (``k = 2``, stride 2): rewritten as a 1x1 convolution to
  ``2 * out`` channels ordered (tap, channel), whose channels-last output *is* the
  interleaved result (a free reshape); its bias per tap absorbs the shift exactly;
* the concatenation with a skip connection: the affines of both halves are concatenated;
* the 1x1 head: folded exactly.

The tensors are ``(N, C, 1, L)`` in ``torch.channels_last`` memory (oneDNN's preferred
layout for these small-channel convolutions; the 2-D form is what PyTorch offers it for), and
:meth:`InferenceUNet.to_precision` casts weights once instead of per call (what autocast does).
Outputs equal the unfolded model's to rounding (``tests/leopard/test_inference.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from tunelab.leopard.model import LeopardUNet

__all__ = ["InferenceUNet", "fold_batchnorm", "to_nwc_input"]

_Affine = tuple[torch.Tensor, torch.Tensor]  # (scale, shift) per channel, pending


def _bn_affine(bn: nn.BatchNorm1d) -> _Affine:
    assert bn.running_var is not None and bn.running_mean is not None
    inv = torch.rsqrt(bn.running_var.double() + bn.eps)
    gamma = bn.weight.double() if bn.weight is not None else torch.ones_like(inv)
    beta = bn.bias.double() if bn.bias is not None else torch.zeros_like(inv)
    scale = gamma * inv
    return scale, beta - bn.running_mean.double() * scale


class _Conv(nn.Module):
    """``(N, Cin, 1, L) -> (N, Cout, 1, L)``: a 1-D convolution (zero "same" padding) with a
    pending input affine folded in, the border correction that keeps it exact, then ReLU."""

    def __init__(self, conv: nn.Conv1d, affine: _Affine | None, relu: bool) -> None:
        super().__init__()
        w = conv.weight.detach().double()  # (out, in, k)
        b = (conv.bias.detach().double() if conv.bias is not None
             else torch.zeros(w.shape[0], dtype=torch.float64))
        k = w.shape[2]
        self.pad = k // 2
        taps = None
        if affine is not None:
            scale, shift = affine
            taps = torch.einsum("oij,i->oj", w, shift)  # (out, k): each tap's share of the shift
            b = b + taps.sum(1)
            w = w * scale[None, :, None]
        self.weight = nn.Parameter(w[:, :, None, :].float().contiguous(
            memory_format=torch.channels_last), requires_grad=False)
        self.bias = nn.Parameter(b.float(), requires_grad=False)
        self.relu = relu
        self.taps: torch.Tensor | None
        self.ends: torch.Tensor | None
        if taps is not None and self.pad and bool(taps.abs().max() > 0):
            self.register_buffer("taps", taps.float())
            # windows of at least 2 * pad positions (all but toy ones): the corrections of
            # the first and the last pad positions do not depend on the length, so they are
            # made once, as (1, out, 1, 2 * pad)
            self.register_buffer("ends", _missing_shift(taps, 2 * self.pad).float())
        else:
            self.taps = self.ends = None

    def _correct(self, y: torch.Tensor) -> None:
        """Subtract the shift the zero padding never carried, at both ends (in place)."""
        assert self.taps is not None and self.ends is not None
        p, length = self.pad, y.shape[-1]
        if length >= 2 * p:
            ends = self.ends.to(y.dtype)
            y[:, :, :, :p] -= ends[:, :, :, :p]
            y[:, :, :, length - p:] -= ends[:, :, :, p:]
            return
        y -= _missing_shift(self.taps, length).to(y.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, self.weight, self.bias, padding=(0, self.pad))
        if self.taps is not None:
            self._correct(y)
        return y.relu_() if self.relu else y


def _missing_shift(taps: torch.Tensor, length: int) -> torch.Tensor:
    """``(1, out, 1, positions)``: at the first and the last ``pad`` positions of a window of
    ``length`` (all of them when it is shorter than ``2 * pad``), what the taps that fall
    outside the window would have added; ``taps`` is ``(out, k)``."""
    k = taps.shape[1]
    p = k // 2
    lo = torch.arange(min(p, length))
    hi = torch.arange(max(length - p, min(p, length)), length)
    at = torch.cat([lo, hi])
    pos = at[:, None] + torch.arange(k) - p
    missing = ((pos < 0) | (pos >= length)).to(taps.dtype)  # (positions, k)
    return (taps @ missing.T)[None, :, None, :]


class _Up(nn.Module):
    """ConvTranspose1d(k=2, stride=2) as a 1x1 convolution to (tap, channel) outputs whose
    channels-last memory is already the interleaved result."""

    def __init__(self, up: nn.ConvTranspose1d, affine: _Affine | None) -> None:
        super().__init__()
        if up.kernel_size != (2,) or up.stride != (2,) or up.padding != (0,):
            raise ValueError("only ConvTranspose1d(kernel 2, stride 2, no padding) folds")
        w = up.weight.detach().double()  # (in, out, 2)
        cout = w.shape[1]
        bias = (up.bias.detach().double() if up.bias is not None
                else torch.zeros(cout, dtype=torch.float64))
        b = bias[None, :].repeat(2, 1)  # (tap, out)
        if affine is not None:
            scale, shift = affine
            b = b + torch.einsum("ioj,i->jo", w, shift)
            w = w * scale[:, None, None]
        w2 = w.permute(2, 1, 0).reshape(2 * cout, -1)  # rows (tap, out)
        self.cout = cout
        self.weight = nn.Parameter(w2[:, :, None, None].float().contiguous(
            memory_format=torch.channels_last), requires_grad=False)
        self.bias = nn.Parameter(b.reshape(-1).float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, _, t = x.shape
        y = F.conv2d(x, self.weight, self.bias)  # (N, 2*out, 1, T), channels-last
        y = y.permute(0, 2, 3, 1)  # (N, 1, T, 2*out): rows t hold [out(2t), out(2t+1)]
        if not y.is_contiguous():
            y = y.contiguous()
        return y.reshape(n, 1, 2 * t, self.cout).permute(0, 3, 1, 2)


class _Affine2d(nn.Module):
    """Apply a pending affine (only where it cannot pass through a max-pool)."""

    def __init__(self, affine: _Affine) -> None:
        super().__init__()
        self.scale: torch.Tensor
        self.shift: torch.Tensor
        self.register_buffer("scale", affine[0].float()[None, :, None, None])
        self.register_buffer("shift", affine[1].float()[None, :, None, None])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.shift.to(x.dtype), x, self.scale.to(x.dtype))


class InferenceUNet(nn.Module):
    """The folded network; :meth:`forward` takes the usual ``(N, C, L)`` float input (or an
    ``(N, C, 1, L)`` channels-last one from :func:`to_nwc_input`) and returns float32
    logits ``(N, L)``. Inference only: parameters do not require gradients."""

    def __init__(self, stem: list[_Conv], down: list[tuple[nn.Module, _Conv, _Conv]],
                 up: list[tuple[_Up, _Conv, _Conv]], head: _Conv, in_channels: int,
                 multiple: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(*stem)
        self.pre_pool = nn.ModuleList(d[0] for d in down)
        self.down = nn.ModuleList(nn.Sequential(d[1], d[2]) for d in down)
        self.up = nn.ModuleList(u[0] for u in up)
        self.merge = nn.ModuleList(nn.Sequential(u[1], u[2]) for u in up)
        self.head = head
        self.in_channels = in_channels
        self.multiple = multiple
        self.dtype = torch.float32

    def to_precision(self, dtype: torch.dtype) -> InferenceUNet:
        """Cast weights and activations to ``dtype`` (float32 or bfloat16) once."""
        self.to(dtype=dtype)
        self.dtype = dtype
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3:
            x = to_nwc_input(x)
        x = x.to(self.dtype)
        h = self.stem(x)
        skips = [h]
        for pre, block in zip(self.pre_pool, self.down, strict=True):
            h = block(_halve(pre(h)))
            skips.append(h)
        skips.pop()
        for up, merge in zip(self.up, self.merge, strict=True):
            h = merge(torch.cat([up(h), skips.pop()], dim=1))
        return self.head(h)[:, 0, 0, :].float()


def _halve(x: torch.Tensor) -> torch.Tensor:
    """Max-pool by 2 along the length: the larger of the even and the odd positions (equal to
    ``F.max_pool2d(x, (1, 2))``, 2-4x faster on channels-last CPU tensors, fp32 and bf16)."""
    n = x.shape[-1] // 2 * 2
    return torch.maximum(x[:, :, :, 0:n:2], x[:, :, :, 1:n:2])


def to_nwc_input(x: torch.Tensor) -> torch.Tensor:
    """``(N, C, L)`` -> ``(N, C, 1, L)`` in channels-last memory (one copy)."""
    return x[:, :, None, :].contiguous(memory_format=torch.channels_last)


def fold_batchnorm(model: LeopardUNet) -> InferenceUNet:
    """The inference form of a trained ``model`` (left unchanged), exact to rounding."""
    pending: _Affine | None = None

    def block(seq: nn.Sequential, affine: _Affine | None) -> tuple[_Conv, _Conv, _Affine]:
        c1, _, bn1, c2, _, bn2 = seq
        assert isinstance(c1, nn.Conv1d) and isinstance(c2, nn.Conv1d)
        assert isinstance(bn1, nn.BatchNorm1d) and isinstance(bn2, nn.BatchNorm1d)
        first = _Conv(c1, affine, relu=True)
        second = _Conv(c2, _bn_affine(bn1), relu=True)
        return first, second, _bn_affine(bn2)

    with torch.no_grad():
        s1, s2, pending = block(model.stem, None)
        skips: list[_Affine] = [pending]
        down: list[tuple[nn.Module, _Conv, _Conv]] = []
        for seq in model.down:
            assert isinstance(seq, nn.Sequential)
            pre: nn.Module = nn.Identity()
            if bool((pending[0] < 0).any()):  # the affine cannot pass through the max-pool
                pre, pending = _Affine2d(pending), None  # the skip keeps its own affine
            c1, c2, pending = block(seq, pending)
            down.append((pre, c1, c2))
            skips.append(pending)
        skips.pop()
        ups: list[tuple[_Up, _Conv, _Conv]] = []
        for up, seq in zip(model.up, model.merge, strict=True):
            assert isinstance(up, nn.ConvTranspose1d) and isinstance(seq, nn.Sequential)
            u = _Up(up, pending)
            skip = skips.pop()
            cat = (torch.cat([torch.ones(u.cout, dtype=torch.float64), skip[0]]),
                   torch.cat([torch.zeros(u.cout, dtype=torch.float64), skip[1]]))
            c1, c2, pending = block(seq, cat)
            ups.append((u, c1, c2))
        head = _Conv(model.head, pending, relu=False)
    net = InferenceUNet([s1, s2], down, ups, head, model.arch.in_channels, model.arch.multiple)
    return net.eval()
