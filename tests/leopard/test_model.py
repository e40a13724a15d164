"""The U-Net: exact parameter count, shapes, gradients, configuration."""

from __future__ import annotations

import pytest
import torch

from tunelab.leopard.errors import LeopardError
from tunelab.leopard.model import Architecture, LeopardUNet, count_parameters


def test_parameter_count_matches_the_seed() -> None:
    """Counting rule (Keras'): trainable = parameters with requires_grad (conv/transposed-
    conv weights and biases, BatchNorm gamma/beta); non-trainable = BatchNorm running_mean
    and running_var buffers (num_batches_tracked is PyTorch-only and not counted)."""
    model = LeopardUNet(Architecture(in_channels=5))
    counts = count_parameters(model)
    assert counts["trainable"] == 474_017
    assert counts["non_trainable"] == 1_952
    assert counts["total"] == 475_969
    # the rule spelled out independently of count_parameters
    params = sum(p.numel() for p in model.parameters())
    stats = sum(m.running_mean.numel() + m.running_var.numel()
                for m in model.modules() if isinstance(m, torch.nn.BatchNorm1d))
    assert (params, stats) == (474_017, 1_952)


def test_filters_follow_int_truncation() -> None:
    arch = Architecture()
    assert arch.encoder_filters() == [15, 22, 33, 49, 73, 109]
    assert arch.decoder_filters() == [72, 48, 32, 21, 14]


def test_batchnorm_uses_keras_settings() -> None:
    bns = [m for m in LeopardUNet().modules() if isinstance(m, torch.nn.BatchNorm1d)]
    assert len(bns) == 2 * (1 + 5 + 5)
    assert all(m.momentum == pytest.approx(0.01) and m.eps == pytest.approx(1e-3)
               for m in bns)


@pytest.mark.parametrize("channels", [5, 6])
def test_forward_backward_shapes(channels: int) -> None:
    torch.manual_seed(0)
    model = LeopardUNet(in_channels=channels)
    x = torch.randn(2, channels, 1024, requires_grad=True)
    logits = model(x)
    assert logits.shape == (2, 1024)
    logits.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    assert all(p.grad is not None and torch.isfinite(p.grad).all()
               for p in model.parameters())


def test_configurable_shape() -> None:
    model = LeopardUNet(in_channels=5, base_filters=8, depth=3, kernel_size=5)
    assert model(torch.randn(1, 5, 64)).shape == (1, 64)
    assert model.arch.multiple == 8


def test_length_not_divisible_by_32_is_refused() -> None:
    with pytest.raises(LeopardError, match="not divisible by 32"):
        LeopardUNet()(torch.randn(1, 5, 1000))


def test_wrong_channel_count_is_refused() -> None:
    with pytest.raises(LeopardError, match=r"\(batch, 5, length\)"):
        LeopardUNet()(torch.randn(1, 6, 1024))


def test_channels_last_inference_matches_the_1d_modules() -> None:
    """Inference on a CPU runs 2-D channels-last kernels on the same parameters: the same
    logits as the plain 1-D modules; training and gradients stay on the 1-D modules."""
    import copy

    torch.manual_seed(0)
    fast = LeopardUNet(base_filters=8, depth=3)
    with torch.no_grad():
        for m in fast.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    plain = copy.deepcopy(fast)
    plain.channels_last = False
    x = torch.relu(torch.randn(4, 5, 512)) * 3
    fast.eval()
    plain.eval()
    with torch.no_grad():
        assert torch.allclose(fast(x), plain(x), atol=1e-5, rtol=0)
    fast.train()
    plain.train()
    torch.manual_seed(1)
    y_fast = fast(x)
    y_plain = plain(x)
    assert torch.equal(y_fast, y_plain)  # the very same kernels while training
    for a, b in zip(fast.buffers(), plain.buffers(), strict=True):
        assert torch.equal(a, b)


def test_synchronised_batchnorm_takes_the_1d_path() -> None:
    from tunelab.leopard.distributed import _global_batch_norm_cls

    model = LeopardUNet(base_filters=4, depth=2)
    bn = model.stem[2]
    replacement = _global_batch_norm_cls()(bn.num_features, eps=bn.eps, momentum=bn.momentum)
    model.stem[2] = replacement
    calls: list[int] = []
    replacement.register_forward_hook(lambda *a: calls.append(1))
    model.eval()
    model(torch.randn(1, 5, 64))
    assert calls == [1]  # the module itself ran: no 2-D shortcut around it


