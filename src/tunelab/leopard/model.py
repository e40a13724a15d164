"""The Leopard U-Net in PyTorch.

Layout is PyTorch's ``(batch, channels, length)``; the original Keras model took
``(batch, length, channels)``. With the defaults (15 stem filters, depth 5, kernel 7, growth
1.5) and 5 input channels the model has 474,017 trainable parameters plus 1,952 BatchNorm
running statistics (``running_mean`` and ``running_var``, buffers in PyTorch, "non-trainable
parameters" in Keras): 475,969 in all, the figure of the seed.

Each convolution is ``Conv1d(k, padding="same") -> ReLU -> BatchNorm``, the original's order.
BatchNorm uses Keras' settings: momentum 0.99 in Keras terms (0.01 in PyTorch's), eps 1e-3.
The network returns logits; apply ``torch.sigmoid`` for probabilities.

On a CPU, inference (eval mode, no gradients: evaluation during training, prediction with
the plain model) runs the same parameters as 2-D operations on ``(N, C, 1, L)`` tensors in
``torch.channels_last`` memory, where oneDNN's kernels ran these narrow convolutions 1.2-2x
faster than its 1-D ones; results are unchanged (``tests/leopard/test_model.py``). Training
runs the same form when :attr:`LeopardUNet.channels_last_training` is set (``--layout``;
gradients and running statistics equal the 1-D modules' up to rounding); on a GPU that
choice, measured there, serves evaluation too. Models whose BatchNorm was replaced by a
synchronised one always take the 1-D modules.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tunelab.leopard.errors import LeopardError

__all__ = ["Architecture", "LeopardUNet", "count_parameters", "flops_per_window"]

#: the forms a model trains in (:meth:`LeopardUNet.set_training_layout`)
TRAINING_LAYOUTS = ("1d", "2d", "2d8")
BN_MOMENTUM = 0.01  # PyTorch convention; Keras momentum 0.99
BN_EPS = 1e-3


@dataclass(frozen=True)
class Architecture:
    """The hyper-parameters that fix the shape of the network (stored in checkpoints)."""

    in_channels: int = 5
    base_filters: int = 15
    depth: int = 5
    kernel_size: int = 7
    growth: float = 1.5

    def __post_init__(self) -> None:
        if self.in_channels < 1:
            raise LeopardError(f"in_channels must be at least 1, got {self.in_channels}")
        if self.depth < 1:
            raise LeopardError(f"depth must be at least 1, got {self.depth}")
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise LeopardError(f"kernel_size must be odd and positive, got {self.kernel_size}")
        if self.base_filters < 1 or self.growth <= 1.0:
            raise LeopardError("base_filters must be >= 1 and growth > 1")

    @property
    def multiple(self) -> int:
        """Window lengths must be a multiple of this (2 ** depth; 32 by default)."""
        return 2**self.depth

    def encoder_filters(self) -> list[int]:
        """Filters of the stem and each encoder level: 15, 22, 33, 49, 73, 109 by default."""
        f = [self.base_filters]
        for _ in range(self.depth):
            f.append(int(f[-1] * self.growth))
        return f

    def decoder_filters(self) -> list[int]:
        """Filters of each decoder level: 72, 48, 32, 21, 14 by default."""
        d = [int(self.encoder_filters()[-1] / self.growth)]
        for _ in range(self.depth - 1):
            d.append(int(d[-1] / self.growth))
        return d

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form, for checkpoints and JSON."""
        return asdict(self)


