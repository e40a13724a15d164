"""The captured training step's logic on a CPU: a stand-in capture that runs the step eagerly
exercises the warm-up, the restore of every state and the static buffers; the step mode is
chosen by capability; the learning rate reaches a captured optimiser."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

from tunelab.leopard import distributed as D
from tunelab.leopard.errors import LeopardError
from tunelab.leopard.model import LeopardUNet
from tunelab.leopard.trainstep import (
    Forward,
    Outputs,
    TrainStep,
    choose_step_mode,
    make_adam,
    restore_lr_kind,
    set_lr,
)

CPU = D.DistContext(rank=0, world=1, local_rank=0, device=torch.device("cpu"), backend=None)


def eager_capture(fn: Callable[[], Outputs]) -> tuple[Outputs, Callable[[], None]]:
    """What a CUDA graph does, eagerly: outputs are static tensors that each replay
    overwrites in place. (Unlike a real capture, recording runs ``fn`` once; the step's
    restore undoes that too.)"""
    out = fn()

    def replay() -> None:
        for o, new in zip(out, fn(), strict=True):
            o.copy_(new)

    return out, replay


def _model() -> LeopardUNet:
    torch.manual_seed(0)
    return LeopardUNet(base_filters=4, depth=2)


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.rand(3, 5, 64, generator=g),
             torch.randint(-1, 2, (3, 64), generator=g).to(torch.int8)) for _ in range(n)]


def _run(graph: bool, batches: list[tuple[torch.Tensor, torch.Tensor]]
         ) -> tuple[LeopardUNet, list[float]]:
    model = _model().train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-7)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    step = TrainStep(model, model, opt, scaler, CPU, False, torch.bfloat16, graph,
                     capture=eager_capture)
    losses = []
    for x, y in batches:
        lsum, cnt = step(x, y)
        losses.append(float(lsum / cnt))
    return model, losses


def test_a_captured_step_trains_exactly_as_the_eager_step() -> None:
    """The warm-up before a capture steps the model on the first batch; restoring every
    parameter, buffer (BatchNorm statistics, batch counters) and optimiser state makes the
    run identical to an eager one, step for step, from the fresh optimiser's first step."""
    batches = _batches(4)
    eager, want = _run(False, batches)
    graphed, got = _run(True, batches)
    assert got == want
    for (k, a), b in zip(eager.state_dict().items(), graphed.state_dict().values(),
                         strict=True):
        assert torch.equal(a, b), k


def test_a_failed_capture_leaves_an_eager_step_with_the_same_training() -> None:
    """An op that cannot be captured: the warm-up is undone and the run goes on eagerly,
    saying why."""
    def broken(fn: Callable[[], Outputs]) -> tuple[Outputs, Callable[[], None]]:
        raise RuntimeError("operation not permitted when stream is capturing")

    batches = _batches(3)
    _, want = _run(False, batches)
    model = _model().train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-7)
    step = TrainStep(model, model, opt, torch.amp.GradScaler("cuda", enabled=False), CPU,
                     False, torch.bfloat16, True, capture=broken)
    got = []
    for x, y in batches:
        lsum, cnt = step(x, y)
        got.append(float(lsum / cnt))
    assert got == want and not step.graph
    assert step.fallback is not None and "capture failed (RuntimeError" in step.fallback
    fwd = Forward(model.eval(), False, torch.bfloat16, True, capture=broken)
    x = batches[0][0]
    with torch.no_grad():
        assert torch.equal(fwd(x), model(x)) and not fwd.graph


def test_the_restore_keeps_a_resumed_optimiser_state() -> None:
    """A run resumed with optimiser state already there: the captured step continues from
    it, as the eager one does."""
    batches = _batches(3)
    models, losses = [], []
    for graph in (False, True):
        model = _model().train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-7)
        scaler = torch.amp.GradScaler("cuda", enabled=False)
        TrainStep(model, model, opt, scaler, CPU, False, torch.bfloat16, False)(*batches[0])
        step = TrainStep(model, model, opt, scaler, CPU, False, torch.bfloat16, graph,
                         capture=eager_capture)
        losses.append([float(step(x, y)[0]) for x, y in batches[1:]])
        models.append(model)
    assert losses[0] == losses[1]
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(a, b)


def test_captured_evaluation_reads_the_weights_in_place() -> None:
    model = _model().eval()
    fwd = Forward(model, False, torch.bfloat16, True, capture=eager_capture)
    x = torch.rand(2, 5, 64)
    with torch.no_grad():
        assert torch.equal(fwd(x), model(x))
        for p in model.parameters():
            p.mul_(1.5)  # what an optimiser step does between evaluations
        assert torch.equal(fwd(x), model(x))
        assert torch.equal(fwd(x + 1), model(x + 1))


def test_step_mode_is_chosen_by_capability() -> None:
    model = _model()
    common = {"batch": 2, "window": 64, "in_channels": 5, "ctx": CPU, "amp": False,
              "amp_dtype": torch.bfloat16, "scaler_enabled": False, "plain_bn": True}
    layout, graph, why, rates = choose_step_mode(model, ["2d"], "auto", **common)
    assert (layout, graph, rates) == ("2d", False, {}) and "need CUDA" in why
    assert "asked" in choose_step_mode(model, ["1d"], "off", **common)[2]
    two = D.DistContext(rank=0, world=2, local_rank=0, device=torch.device("cuda"),
                        backend="nccl")
    assert "DDP" in choose_step_mode(model, ["1d"], "auto", **{**common, "ctx": two})[2]
    with pytest.raises(LeopardError, match="graphs: unknown value 'maybe'"):
        choose_step_mode(model, ["1d"], "maybe", **common)
    # forms to measure: each runs (eager on a CPU), the fastest is taken
    layout, graph, why, rates = choose_step_mode(model, ["2d", "2d8"], "auto", **common)
    assert set(rates) == {"2d eager", "2d8 eager"} and not graph, why
    assert rates[f"{layout} eager"] == max(rates.values())


def test_learning_rate_reaches_the_optimiser_in_either_kind() -> None:
    model = _model()
    opt = make_adam(model.parameters(), 0.01, torch.device("cpu"), graph=False)
    assert opt.defaults["fused"] is not True  # fused Adam is a CUDA capability here
    set_lr(opt, 0.5)
    assert opt.param_groups[0]["lr"] == 0.5
    opt.param_groups[0]["lr"] = torch.tensor(0.25)  # a captured step's rate
    rate = opt.param_groups[0]["lr"]
    set_lr(opt, 0.125)
    assert opt.param_groups[0]["lr"] is rate and float(rate) == 0.125  # written in place
    state = copy.deepcopy(opt.state_dict())
    opt.load_state_dict(state)
    restore_lr_kind(opt, torch.device("cpu"), graph=False)
    assert opt.param_groups[0]["lr"] == 0.125 and isinstance(opt.param_groups[0]["lr"], float)