def train_both_forms(device: str, steps: int, out_atol: float = 1e-4,
                     buffer_atol: float = 1e-5, layout: str = "2d") -> LeopardUNet:
    """Train a small model in the 1-D modules and a copy in ``layout`` (the 2-D form, or it
    on channels padded to 8: widths 8, 12, 18, 27 … pad to 8, 16, 24, 32) side by side on
    ``device`` (fp32, Adam) and check each step: the same logits, the same gradients (the
    first step) and the same BatchNorm running statistics, up to rounding; the copy."""
    import copy

    torch.manual_seed(0)
    plain = LeopardUNet(base_filters=8, depth=3).to(device)
    for m in plain.modules():
        if isinstance(m, torch.nn.BatchNorm1d):
            m.momentum = 0.1
    fast = copy.deepcopy(plain)
    fast.set_training_layout(layout)
    x = torch.relu(torch.randn(4, 5, 512, device=device)) * 3
    y = (torch.rand(4, 512, device=device) < 0.1).float()
    opts = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in (plain, fast)]
    for step in range(steps):
        outs = []
        for model, opt in zip((plain, fast), opts, strict=True):
            opt.zero_grad()
            out = model(x)
            torch.nn.functional.binary_cross_entropy_with_logits(out, y).backward()
            outs.append(out.detach())
        assert torch.allclose(outs[0], outs[1], atol=out_atol, rtol=0), step
        if step == 0:
            for (name, a), b in zip(plain.named_parameters(), fast.parameters(), strict=True):
                assert b.grad is not None and a.grad is not None
                err = (a.grad - b.grad).norm() / a.grad.norm()
                assert err < 1e-3, (name, float(err))
        for a, b in zip(plain.buffers(), fast.buffers(), strict=True):
            assert torch.allclose(a.float(), b.float(), atol=buffer_atol, rtol=buffer_atol)
        for opt in opts:
            opt.step()
    return fast


@pytest.mark.parametrize("layout", ["2d", "2d8"])
@pytest.mark.parametrize("statistics", ["tunelab's", "pytorch's"])
def test_channels_last_training_matches_the_1d_modules(
        statistics: str, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 2-D training form is the same computation, its channels padded with zeros or not:
    with the same weights and batch, the same logits, gradients and BatchNorm running
    statistics as the 1-D modules (fp32, up to rounding), one step and after a few Adam steps
    — with the batch statistics of :func:`_channel_var_mean` (CPUs) or of PyTorch's kernel
    (CUDA; forced here, one step: the CPU's kernel rounds enough for Adam to make more of it
    later). The parameters keep their shapes (the padding is made on the fly)."""
    from tunelab.leopard import model as M

    monkeypatch.setattr(M, "native_statistics", lambda x: statistics == "pytorch's")
    steps = 3 if statistics == "tunelab's" else 1
    fast = train_both_forms("cpu", steps, layout=layout)
    assert int(fast.stem[2].num_batches_tracked) == steps
    assert fast.state_dict().keys() == LeopardUNet(base_filters=8, depth=3).state_dict().keys()
    assert all(v.shape == w.shape for v, w in zip(
        fast.state_dict().values(), LeopardUNet(base_filters=8, depth=3).state_dict().values(),
        strict=True))
    fast.eval()  # evaluation in the same form: what the 1-D modules give
    x = torch.rand(2, 5, 256)
    with torch.no_grad():
        want = fast(x)
        fast.set_training_layout("1d")
        fast.channels_last = False
        assert torch.allclose(want, fast(x), atol=1e-4, rtol=0)


def test_an_unknown_training_layout_is_one_line() -> None:
    with pytest.raises(LeopardError, match="layout: unknown value '3d'; choose one of 1d, 2d, "
                                           "2d8"):
        LeopardUNet(base_filters=4, depth=2).set_training_layout("3d")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_channels_last_batch_statistics_are_float32_accurate(dtype: torch.dtype) -> None:
    """The channels-last training BatchNorm's own statistics agree with a float64 reference
    (post-ReLU values, and values whose mean is large against their spread), and leave the
    input untouched."""
    from tunelab.leopard.model import _channel_var_mean

    torch.manual_seed(0)
    for x in (torch.relu(torch.randn(8, 15, 1, 4096)) * 3,
              1000 + 0.01 * torch.randn(8, 15, 1, 4096)):
        x = x.to(dtype).contiguous(memory_format=torch.channels_last)
        before = x.clone()
        var, mean = _channel_var_mean(x)
        ref_var, ref_mean = torch.var_mean(x.double(), dim=(0, 2, 3), correction=0)
        assert var.dtype == mean.dtype == torch.float32
        assert torch.allclose(mean.double(), ref_mean, rtol=1e-6, atol=0)
        assert torch.allclose(var.double(), ref_var, rtol=1e-4, atol=0)
        assert torch.equal(x, before)


@pytest.mark.slow
def test_compiled_2d_training_step_matches_the_eager_one() -> None:
    """``--compile`` trains the 2-D form (Inductor fuses its BatchNorm, custom backward
    included): the same logits, gradients and running statistics as eager, in fp32."""
    import copy

    from tunelab.leopard.runtime import has_cxx_compiler

    if not has_cxx_compiler():
        pytest.skip("torch.compile's Inductor needs a C++ compiler")
    torch.manual_seed(0)
    eager = LeopardUNet(base_filters=8, depth=3)
    eager.channels_last_training = True
    compiled = copy.deepcopy(eager)
    net = torch.compile(compiled)
    x = torch.relu(torch.randn(4, 5, 512)) * 3
    y = (torch.rand(4, 512) < 0.1).float()
    outs = []
    for fn in (eager, net):
        out = fn(x)
        torch.nn.functional.binary_cross_entropy_with_logits(out, y).backward()
        outs.append(out.detach())
    assert torch.allclose(outs[0], outs[1], atol=1e-4, rtol=0)
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None
        assert (a.grad - b.grad).norm() / a.grad.norm() < 1e-3, name
    for a, b in zip(eager.buffers(), compiled.buffers(), strict=True):
        assert torch.allclose(a.float(), b.float(), atol=1e-5, rtol=1e-5)
