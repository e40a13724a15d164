"""One training step in as few launches as the device allows, and the evaluation forward pass.

A Leopard step is a few hundred small kernels (26 convolutions, their BatchNorms, the loss,
Adam): on an H100 an eager step of 64 windows ran at 3,044 windows/s, launch-bound, and 7,442
under CUDA graphs. :class:`TrainStep` runs the step either

* **eager** — as written (the CPU's only mode), or
* **graph** — the whole step (forward, loss, backward, the optimiser update) captured once in a
  CUDA graph and replayed: inputs are copied into static buffers, the outputs (the step's BCE
  sum and labelled-base count) are static device tensors. Warm-up steps before the capture
  (cuDNN's autotuning, the optimiser's state) would train the model on the first batch, so
  every parameter, buffer and optimiser state is saved before and restored in place after:
  the first replayed step is the run's first step. The optimiser is capturable (fused Adam on
  CUDA) with a tensor learning rate, so warm-up schedules still apply.

:func:`choose_step_mode` measures both on a copy of the model (random windows; the model and
optimiser are untouched) and takes the faster; CUDA graphs need CUDA, synchronised BatchNorm
or DDP keep the step eager (NCCL inside a graph is not attempted), and fp16's gradient scaler
too. Nothing in a step reads a value back to the host: losses stay on the device until the
epoch ends. :class:`Forward` does the same for evaluation (a captured forward pass on batches
of one shape).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tunelab.leopard import distributed as D
from tunelab.leopard.errors import LeopardError

if TYPE_CHECKING:
    import torch

__all__ = ["GRAPH_MODES", "Forward", "TrainStep", "choose_step_mode", "cuda_capture",
           "fused_adam_supported", "make_adam", "masked_bce_sum", "restore_lr_kind", "set_lr",
           "use_cuda_training_kernels"]

GRAPH_MODES = ("auto", "on", "off")
#: warm-up steps before a capture (cuDNN picks its algorithms, the optimiser makes its state)
WARMUP_STEPS = 3
#: timed steps per candidate in :func:`choose_step_mode`
PROBE_STEPS = 8

Outputs = tuple["torch.Tensor", ...]
#: ``capture(fn) -> (outputs, replay)``: record ``fn`` once; ``replay()`` re-runs it in place
Capture = Callable[[Callable[[], Outputs]], tuple[Outputs, Callable[[], None]]]


def use_cuda_training_kernels() -> None:
    """How training runs on CUDA (and what a profile of its step must run with): cuDNN times
    the candidate kernels of each convolution once per shape and keeps the fastest (a job's
    shapes stay the same), and float32 matmuls and convolutions may use TF32."""
    import torch

    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def masked_bce_sum(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor,
                                                                        torch.Tensor]:
    """Sum of BCE over labelled bases (label >= 0) and their count."""
    import torch.nn.functional as F

    mask = (labels >= 0).float()
    target = labels.clamp(min=0).float()
    loss = F.binary_cross_entropy_with_logits(logits.float(), target, weight=mask,
                                              reduction="sum")
    return loss, mask.sum()


def cuda_capture(fn: Callable[[], Outputs]) -> tuple[Outputs, Callable[[], None]]:
    """Capture ``fn`` in a CUDA graph (its kernels are recorded, not run)."""
    import torch

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return out, graph.replay


def fused_adam_supported(device: torch.device) -> bool:
    """Whether Adam's fused (single-kernel, capturable) implementation serves ``device``."""
    return device.type == "cuda"


def make_adam(params: Any, lr: float, device: torch.device, graph: bool) -> torch.optim.Adam:
    """Adam (eps 1e-7, as Keras): fused on CUDA; capturable with a tensor learning rate when
    the step is captured in a CUDA graph (a float rate would be frozen into the graph)."""
    import torch

    if not fused_adam_supported(device):
        return torch.optim.Adam(params, lr=lr, eps=1e-7)
    rate: float | torch.Tensor = torch.tensor(lr, device=device) if graph else lr
    return torch.optim.Adam(params, lr=rate, eps=1e-7, fused=True, capturable=graph)


def set_lr(opt: torch.optim.Optimizer, value: float) -> None:
    """Set every group's learning rate (in place where it is a tensor a graph reads)."""
    import torch

    for g in opt.param_groups:
        if isinstance(g["lr"], torch.Tensor):
            g["lr"].fill_(value)
        else:
            g["lr"] = value


