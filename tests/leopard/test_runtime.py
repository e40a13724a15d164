"""Run-time choices: CPU flags, precision, threads, torch.compile fallbacks; bf16 accuracy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tunelab.leopard import runtime
from tunelab.leopard.data import load_chromosomes, load_manifest
from tunelab.leopard.errors import LeopardError
from tunelab.leopard.metrics import MetricState
from tunelab.leopard.model import LeopardUNet
from tunelab.leopard.predict import predict_chromosome
from tunelab.leopard.train import TrainConfig, load_checkpoint, train


def _small() -> LeopardUNet:
    torch.manual_seed(0)
    return LeopardUNet(base_filters=4, depth=3).eval()


def test_cpu_flags_decide_whether_bf16_is_native(tmp_path: Path) -> None:
    avx2 = tmp_path / "avx2"
    avx2.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\n")
    avx512 = tmp_path / "avx512"
    avx512.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n")
    assert not runtime.bf16_capable(runtime.cpu_flags(str(avx2)))
    assert runtime.bf16_capable(runtime.cpu_flags(str(avx512)))
    assert runtime.cpu_flags(str(tmp_path / "missing")) == set()


def test_fp32_engine_gives_the_model_probabilities() -> None:
    m = _small()
    eng = runtime.prepare(m, "cpu", "fp32", "off", threads=1, window=128, batch=4)
    x = torch.randn(3, 5, 128)
    with torch.no_grad():
        want = torch.sigmoid(m(x))
    assert torch.allclose(eng(x), want, atol=1e-6)
    assert eng.runtime.precision == "fp32" and not eng.runtime.compiled
    assert eng.runtime.threads == 1 and torch.get_num_threads() == 1


def test_a_captured_engine_gets_batches_of_one_shape() -> None:
    """A CUDA graph replays one shape: a short batch is padded and the padding's outputs
    dropped (a stand-in for the captured call, which needs CUDA)."""
    from tunelab.leopard.inference import fold_batchnorm, to_nwc_input

    net = fold_batchnorm(_small())
    seen: list[int] = []

    def captured(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.shape[0])
        assert x.is_contiguous(memory_format=torch.channels_last)
        return net(x)

    rt = runtime.Runtime(device="cpu", precision="fp32", threads=1, compiled=False,
                         cpu_bf16=False, graphed=True)
    eng = runtime.Engine(net, rt, 4, captured)
    x = to_nwc_input(torch.rand(3, 5, 64))
    out = eng(x)
    assert seen == [4] and out.shape == (3, 64)
    with torch.no_grad():
        assert torch.allclose(out, torch.sigmoid(net(x)))
    assert "eager in a CUDA graph" in rt.summary()


def test_auto_keeps_fp32_on_a_cpu_without_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "cpu_flags", lambda path="": {"avx2", "fma"})
    eng = runtime.prepare(_small(), "cpu", "auto", "off", threads=1, window=128, batch=4)
    assert eng.runtime.precision == "fp32"
    assert eng.runtime.probe_windows_per_s == {}  # bf16 is not even tried
    assert "no native bf16" in eng.runtime.summary()


def test_auto_measures_bf16_where_the_cpu_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "cpu_flags", lambda path="": {"avx512_bf16"})
    eng = runtime.prepare(_small(), "cpu", "auto", "off", threads=1, window=128, batch=4)
    rates = eng.runtime.probe_windows_per_s
    assert set(rates) == {"fp32", "bf16"} and all(r > 0 for r in rates.values())
    faster = "bf16: the CPU has" in eng.runtime.summary()
    assert eng.runtime.precision == ("bf16" if faster else "fp32")
    assert eng.net.dtype == (torch.bfloat16 if faster else torch.float32)


def test_thread_count_is_measured_only_when_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    eng = runtime.prepare(_small(), "cpu", "fp32", "off", window=128, batch=4)
    assert eng.runtime.threads == 1 and not any("thread" in n for n in eng.runtime.notes)
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    eng = runtime.prepare(_small(), "cpu", "fp32", "off", window=128, batch=4)
    assert eng.runtime.threads in (1, 2) and torch.get_num_threads() == eng.runtime.threads


def test_compile_falls_back_to_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    m = _small()
    monkeypatch.setattr(runtime.shutil, "which", lambda name: None)
    eng = runtime.prepare(m, "cpu", "fp32", "on", threads=1, window=128, batch=4)
    assert not eng.runtime.compiled and "no C++ compiler" in eng.runtime.summary()
    monkeypatch.undo()

    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("inductor exploded\nwith a traceback")

    monkeypatch.setattr(torch, "compile", broken)
    eng = runtime.prepare(m, "cpu", "fp32", "on", threads=1, window=128, batch=4)
    assert not eng.runtime.compiled
    assert "torch.compile failed (inductor exploded); eager" in eng.runtime.summary()
    x = torch.randn(2, 5, 128)
    with torch.no_grad():
        assert torch.allclose(eng(x), torch.sigmoid(m(x)), atol=1e-6)


def test_a_compiled_network_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real dynamo-compiled module (its eager backend: no minutes of Inductor here) runs
    the engine: a compiled module refuses bool(), which once broke every compiled job."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile",
                        lambda net, **kw: real(net, backend="eager", dynamic=False))
    m = _small()
    eng = runtime.prepare(m, "cpu", "fp32", "on", threads=1, window=128, batch=4)
    assert eng.runtime.compiled
    x = torch.randn(3, 5, 128)  # padded to the compiled batch of 4
    with torch.no_grad():
        assert torch.allclose(eng(x), torch.sigmoid(m(x)), atol=1e-5)


def test_auto_compile_only_for_long_jobs() -> None:
    eng = runtime.prepare(_small(), "cpu", "fp32", "auto", threads=1, window=128, batch=4,
                          expected_windows=10)
    assert not eng.runtime.compiled and "too short to repay torch.compile" in \
        eng.runtime.summary()


def test_bad_choices_are_one_line_errors() -> None:
    with pytest.raises(LeopardError, match="precision: unknown value 'fp8'"):
        runtime.prepare(_small(), "cpu", "fp8", "off")
    with pytest.raises(LeopardError, match="compile: unknown value 'maybe'"):
        runtime.prepare(_small(), "cpu", "fp32", "maybe")


def test_training_layout_is_measured_without_touching_the_model() -> None:
    """auto times a training step of both forms on a copy; asked forms are kept; the 2-D
    form is never chosen around a synchronised BatchNorm; a bad value is one line."""
    from tunelab.leopard.distributed import _global_batch_norm_cls

    model = _small().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    layout, why = runtime.choose_training_layout(model, "auto", 8, 256)
    assert layout in ("1d", "2d") and "ran a training step" in why
    assert not model.channels_last_training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model.stem[0].weight.grad is None
    layout, why = runtime.choose_training_layout(model, "auto", 8, 256, compiled=True)
    assert layout == "2d" and "compiled" in why
    assert runtime.choose_training_layout(model, "1d", 8, 256, compiled=True) == ("1d", "asked")
    assert runtime.choose_training_layout(model, "2d", 8, 256) == ("2d", "asked")
    bn = model.stem[2]
    model.stem[2] = _global_batch_norm_cls()(bn.num_features)
    assert runtime.choose_training_layout(model, "2d", 8, 256)[0] == "1d"
    assert runtime.choose_training_layout(model, "auto", 8, 256, compiled=True)[0] == "1d"
    with pytest.raises(LeopardError, match="layout: unknown value '3d'"):
        runtime.choose_training_layout(model, "3d", 8, 256)


@pytest.mark.slow
@pytest.mark.skipif(not runtime.bf16_capable(runtime.cpu_flags()),
                    reason="this CPU has no native bf16 (no avx512_bf16/amx_bf16)")
def test_bf16_pr_auc_agrees_with_fp32_on_the_synthetic_genome(synth: Path,
                                                              tmp_path: Path) -> None:
    """Where bf16 can be chosen, its predictions must score like fp32's: PR-AUC of the
    held-out chromosomes within 1e-3."""
    train(TrainConfig(data=synth, out=tmp_path / "t", window=512, batch_size=8, epochs=2,
                      steps_per_epoch=6, bn_momentum=0.1, max_eval_windows=16, threads=2,
                      progress=False, device="cpu"))
    ck = load_checkpoint(tmp_path / "t" / "best.pt")
    model = LeopardUNet()
    model.load_state_dict(ck["model"])
    m = load_manifest(synth)
    cs = load_chromosomes(m, m.chromosomes("val") + m.chromosomes("test"))
    auc = {}
    for precision in ("fp32", "bf16"):
        eng = runtime.prepare(model, "cpu", precision, "off", threads=2, window=512, batch=16)
        state = MetricState("cpu")
        for off, n in zip(cs.offsets.tolist(), cs.lengths.tolist(), strict=True):
            p = predict_chromosome(eng, cs.seq[off:off + n], cs.dnase[off:off + n], None, 512)
            logits = torch.logit(torch.from_numpy(p).double().clamp(1e-9, 1 - 1e-9))
            state.update(logits, torch.from_numpy(cs.label[off:off + n]))
        auc[precision] = state.compute()["pr_auc"]
    assert np.isfinite(list(auc.values())).all()
    assert abs(auc["fp32"] - auc["bf16"]) <= 1e-3, auc


_PASS_FAULTS = """
import resource, sys, torch
from tunelab.leopard import runtime
from tunelab.leopard.inference import fold_batchnorm, to_nwc_input
from tunelab.leopard.model import LeopardUNet
if sys.argv[1] == "kept":
    assert runtime.keep_freed_memory()
