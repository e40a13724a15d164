"""How Leopard runs on the machine at hand: threads, precision and kernels, chosen at run time.

Nothing here is a constant picked for one CPU. The same wheel meets CPUs with AVX-512 BF16 or
AMX (where bf16 convolutions run about twice as fast as fp32) and CPUs with AVX2 only (where
bf16 is emulated and was measured 40x *slower*). So:

* **threads**: ``--threads``, else ``OMP_NUM_THREADS``, else the cores this process may run
  on (``os.sched_getaffinity``), unless a quick measurement finds one thread faster (a
  machine busy with other work); OpenMP threads wait passively (see
  :mod:`tunelab.leopard`);
* **precision** (``auto``): on CUDA bf16 where supported, else fp16; on a CPU fp32, and bf16
  only when the CPU's flags name a bf16 instruction set (``avx512_bf16``, ``amx_bf16``) *and*
  a quick measurement on the job's windows (cut to 16,384 bp) shows it at least 10 % faster;
* **kernels** (``compile=auto``): ``torch.compile`` (Inductor, weights frozen) only when the
  job is long enough to repay its compile time, a C++ compiler exists, compilation succeeds
  and a measurement shows it faster; otherwise eager, with the reason noted. On CUDA the
  forward pass (eager or compiled) is also captured in a CUDA graph (a few hundred launches
  become one; a capture costs milliseconds) and kept when a measurement shows it faster.

:func:`prepare` returns an :class:`Engine`: the BatchNorm-folded network
(:mod:`tunelab.leopard.inference`) with those choices applied, and :attr:`Engine.runtime`,
which says what was chosen and why (printed with every result).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tunelab.leopard.errors import LeopardError
from tunelab.leopard.inference import InferenceUNet, fold_batchnorm, to_nwc_input
from tunelab.leopard.timing import medians, probe_rates, speedup

if TYPE_CHECKING:
    from tunelab.leopard.bound import Bound
    from tunelab.leopard.model import Architecture, LeopardUNet

__all__ = ["LAYOUTS", "PRECISIONS", "Engine", "Runtime", "bf16_capable", "choose_threads",
           "choose_training_layout", "cpu_flags", "prepare", "probe_bounds"]

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
LAYOUTS = ("auto", "1d", "2d", "2d8")
COMPILE_MODES = ("auto", "on", "off")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
#: a probed alternative (bf16, one thread) must win by this factor to be chosen (noise guard).
MARGIN = 1.10
#: compile only when the estimated eager run is this many times the compile-time guess.
COMPILE_PAYBACK = 10.0
COMPILE_GUESS_S = 60.0  # seconds Inductor took for this network on 2 busy cores
#: probes run on windows at most this long: the rates' ratios hardly change with the length
#: (the work per bp is the same), and a genome-wide job's 163,840-bp windows made the
#: precision probe cost ~2 s of a ~30 s job
PROBE_LENGTH = 16384
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """The instruction-set flags of the first CPU listed (empty when unknown)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.partition(":")[2].split())
    return set()