def restore_lr_kind(opt: torch.optim.Optimizer, device: torch.device, graph: bool) -> None:
    """After ``opt.load_state_dict``: each learning rate back to the kind this run's step needs
    (a tensor on ``device`` for a captured step, else a float), whatever the checkpoint held."""
    import torch

    for g in opt.param_groups:
        rate = float(g["lr"])
        g["lr"] = torch.tensor(rate, device=device) if graph else rate


def _state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor a step changes: parameters, buffers and the optimiser's state."""
    import torch

    out = [*model.parameters(), *model.buffers()]
    for st in opt.state.values():
        out += [v for v in st.values() if isinstance(v, torch.Tensor)]
    return out


class TrainStep:
    """``step(x, y) -> (bce_sum, labelled)``: one optimisation step of ``net`` (the model,
    maybe wrapped by DDP or compiled) on a batch, eager or replayed from a captured graph.

    ``capture`` records a step (default :func:`cuda_capture`; the tests pass one that runs it
    eagerly, which exercises the warm-up, restore and static-buffer logic on a CPU).
    """

    def __init__(self, model: torch.nn.Module, net: torch.nn.Module, opt: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler, ctx: D.DistContext, amp: bool,
                 amp_dtype: torch.dtype, graph: bool, capture: Capture | None = None) -> None:
        self.model, self.net, self.opt, self.scaler, self.ctx = model, net, opt, scaler, ctx
        self.amp, self.amp_dtype, self.graph = amp, amp_dtype, graph
        self._capture = capture or cuda_capture
        self._static: tuple[torch.Tensor, torch.Tensor] | None = None
        self._out: Outputs = ()
        self._replay: Callable[[], None] | None = None
        #: why a capture failed and the step went eager (None: it did not)
        self.fallback: str | None = None

    def _body(self, x: torch.Tensor, y: torch.Tensor) -> Outputs:
        import torch

        dev = x.device.type
        with torch.autocast(dev, dtype=self.amp_dtype, enabled=self.amp,
                            cache_enabled=not self.graph):
            logits = self.net(x)
        lsum, cnt = masked_bce_sum(logits, y)
        total = D.all_reduce_sum(cnt.detach().double().reshape(1).clone(), self.ctx)
        loss = lsum * (self.ctx.world / total.clamp_min(1.0).float())
        # captured: gradients live in the graph's memory and are zeroed in it
        self.opt.zero_grad(set_to_none=not self.graph)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        return lsum.detach(), cnt.detach()

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> Outputs:
        if not self.graph:
            return self._body(x, y)
        if self._replay is None:
            self._record(x, y)
            if not self.graph:
                return self._body(x, y)
        assert self._static is not None and self._replay is not None
        self._static[0].copy_(x, non_blocking=True)
        self._static[1].copy_(y, non_blocking=True)
        self._replay()
        return self._out

    def _record(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Warm up on the first batch, capture the step, restore the state from before."""
        import torch

        sx, sy = x.clone(), y.clone()
        saved = [t.detach().clone() for t in _state(self.model, self.opt)]
        known = len(saved)
        side = torch.cuda.Stream() if x.is_cuda else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            for _ in range(WARMUP_STEPS):
                self._body(sx, sy)
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)
        try:
            self._out, self._replay = self._capture(lambda: self._body(sx, sy))
        except Exception as exc:  # an op that cannot be captured: the step stays eager
            self.graph = False
            self.fallback = f"CUDA graph capture failed ({_first_line(exc)}); eager steps"
        now = _state(self.model, self.opt)
        with torch.no_grad():
            for t, old in zip(now[:known], saved, strict=True):
                t.copy_(old)
            for t in now[known:]:  # optimiser state made by the warm-up: as if never stepped
                t.zero_()
        self._static = (sx, sy)


class Forward:
    """The evaluation forward pass ``forward(x) -> logits``: eager, or captured once in a CUDA
    graph (batches of one shape, as :meth:`DeviceWindows.eval_batches` makes them) and
    replayed; the weights are read in place at every replay."""

    def __init__(self, model: torch.nn.Module, amp: bool, amp_dtype: torch.dtype, graph: bool,
                 capture: Capture | None = None) -> None:
        self.model, self.amp, self.amp_dtype, self.graph = model, amp, amp_dtype, graph
        self._capture = capture or cuda_capture
        self._static: torch.Tensor | None = None
        self._out: Outputs = ()
        self._replay: Callable[[], None] | None = None

    def _body(self, x: torch.Tensor) -> Outputs:
        import torch

        with torch.no_grad(), torch.autocast(x.device.type, dtype=self.amp_dtype,
                                             enabled=self.amp, cache_enabled=not self.graph):
            return (self.model(x),)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.graph:
            return self._body(x)[0]
        if self._static is None or self._static.shape != x.shape:
            try:
                self._record(x)
            except Exception:  # an op that cannot be captured: evaluate eagerly
                self.graph = False
                return self._body(x)[0]
        assert self._replay is not None and self._static is not None
        self._static.copy_(x, non_blocking=True)
        self._replay()
        return self._out[0]

    def _record(self, x: torch.Tensor) -> None:
        """Warm up (cuDNN's choices) and capture the forward pass on ``x``'s shape."""
        import torch

        sx = x.clone()
        side = torch.cuda.Stream() if x.is_cuda else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            self._body(sx)
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)
        self._out, self._replay = self._capture(lambda: self._body(sx))
        self._static = sx


def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:160] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def choose_step_mode(model: torch.nn.Module, layouts: list[str], graphs: str, *, batch: int,
                     window: int, in_channels: int, ctx: D.DistContext, amp: bool,
                     amp_dtype: torch.dtype, scaler_enabled: bool, plain_bn: bool
                     ) -> tuple[str, bool, str, dict[str, float]]:
    """``(layout, graph, why, windows/s by candidate)``: the convolution form (of
    ``layouts``: one, or ``1d`` and ``2d`` to measure) and whether training steps are
    captured in a CUDA graph. ``graphs`` is ``auto`` (measured), ``on`` or ``off``; with more
    than one candidate each runs :data:`PROBE_STEPS` steps on a copy of ``model`` with
    random windows of the job's shape (the model and its optimiser are untouched)."""
    import torch

    if graphs not in GRAPH_MODES:
        raise LeopardError(f"graphs: unknown value {graphs!r}; choose one of "
                           f"{', '.join(GRAPH_MODES)}")
    dev = ctx.device
    reason = None
    if graphs == "off":
        reason = "asked"
    elif dev.type != "cuda":
        reason = "CUDA graphs need CUDA"
    elif ctx.distributed:
        reason = "DDP (NCCL inside a graph is not attempted)"
    elif scaler_enabled:
        reason = "fp16's gradient scaler reads values back"
    elif not plain_bn:
        reason = "synchronised BatchNorm"
    modes = [False] if reason is not None else [True] if graphs == "on" else [False, True]
    candidates = [(lay, g) for lay in layouts for g in modes]
    if len(candidates) == 1:
        lay, g = candidates[0]
        return lay, g, "CUDA graph (asked)" if g else f"eager: {reason}", {}
    rates: dict[str, float] = {}
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.rand(batch, in_channels, window, generator=gen).to(dev)
    y = (torch.rand(batch, window, generator=gen) < 0.05).to(torch.int8).to(dev)
    failed = []
    for lay, graph in candidates:
        probe = copy.deepcopy(model).train()
        probe.set_training_layout(lay)  # type: ignore[operator]
        opt = make_adam(probe.parameters(), 1e-3, dev, graph)
        scaler = torch.amp.GradScaler("cuda", enabled=False)
        step = TrainStep(probe, probe, opt, scaler, ctx, amp, amp_dtype, graph)
        try:
            for _ in range(WARMUP_STEPS):
                step(x, y)
            _sync(dev)
            t = time.perf_counter()
            for _ in range(PROBE_STEPS):
                step(x, y)
            _sync(dev)
            elapsed = time.perf_counter() - t
            if graph and not step.graph:
                raise RuntimeError(step.fallback)
        except Exception as exc:  # a form that fails here is not chosen
            failed.append(f"{_name(lay, graph)} failed ({_first_line(exc)})")
            continue
        finally:
            del step, opt, probe  # (the graph's memory goes before the next candidate)
        rates[_name(lay, graph)] = PROBE_STEPS * batch / elapsed
    ok = [c for c in candidates if _name(*c) in rates]
    if not ok:
        raise LeopardError("no training step ran on the device: " + "; ".join(failed))
    best = max(ok, key=lambda c: rates[_name(*c)])
    shown = ", ".join(f"{k} {v:,.0f}" for k, v in rates.items())
    why = f"{_name(*best)}: the fastest measured (windows/s: {shown})"
    return best[0], best[1], "; ".join([why, *failed]), rates


def _name(layout: str, graph: bool) -> str:
    return f"{layout} {'CUDA graph' if graph else 'eager'}"