def _conv_block(cin: int, cout: int, k: int) -> nn.Sequential:
    """Two ``Conv1d -> ReLU -> BatchNorm`` units."""
    layers: list[nn.Module] = []
    for c in (cin, cout):
        layers += [
            nn.Conv1d(c, cout, k, padding=k // 2),
            nn.ReLU(inplace=True),
            nn.BatchNorm1d(cout, eps=BN_EPS, momentum=BN_MOMENTUM),
        ]
    return nn.Sequential(*layers)


class LeopardUNet(nn.Module):
    """Leopard's 1-D U-Net: stem, ``depth`` max-pool encoder levels, ``depth`` transposed-
    convolution decoder levels with skip connections, a 1x1 convolution to one logit per base.

    Input ``(N, C, L)`` with ``L`` a multiple of ``2 ** depth``; output logits ``(N, L)``.
    """

    def __init__(self, arch: Architecture | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.arch = arch if arch is not None else Architecture(**kwargs)
        a = self.arch
        enc = a.encoder_filters()
        dec = a.decoder_filters()
        self.stem = _conv_block(a.in_channels, enc[0], a.kernel_size)
        self.pool = nn.MaxPool1d(2)
        self.down = nn.ModuleList(
            _conv_block(enc[i], enc[i + 1], a.kernel_size) for i in range(a.depth)
        )
        self.up = nn.ModuleList()
        self.merge = nn.ModuleList()
        cin = enc[-1]
        for j, cout in enumerate(dec):
            skip = enc[a.depth - 1 - j]
            self.up.append(nn.ConvTranspose1d(cin, cout, 2, stride=2))
            self.merge.append(_conv_block(cout + skip, cout, a.kernel_size))
            cin = cout
        self.head = nn.Conv1d(cin, 1, 1)
        #: run the channels-last 2-D form on CPUs for inference (False: the 1-D modules)
        self.channels_last = True
        #: the same for training (forward and backward), when a run chose it (measured by
        #: :mod:`tunelab.leopard.trainsetup`); on a GPU for evaluation too
        self.channels_last_training = False
        #: the 2-D form computes on channels padded with zeros to a multiple of this (1: not
        #: padded; 8: cuDNN's tensor-core kernels want such counts); the parameters keep
        #: their own shapes, padded on the fly, so nothing else sees it
        self.pad_channels = 1

    def set_training_layout(self, layout: str) -> None:
        """Train (and, on a GPU, evaluate) in ``layout``: ``1d`` (the 1-D modules), ``2d``
        (the channels-last 2-D form) or ``2d8`` (that form on channels padded to 8)."""
        if layout not in TRAINING_LAYOUTS:
            raise LeopardError(f"layout: unknown value {layout!r}; choose one of "
                               f"{', '.join(TRAINING_LAYOUTS)}")
        self.channels_last_training = layout != "1d"
        self.pad_channels = 8 if layout == "2d8" else 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(N, L)`` for input ``(N, C, L)``."""
        if x.dim() != 3 or x.shape[1] != self.arch.in_channels:
            raise LeopardError(
                f"model input must be (batch, {self.arch.in_channels}, length), "
                f"got {tuple(x.shape)}"
            )
        if x.shape[2] % self.arch.multiple:
            raise LeopardError(
                f"window length {x.shape[2]} is not divisible by {self.arch.multiple}"
            )
        inference = not self.training and not torch.is_grad_enabled()
        # on a CPU inference always takes the 2-D form; on a GPU the form measured for
        # training (choose_step_mode) serves evaluation too
        two_d = (self.channels_last if inference and x.device.type == "cpu"
                 else self.channels_last_training)
        if two_d and all(type(m) is nn.BatchNorm1d and m.track_running_stats
                         for m in self.modules()
                         if isinstance(m, nn.modules.batchnorm._NormBase)):
            return self._forward_nwc(x)
        h = self.stem(x)
        skips = [h]
        for block in self.down:
            h = block(self.pool(h))
            skips.append(h)
        skips.pop()
        for up, merge in zip(self.up, self.merge, strict=True):
            h = merge(torch.cat([up(h), skips.pop()], dim=1))
        return self.head(h).squeeze(1)


    def _forward_nwc(self, x: torch.Tensor) -> torch.Tensor:
        """The same computation on ``(N, C, 1, L)`` channels-last tensors, their channels
        padded with zeros to a multiple of :attr:`pad_channels`: the padded channels' weights
        are zero, so they stay zero through every layer and add nothing to the real ones."""
        m = self.pad_channels
        x = _pad_to(x, {1: _round_up(x.shape[1], m)})
        h = _block_nwc(self.stem, x[:, :, None, :].contiguous(memory_format=torch.channels_last),
                       m)
        skips = [h]
        for block in self.down:
            h = _block_nwc(block, F.max_pool2d(h, (1, 2)), m)
            skips.append(h)
        skips.pop()
        for up, merge in zip(self.up, self.merge, strict=True):
            assert isinstance(up, nn.ConvTranspose1d)
            w = _pad_to(up.weight.unsqueeze(2), {0: h.shape[1], 1: _round_up(up.out_channels, m)})
            u = F.conv_transpose2d(h, w, _pad_to(up.bias, {0: w.shape[1]}), stride=(1, 2))
            skip = skips.pop()
            # the merge's input: the real channels of u, then of skip, each padded
            real = (up.out_channels, _first_conv(merge).in_channels - up.out_channels)
            h = _block_nwc(merge, torch.cat([u, skip], dim=1), m, (real, (u.shape[1],
                                                                         skip.shape[1])))
        w = _pad_to(self.head.weight.unsqueeze(2), {1: h.shape[1]})
        return F.conv2d(h, w, self.head.bias)[:, 0, 0, :]


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _pad_to(t: torch.Tensor | None, sizes: dict[int, int], value: float = 0.0) -> Any:
    """``t`` zero-padded (or ``value``-padded) at the end of each dimension ``d`` to
    ``sizes[d]``; ``t`` itself where nothing grows."""
    if t is None or all(t.shape[d] >= n for d, n in sizes.items()):
        return t
    pads: list[int] = []
    for d in reversed(range(t.dim())):
        pads += [0, max(sizes.get(d, 0) - t.shape[d], 0)]
    return F.pad(t, pads, value=value)


def _first_conv(seq: nn.Module) -> nn.Conv1d:
    conv = next(iter(seq.children()))
    assert isinstance(conv, nn.Conv1d)
    return conv


def _block_nwc(seq: nn.Module, h: torch.Tensor, multiple: int = 1,
               parts: tuple[tuple[int, int], tuple[int, int]] | None = None) -> torch.Tensor:
    """``Conv1d -> ReLU -> BatchNorm1d`` units of ``seq`` applied to ``(N, C, 1, L)`` whose
    channels may be padded: outputs to a multiple of ``multiple``; ``parts``: the input is two
    padded tensors end to end (their real and padded channel counts), as a merge's is."""
    layers = list(seq.children())
    for conv, bn in zip(layers[0::3], layers[2::3], strict=True):
        assert isinstance(conv, nn.Conv1d) and isinstance(bn, nn.BatchNorm1d)
        pad = conv.padding[0] if isinstance(conv.padding, tuple) else 0
        out = _round_up(conv.out_channels, multiple)
        w = conv.weight.unsqueeze(2)
        if parts is not None and parts[0] != parts[1]:  # each part's real channels, padded
            (a, b), (pa, pb) = parts
            w = torch.cat([_pad_to(w[:, :a], {1: pa}), _pad_to(w[:, a:a + b], {1: pb})], 1)
        parts = None
        w = _pad_to(w, {0: out, 1: h.shape[1]})
        h = F.relu_(F.conv2d(h, w, _pad_to(conv.bias, {0: out}), padding=(0, pad)))
        h = _batch_norm(bn, h)
    return h


def native_statistics(x: torch.Tensor) -> bool:
    """Whether PyTorch's own batch-norm kernel computes the training statistics of ``x``
    accurately: on CUDA (Welford sums in float32, fused with the normalisation: one pass over
    the activations where :func:`_channel_var_mean` makes six), not on a CPU."""
    return x.device.type == "cuda"


def _batch_norm(bn: nn.BatchNorm1d, x: torch.Tensor) -> torch.Tensor:
    """What ``BatchNorm1d.forward`` computes (running statistics included) on a 4-D
    channels-last input.

    In training on a CPU, the batch statistics come from :func:`_channel_var_mean` in float32:
    PyTorch's own channels-last batch-norm kernel sums without care there and was off by ~2e-4
    (post-ReLU activations, 330 k values per channel) where the 1-D kernel is off by ~5e-7.
    They stay in float32 under bf16 autocast, as the 1-D kernel keeps them. On CUDA PyTorch's
    kernel is accurate (:func:`native_statistics`) and does it all."""
    c, width = bn.num_features, {0: x.shape[1]}  # x's channels may be padded past c
    weight, bias = _pad_to(bn.weight, width), _pad_to(bn.bias, width)
    if not bn.training:
        return F.batch_norm(x, _pad_to(bn.running_mean, width),
                            _pad_to(bn.running_var, width, 1.0), weight, bias, False, 0.0,
                            bn.eps)
    factor = 0.0 if bn.momentum is None else bn.momentum
    if bn.num_batches_tracked is not None:
        bn.num_batches_tracked.add_(1)
        if bn.momentum is None:
            factor = 1.0 / float(bn.num_batches_tracked)
    if native_statistics(x):
        mean_run, var_run = (_pad_to(bn.running_mean, width),
                             _pad_to(bn.running_var, width, 1.0))
        out = F.batch_norm(x, mean_run, var_run, weight, bias, True, factor, bn.eps)
        if mean_run is not bn.running_mean and bn.running_mean is not None \
                and bn.running_var is not None:
            with torch.no_grad():  # the padded copies were updated: keep the real channels'
                bn.running_mean.copy_(mean_run[:c])
                bn.running_var.copy_(var_run[:c])
        return out
    with torch.no_grad():
        var, mean = _channel_var_mean(x.detach())
        if bn.running_mean is not None and bn.running_var is not None:
            n = x.numel() // x.shape[1]
            bn.running_mean.lerp_(mean[:c], factor)
            bn.running_var.lerp_(var[:c] * (n / max(n - 1, 1)), factor)
    return _BatchNormNWC.apply(x, weight, bias, mean, var, bn.eps)


def _channel_var_mean(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel biased variance and mean, in float32, of a channels-last ``(N, C, 1, L)``
    tensor: its memory is ``(N, L, C)``, summed over ``L`` per window (vectorised along the
    channels, one window per thread) and then over windows. ``torch.var_mean`` over dims
    (0, 2, 3) of the same tensor reduces serially and ran 5-10x slower. The values are
    shifted by the first position's before squaring, so a mean large against the spread
    costs no precision."""
    n, c = x.shape[0], x.shape[1]
    rows = x.permute(0, 2, 3, 1).reshape(n, -1, c)  # a view of channels-last memory
    shift = rows[0, 0].float()
    centred = rows.float() - shift  # a new float32 tensor, whatever the input's type
    count = centred.shape[0] * centred.shape[1]
    mean_shifted = centred.sum(1).sum(0) / count
    var = centred.square_().sum(1).sum(0) / count - mean_shifted.square()
    return var.clamp_min_(0.0), mean_shifted + shift


class _BatchNormNWC(torch.autograd.Function):
    """Batch normalisation with given batch statistics: forward is the fused inference
    kernel, backward PyTorch's training backward kernel fed those statistics (so the
    gradient flows through the statistics, as in training mode)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None,
                bias: torch.Tensor | None, mean: torch.Tensor, var: torch.Tensor,
                eps: float) -> torch.Tensor:
        invstd = torch.rsqrt(var + eps)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.eps = eps
        return F.batch_norm(x, mean, var, weight, bias, False, 0.0, eps)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, mean, invstd = ctx.saved_tensors
        gx, gw, gb = torch.ops.aten.native_batch_norm_backward(
            grad.contiguous(memory_format=torch.channels_last), x, weight, None, None, mean,
            invstd, True, ctx.eps, [True, weight is not None, weight is not None])
        return gx, gw, gb, None, None, None


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Parameter counts in Keras' sense.

    ``trainable``: elements of parameters with ``requires_grad``; ``non_trainable``: the
    other parameters plus the BatchNorm ``running_mean`` / ``running_var`` buffers (not
    ``num_batches_tracked``, which Keras does not have); ``total``: their sum.
    """
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    stats = sum(
        b.numel()
        for name, b in model.named_buffers()
        if name.endswith(("running_mean", "running_var"))
    )
    return {"trainable": trainable, "non_trainable": frozen + stats,
            "total": trainable + frozen + stats}


def flops_per_window(arch: Architecture, window: int, *, train: bool = True) -> float:
    """FLOPs one window costs: forward and backward (``train``) or forward alone, counted by
    ``torch.utils.flop_counter`` from the model's shapes on the meta device (nothing is
    computed; about 1.0 GFLOP forward and 3.0 with backward at the defaults and 10,240 bp)."""
    from torch.utils.flop_counter import FlopCounterMode

    batch = 2  # BatchNorm in training mode needs more than one value per channel
    with torch.device("meta"):
        model = LeopardUNet(arch).train(train)
        x = torch.empty(batch, arch.in_channels, window)
    with FlopCounterMode(display=False) as counter:
        if train:
            model(x).sum().backward()
        else:
            with torch.no_grad():
                model(x)
    return counter.get_total_flops() / batch
