"""The BatchNorm-folded inference network gives the unfolded model's outputs."""

from __future__ import annotations

import copy

import pytest
import torch

from tunelab.leopard.inference import InferenceUNet, _Affine2d, fold_batchnorm, to_nwc_input
from tunelab.leopard.model import LeopardUNet


def _trained_like(seed: int, negative_gamma: bool, **arch: int) -> LeopardUNet:
    """A model with non-trivial BatchNorm statistics and affine parameters, as after
    training (optionally with negative gammas, which a max-pool cannot commute with)."""
    torch.manual_seed(seed)
    m = LeopardUNet(**arch)
    low = -1.5 if negative_gamma else 0.2
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm1d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.3, 2.0)
                mod.weight.uniform_(low, 1.5)
                mod.bias.uniform_(-0.5, 0.5)
    return m.eval()


def _reference(m: LeopardUNet, x: torch.Tensor) -> torch.Tensor:
    """The unfolded model on the plain 1-D path."""
    ref = copy.deepcopy(m)
    ref.channels_last = False
    with torch.no_grad():
        return ref(x)


@pytest.mark.parametrize(("arch", "length"), [
    ({}, 2048),                                                # the seed's shape
    ({"base_filters": 4, "depth": 3}, 256),
    ({"base_filters": 4, "depth": 3, "in_channels": 6}, 8),    # deepest level: 1 position
    ({"base_filters": 4, "depth": 2, "kernel_size": 5}, 12),   # length < 2 * padding
])
@pytest.mark.parametrize("negative_gamma", [False, True])
def test_folded_network_equals_the_unfolded_one(arch: dict[str, int], length: int,
                                                negative_gamma: bool) -> None:
    m = _trained_like(length, negative_gamma, **arch)
    folded = fold_batchnorm(m)
    x = torch.randn(3, m.arch.in_channels, length)
    want = _reference(m, x)
    with torch.no_grad():
        got = folded(x)
        got_nwc = folded(to_nwc_input(x))
    scale = want.abs().max().item()
    assert got.shape == want.shape == (3, length)
    assert torch.allclose(got, want, atol=2e-6 * max(scale, 1.0), rtol=0)
    assert torch.equal(got, got_nwc)
    # the fold really removed the BatchNorm layers
    assert not any(isinstance(mod, torch.nn.BatchNorm1d) for mod in folded.modules())
    # a negative gamma before a max-pool is applied explicitly, never folded through it
    assert any(isinstance(mod, _Affine2d) for mod in folded.modules()) == negative_gamma


def test_fold_leaves_the_model_unchanged_and_needs_no_gradients() -> None:
    m = _trained_like(1, True, base_filters=4, depth=3)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    folded = fold_batchnorm(m)
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert not any(p.requires_grad for p in folded.parameters())


def test_bf16_network_stays_close_to_fp32() -> None:
    m = _trained_like(2, False, base_filters=8, depth=3)
    x = torch.randn(2, 5, 512)
    fp32 = fold_batchnorm(m)
    bf16: InferenceUNet = fold_batchnorm(m).to_precision(torch.bfloat16)
    with torch.no_grad():
        a, b = torch.sigmoid(fp32(x)), torch.sigmoid(bf16(x))
    assert b.dtype == torch.float32  # logits come back as float32 whatever the precision
    assert (a - b).abs().max().item() < 0.02