@functools.cache
def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse instead of returning it to the kernel
    (process-wide, once); False where the C library is not glibc.

    By default glibc serves every block above a threshold (128 KiB, rising to at most 32 MiB)
    with a fresh ``mmap`` that it unmaps when freed, and trims the heap's free top: each
    forward pass then faults its activations' pages in anew. Genome-wide prediction on 2
    cores took 1.4 M minor page faults, and batches of 32 windows of 10,240 bp predicted
    ~10 % slower than with both off, which is what this sets: every block comes from the
    heap and stays there for the next pass (as a caching allocator would; the process keeps
    its peak memory).
    """
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
    return bool(libc.mallopt(m_mmap_max, 0) and libc.mallopt(m_trim_threshold, 2**31 - 1))


def has_cxx_compiler() -> bool:
    """Whether Inductor finds the C++ compiler it needs to compile for a CPU."""
    return any(shutil.which(c) for c in ("c++", "g++", "clang++"))


def bf16_capable(flags: set[str]) -> bool:
    """Whether the CPU has native bf16 arithmetic (not emulated through fp32)."""
    return any(f in flags for f in BF16_FLAGS)


def choose_threads(threads: int | None = None) -> tuple[int, bool]:
    """``(count, given)``: ``threads``, else ``OMP_NUM_THREADS`` (given), else the cores this
    process may use (not given: a measurement may lower it)."""
    if threads:
        return threads, True
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env), True
    try:
        return len(os.sched_getaffinity(0)), False
    except AttributeError:  # not Linux
        return os.cpu_count() or 1, False


@dataclass
class Runtime:
    """What an :class:`Engine` runs with, and why."""

    device: str
    precision: str
    threads: int
    compiled: bool
    cpu_bf16: bool
    graphed: bool = False
    probe_windows_per_s: dict[str, float] = field(default_factory=dict)
    probe_length: int = 0
    probe_gemm_flops_per_s: dict[str, float] = field(default_factory=dict)
    """The GEMM rate of each probed precision with the probe's threads, measured right after
    the probe (CPU only; :func:`probe_bounds` may raise it after the run)."""
    probe_flops_per_window: float = 0.0
    """The forward work of one probe window, which the probe's windows/s times."""
    probe_threads: int = 0
    """The threads the probe ran with."""
    notes: list[str] = field(default_factory=list)

    def probe_bound_fraction(self, name: str) -> float | None:
        """The probe's windows/s of ``name`` as a fraction of its GEMM bound, if measured."""
        gemm = self.probe_gemm_flops_per_s.get(name)
        rate = self.probe_windows_per_s.get(name)
        if not gemm or rate is None or not self.probe_flops_per_window:
            return None
        return rate * self.probe_flops_per_window / gemm

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return asdict(self)

    def summary(self) -> str:
        """One line: ``precision bf16 (CPU has avx512_bf16), 2 threads, eager``."""
        kern = ("torch.compile" if self.compiled else "eager") + (
            " in a CUDA graph" if self.graphed else "")
        probe = ", ".join(f"{k} {v:.1f} w/s{self._beside(k)}"
                          for k, v in self.probe_windows_per_s.items())
        many = "s" if self.threads != 1 else ""
        text = f"{self.device}: precision {self.precision}, {self.threads} thread{many}, {kern}"
        if probe:
            text += f" (probe on {self.probe_length:,}-bp windows: {probe})"
        if self.notes:
            text += "; " + "; ".join(self.notes)
        return text


    def _beside(self, name: str) -> str:
        fraction = self.probe_bound_fraction(name)
        if fraction is None:
            return ""
        return (f" ({fraction:.2f} of bound: {name} GEMM "
                f"{self.probe_gemm_flops_per_s[name] / 1e9:,.1f} GFLOP/s)")


def _probe_gemm(runtime: Runtime, threads: int) -> None:
    """Right after the precision probe, with its threads: one timed GEMM product of each
    probed precision (0.1-0.2 s on the quiet 2-core EPYC), so that its windows/s and its
    bound are measured at the same moment; measured after the run instead, under a load
    that moved, the probe's fp32 rate came out at 1.60-2.13 of bound."""
    from tunelab.leopard.bound import measure_bound

    runtime.probe_threads = threads
    runtime.probe_gemm_flops_per_s = {
        name: measure_bound(name, 1.0, threads, repeats=1).flops_per_s
        for name in runtime.probe_windows_per_s}


def probe_bounds(runtime: Runtime, arch: Architecture, measured: Bound | None = None) -> None:
    """The work of a probe window, so that each probed windows/s is printed beside its
    bound as training's and the prediction's own figures are; counted after the run (the
    runtime line is printed then; the first count costs ~2 s). The higher of the probe's
    GEMM rate and ``measured`` (the run's own bound, where precision and threads match)
    counts, and a rate still under the probe's windows/s is measured again, up to twice."""
    if not runtime.probe_gemm_flops_per_s:
        return
    from tunelab.leopard.bound import Bound, measure_bound
    from tunelab.leopard.model import flops_per_window

    work = flops_per_window(arch, runtime.probe_length, train=False)
    for name, gemm in runtime.probe_gemm_flops_per_s.items():
        bound = Bound(name, gemm, work, runtime.probe_threads)
        if measured is not None and (measured.precision, measured.threads) == (
                name, runtime.probe_threads):
            bound = Bound(name, max(gemm, measured.flops_per_s), work, bound.threads)
        for _ in range(2):
            if bound.fraction(runtime.probe_windows_per_s[name]) <= 1:
                break
            now = measure_bound(name, work, runtime.probe_threads)
            bound = bound if bound.flops_per_s >= now.flops_per_s else now
        runtime.probe_gemm_flops_per_s[name] = bound.flops_per_s
    runtime.probe_flops_per_window = work