torch.set_num_threads(1)
net = fold_batchnorm(LeopardUNet(base_filters=32, depth=2).eval())
x = to_nwc_input(torch.rand(2, 5, 1 << 18))  # activations of 64 MiB: above any mmap threshold
with torch.inference_mode():
    net(x)
    net(x)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        net(x)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.slow
def test_freed_activations_are_reused_without_new_page_faults() -> None:
    """Later forward passes fault their activations' pages in anew under glibc's defaults,
    and hardly after :func:`runtime.keep_freed_memory` (which :func:`runtime.prepare` calls).
    Measured: 0 locally and 20,480 on a CI clone for one pass kept, 234,044 and 820,251
    under the defaults; three passes are counted after two of warm-up."""
    if not runtime.keep_freed_memory():
        pytest.skip("the C library is not glibc")
    faults = {}
    for mode in ("kept", "default"):
        r = subprocess.run([sys.executable, "-c", _PASS_FAULTS, mode], capture_output=True,
                           text=True, timeout=120, check=True)
        faults[mode] = int(r.stdout)
    assert faults["default"] > 150_000  # several 64 MiB activations a pass, 16,384 pages each
    assert faults["kept"] < faults["default"] / 10


def test_the_precision_probe_prints_each_rate_beside_its_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The prediction's probe line gave windows/s per precision (``fp32 595.1 w/s, bf16
    710.2 w/s``) with no bound, where training and the prediction's own figure give one.
    Each probed precision's GEMM rate is measured right after the probe with its threads
    (the run's own bound counts where higher, same precision and threads), and every rate
    is printed beside it once the run has counted a probe window's work."""
    from tunelab.leopard import bound
    from tunelab.leopard.model import flops_per_window

    asked = []

    def fake(precision, per_window, threads=None, **kw):
        asked.append((precision, threads))
        return bound.Bound(precision, {"fp32": 1e11, "bf16": 4e11}[precision], per_window, 1)

    monkeypatch.setattr(bound, "measure_bound", fake)
    monkeypatch.setattr(runtime, "cpu_flags", lambda path="": {"avx512_bf16"})
    model = _small()
    rt = runtime.prepare(model, "cpu", "auto", "off", threads=1, window=128, batch=4).runtime
    assert sorted(asked) == [("bf16", 1), ("fp32", 1)]  # beside the probe, its threads
    assert "of bound" not in rt.summary()  # the work of a window is counted after the run
    runtime.probe_bounds(rt, model.arch, bound.Bound("bf16", 5e11, 1.0, 1))
    assert len(asked) == 2  # the run's own bf16 bound, higher, counts; nothing measured again
    work = flops_per_window(model.arch, rt.probe_length, train=False)
    assert rt.probe_flops_per_window == work
    for name, gemm in (("fp32", 1e11), ("bf16", 5e11)):
        fraction = rt.probe_windows_per_s[name] * work / gemm
        assert rt.probe_bound_fraction(name) == pytest.approx(fraction)
        assert (f"{name} {rt.probe_windows_per_s[name]:.1f} w/s ({fraction:.2f} of bound: "
                f"{name} GEMM {gemm / 1e9:,.1f} GFLOP/s)") in rt.summary()
    fixed = runtime.prepare(model, "cpu", "fp32", "off", threads=1, window=128, batch=4)
    runtime.probe_bounds(fixed.runtime, model.arch)
    assert "of bound" not in fixed.runtime.summary()  # no probe, no figure


def test_a_prediction_s_runtime_line_has_the_probe_s_bounds(
        synth: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tunelab.leopard.predict import predict_genome

    monkeypatch.setattr(runtime, "cpu_flags", lambda path="": {"avx512_bf16"})
    model = _small()
    ck = tmp_path / "m.pt"
    torch.save({"arch": model.arch.to_dict(), "window": 512, "model": model.state_dict()}, ck)
    res = predict_genome(ck, synth, tmp_path / "p.bedGraph", ["chr4"], device="cpu",
                         threads=1)
    assert "fp32 " in res["runtime"] and res["runtime"].count(" of bound: ") == 2


def test_the_runtime_line_counts_one_thread_in_the_singular() -> None:
    """``runtime: cpu: precision bf16, 1 threads`` read wrong."""
    rt = runtime.prepare(_small(), "cpu", "fp32", "off", threads=1, window=128, batch=4).runtime
    assert "precision fp32, 1 thread, eager" in rt.summary()


def test_a_probe_bound_under_the_probe_s_rate_is_measured_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A GEMM rate under what the probe reached is no bound (a busier moment): measured
    again, the higher counts."""
    from tunelab.leopard import bound

    rates = iter([1e3, 1e3, 1e15])  # fp32 and bf16 beside the probe, then fp32 again

    def fake(precision, per_window, threads=None, **kw):
        return bound.Bound(precision, next(rates), per_window, 1)

    monkeypatch.setattr(bound, "measure_bound", fake)
    monkeypatch.setattr(runtime, "cpu_flags", lambda path="": {"avx512_bf16"})
    model = _small()
    rt = runtime.prepare(model, "cpu", "auto", "off", threads=1, window=128, batch=4).runtime
    runtime.probe_bounds(rt, model.arch, bound.Bound("bf16", 1e16, 1.0, 1))
    assert rt.probe_gemm_flops_per_s == {"fp32": 1e15, "bf16": 1e16}
    assert all(rt.probe_bound_fraction(n) < 1 for n in ("fp32", "bf16"))