class Engine:
    """A trained network ready to predict: ``engine(x)`` -> probabilities ``(N, L)`` float32
    for input ``(N, C, L)`` or channels-last ``(N, C, 1, L)``.

    With a compiled or captured network every call gets exactly ``batch`` windows (a
    shorter batch is padded), so Inductor never recompiles and the graph always fits.
    """

    def __init__(self, net: InferenceUNet, runtime: Runtime, batch: int,
                 fn: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.net = net
        self.runtime = runtime
        self.batch = batch
        self._fn = fn if fn is not None else net  # (a compiled module refuses bool())
        self.device = torch.device(runtime.device)
        self.in_channels = net.in_channels
        self.multiple = net.multiple

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        if (self.runtime.compiled or self.runtime.graphed) and n != self.batch:
            pad = torch.zeros((self.batch - n, *x.shape[1:]), dtype=x.dtype, device=x.device)
            if x.dim() == 4:
                pad = pad.contiguous(memory_format=torch.channels_last)
            x = torch.cat([x, pad])
        with torch.inference_mode():
            return torch.sigmoid(self._fn(x.to(self.device))[:n])


def _pick_threads(net: InferenceUNet, x: torch.Tensor, cores: int, notes: list[str]) -> int:
    """``cores`` threads, or 1 when a quick alternating measurement finds one thread at least
    10 % faster (other processes keep the cores busy); leaves torch set to the choice."""
    def with_threads(n: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def run(t: torch.Tensor) -> torch.Tensor:
            torch.set_num_threads(n)
            return net(t)
        return run

    ratio = speedup(probe_rates({"many": with_threads(cores), "one": with_threads(1)}, x),
                     "one", "many")
    chosen = 1 if ratio >= MARGIN else cores
    if chosen == 1:
        notes.append(f"1 thread: it ran {ratio:.2f}x {cores} threads "
                     "(the cores are busy with other work)")
    torch.set_num_threads(chosen)
    return chosen


def _compile(net: InferenceUNet, x: torch.Tensor,
             notes: list[str]) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``torch.compile(net)`` compiled on ``x``'s shape (weights frozen), or None + a note."""
    if x.device.type == "cpu" and not has_cxx_compiler():
        notes.append("no C++ compiler, so no torch.compile")
        return None
    try:
        import torch._inductor.config as inductor_config

        fn = torch.compile(net, dynamic=False)
        with inductor_config.patch(freezing=True), torch.inference_mode():
            fn(x)
    except Exception as exc:  # Inductor fails in many ways (compiler, codegen, platform)
        first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        notes.append(f"torch.compile failed ({first}); eager")
        return None
    return fn


class _Graphed:
    """``fn`` captured in a CUDA graph for inputs shaped like ``example``: a call copies its
    input into the static buffer and replays (the output is overwritten by the next call)."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor],
                 example: torch.Tensor) -> None:
        self.static = example.clone()
        side = torch.cuda.Stream(example.device)
        side.wait_stream(torch.cuda.current_stream(example.device))
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(2):  # cuDNN picks its algorithms before the capture
                fn(self.static)
        torch.cuda.current_stream(example.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(self.graph):
            self.out = fn(self.static)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.static.copy_(x)
        self.graph.replay()
        return self.out


def _capture(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
             notes: list[str]) -> _Graphed | None:
    """``fn`` captured in a CUDA graph on ``x``'s shape, or None + a note."""
    try:
        return _Graphed(fn, x)
    except Exception as exc:  # a capture can fail in many ways (an op that syncs, ...)
        first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        notes.append(f"CUDA graph capture failed ({first}); not captured")
        return None


def prepare(model: LeopardUNet, device: str | torch.device = "cpu",
            precision: str = "auto", compile: str = "auto", threads: int | None = None,
            window: int = 10240, batch: int = 32,
            expected_windows: int | None = None) -> Engine:
    """Fold, cast and (maybe) compile ``model`` for predicting ``batch`` windows of ``window``
    bp at a time; ``expected_windows`` (the job's size) decides whether compiling pays."""
    if precision not in PRECISIONS:
        raise LeopardError(f"precision: unknown value {precision!r}; choose one of "
                           f"{', '.join(PRECISIONS)}")
    if compile not in COMPILE_MODES:
        raise LeopardError(f"compile: unknown value {compile!r}; choose one of "
                           f"{', '.join(COMPILE_MODES)}")
    dev = torch.device(device)
    n_threads, given = choose_threads(threads)
    if dev.type == "cpu":
        keep_freed_memory()
        torch.set_num_threads(n_threads)
        with contextlib.suppress(RuntimeError):  # already set, or parallel work started
            torch.set_num_interop_threads(1)
    flags = cpu_flags()
    runtime = Runtime(device=str(dev), precision="fp32", threads=n_threads, compiled=False,
                      cpu_bf16=bf16_capable(flags))
    notes = runtime.notes
    model = model.to("cpu").eval()

    def build(name: str) -> InferenceUNet:
        return fold_batchnorm(model).to(dev).to_precision(_DTYPES[name])

    nets = {"fp32": build("fp32")}
    probe_len = min(window, max(PROBE_LENGTH // model.arch.multiple, 1) * model.arch.multiple)
    runtime.probe_length = probe_len
    probe_x = to_nwc_input(torch.rand(min(batch, 4), model.arch.in_channels, probe_len)).to(dev)
    if dev.type == "cuda":
        # cuDNN times each convolution's candidate kernels once per shape and keeps the
        # fastest: a prediction's batches have one shape (a short last one is padded when
        # the forward pass is captured)
        torch.backends.cudnn.benchmark = True
        chosen = precision if precision != "auto" else (
            "bf16" if torch.cuda.is_bf16_supported() else "fp16")
    elif precision == "auto":
        chosen = "fp32"
        if runtime.cpu_bf16:
            nets["bf16"] = build("bf16")
            rates = probe_rates(nets, probe_x)
            runtime.probe_windows_per_s = medians(rates)
            _probe_gemm(runtime, n_threads)
            ratio = speedup(rates, "bf16", "fp32")
            if ratio >= MARGIN:
                chosen = "bf16"
                notes.append(f"bf16: the CPU has {'/'.join(f for f in BF16_FLAGS if f in flags)}"
                             f" and it ran {ratio:.2f}x fp32")
            else:
                notes.append(f"fp32: bf16 was only {ratio:.2f}x fp32 here")
        else:
            notes.append("fp32: the CPU has no native bf16 (no avx512_bf16/amx_bf16)")
    else:
        chosen = precision
        if chosen == "bf16" and not runtime.cpu_bf16:
            notes.append("bf16 asked on a CPU without native bf16: expect it to be slow")
    net = nets[chosen] if chosen in nets else build(chosen)
    runtime.precision = chosen
    if dev.type == "cpu" and not given and n_threads > 1:
        runtime.threads = _pick_threads(net, probe_x, n_threads, notes)
    fn: Callable[[torch.Tensor], torch.Tensor] | None = None
    want = compile == "on"
    if compile == "auto":
        rate = (runtime.probe_windows_per_s.get(chosen)
                or medians(probe_rates({chosen: net}, probe_x, 1))[chosen]) * probe_len / window
        eager_s = (expected_windows or 0) / max(rate, 1e-9)
        want = eager_s > COMPILE_PAYBACK * COMPILE_GUESS_S
        if not want:
            notes.append(f"eager: the job (~{eager_s:.0f} s) is too short to repay "
                         f"torch.compile (~{COMPILE_GUESS_S:.0f} s)")
    if want:
        full = to_nwc_input(torch.rand(batch, net.in_channels, window)).to(dev)
        fn = _compile(net, full, notes)
        if fn is not None and compile == "auto":
            ratio = speedup(probe_rates({"eager": net, "compiled": fn}, full), "compiled", "eager")
            if ratio < 1.0:
                notes.append(f"eager: compiled ran {ratio:.2f}x eager")
                fn = None
        runtime.compiled = fn is not None
    if dev.type == "cuda":
        full = to_nwc_input(torch.rand(batch, net.in_channels, window)).to(dev)
        base = fn if fn is not None else net
        graphed = _capture(base, full, notes)
        if graphed is not None:
            ratio = speedup(probe_rates({"graph": graphed, "base": base}, full), "graph", "base")
            if ratio >= 1.0:
                fn, runtime.graphed = graphed, True
                notes.append(f"CUDA graph: it ran {ratio:.2f}x the uncaptured forward pass")
            else:
                notes.append(f"no CUDA graph: it ran {ratio:.2f}x the uncaptured pass")
    return Engine(net, runtime, batch, fn)


def plain_batchnorm(model: torch.nn.Module) -> bool:
    """Whether every BatchNorm of ``model`` is a plain one (not synchronised across workers):
    what the 2-D form and captured steps need."""
    return all(type(m) is torch.nn.BatchNorm1d and m.track_running_stats
               for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._NormBase))


def choose_training_layout(model: LeopardUNet, layout: str, batch: int, window: int,
                           amp_dtype: torch.dtype | None = None,
                           compiled: bool = False,
                           rates_out: dict[str, float] | None = None) -> tuple[str, str]:
    """``("1d" | "2d", why)``: which form of the convolutions trains ``model``.

    ``"2d"`` is the channels-last 2-D form of the same computation
    (:attr:`LeopardUNet.channels_last_training`; the same outputs and gradients up to
    rounding); it needs plain BatchNorm. On a CPU ``"auto"`` times forward +
    backward of both on ``min(batch, 4)`` windows of the job's length (under bf16 autocast
    when ``amp_dtype`` is given), alternating, and takes the faster; ``model`` is untouched.
    When the step will be ``compiled``, ``"auto"`` takes the 2-D form without a probe: an
    eager probe cannot see what Inductor fuses (BatchNorm's reductions and element-wise
    work, the 2-D form's cost in eager mode), and compiling both to time them costs minutes.
    Compiled, the 2-D form trained 1.43x the 1-D one in bf16 and 1.33x in fp32 on a 2-core
    AVX-512 EPYC (``benchmarks/leopard_vs_keras.py --compile``); ``"1d"`` still forces it.
    A probe's median training windows/s per form go into ``rates_out``.
    """
    if layout not in LAYOUTS:
        raise LeopardError(f"layout: unknown value {layout!r}; choose one of "
                           f"{', '.join(LAYOUTS)}")
    dev = next(model.parameters()).device
    if not plain_batchnorm(model):
        return "1d", "the 2-D form needs plain BatchNorm"
    if layout != "auto":
        return layout, "asked"
    if dev.type != "cpu":
        return "1d", "on a GPU the training step's probe measures both forms"
    if compiled:
        return "2d", ("compiled: Inductor fuses the 2-D form's BatchNorm, which leaves it "
                      "the faster convolutions")
    import copy

    probe = copy.deepcopy(model).train()
    x = torch.rand(min(batch, 4), model.arch.in_channels, window)

    def step(two_d: bool) -> Callable[[torch.Tensor], None]:
        def run(t: torch.Tensor) -> None:
            probe.channels_last_training = two_d
            with torch.autocast("cpu", dtype=amp_dtype or torch.bfloat16,
                                enabled=amp_dtype is not None):
                out = probe(t)
            out.float().sum().backward()
            probe.zero_grad(set_to_none=True)
        return run

    rates = probe_rates({"2d": step(True), "1d": step(False)}, x, grad=True)
    if rates_out is not None:
        rates_out.update(medians(rates))
    ratio = speedup(rates, "2d", "1d")
    chosen = "2d" if ratio >= 1.0 else "1d"
    return chosen, f"the 2-D form ran a training step {ratio:.2f}x the 1-D one"
