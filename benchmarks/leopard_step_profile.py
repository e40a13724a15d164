"""Where one Leopard training step's time goes: the kernels (on a GPU) or operators (on a
CPU) of the step ``tunelab leopard train`` runs, eager, profiled over a few steps after a
warm-up, the most expensive first, with their share of the step; then the same for a
validation batch (the forward pass and the metric sums).

    python3 benchmarks/leopard_step_profile.py --device cuda [--batch 256] [--layout 2d]

``--layout 2d8`` profiles the 2-D form on channels padded with zeros to multiples of 8, as
cuDNN's tensor-core kernels want them (the network's widths are 5, 15, 22, 33, 49, 73, 109 …);
a training run's probe measures it beside the others and takes the fastest.

``benchmarks/leopard_gpu.py`` prints both as its part 3b, so that a GPU session sees what
bounds the training rate (issue 26: ~2 % of the GPU's bf16 GEMM rate) without a session of
its own.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

__all__ = ["profile_step"]


def profile_step(device: str, batch: int = 256, window: int = 10_240, layout: str = "2d",
                 steps: int = 5, top: int = 12, evaluation: bool = False) -> dict[str, Any]:
    """Profile ``steps`` eager training steps (bf16 autocast and fused Adam on CUDA, fp32 on a
    CPU) of the default Leopard U-Net in ``layout`` (``1d``, ``2d``, ``2d8``: see
    :meth:`~tunelab.leopard.model.LeopardUNet.set_training_layout`) on random windows — or,
    with ``evaluation``, validation's batches
    (the forward pass and the metric sums); the step's wall and busy milliseconds and the
    ``top`` kernels or operators by their own time."""
    from torch.profiler import ProfilerActivity, profile

    from tunelab.leopard import distributed as D
    from tunelab.leopard.metrics import MetricState
    from tunelab.leopard.model import LeopardUNet
    from tunelab.leopard.trainstep import (
        Forward,
        TrainStep,
        make_adam,
        use_cuda_training_kernels,
    )

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    if cuda:  # the kernels training picks (cuDNN's timed choice), not cuDNN's first guess
        use_cuda_training_kernels()
    torch.manual_seed(0)
    model = LeopardUNet().to(dev)
    model.set_training_layout(layout)
    ctx = D.DistContext(rank=0, world=1, local_rank=0, device=dev, backend=None)
    opt = make_adam(model.parameters(), 0.01, dev, graph=False)
    step = TrainStep(model, model, opt, torch.amp.GradScaler("cuda", enabled=False), ctx,
                     amp=cuda, amp_dtype=torch.bfloat16, graph=False)
    x = torch.rand(batch, model.arch.in_channels, window, device=dev)
    y = torch.randint(-1, 2, (batch, window), device=dev).to(torch.int8)

    if evaluation:  # the forward pass and the metric sums of validation, in eval mode
        model.eval()
        forward = Forward(model, cuda, torch.bfloat16, graph=False)
        state = MetricState(dev)

        def run() -> None:
            with torch.no_grad():
                state.update(forward(x), y)
    else:
        def run() -> None:
            step(x, y)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    for _ in range(3):
        run()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            run()
        sync()
        wall = (time.perf_counter() - t) / steps
    events = [e for e in prof.key_averages()
              if (e.self_device_time_total if cuda else e.self_cpu_time_total) > 0]
    own = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    busy = sum(own(e) for e in events) / steps / 1e3  # ms a step
    rows = [{"name": e.key, "calls": e.count / steps, "ms": own(e) / steps / 1e3}
            for e in sorted(events, key=own, reverse=True)[:top]]
    return {"device": torch.cuda.get_device_name(dev) if cuda else "cpu", "batch": batch,
            "window": window, "layout": layout, "evaluation": evaluation,
            "wall_ms": wall * 1e3,
            "busy_ms": busy, "windows_per_s": batch / wall, "top": rows}


def describe(p: dict[str, Any]) -> list[str]:
    """The profile as lines of text."""
    what = "kernels" if p["device"] != "cpu" else "operators"
    kind = "validation batch (forward, metrics)" if p.get("evaluation") else "training step"
    out = [f"  {kind}: {p['device']}, batch {p['batch']}, window {p['window']:,}, layout "
           f"{p['layout']}, eager: {p['wall_ms']:.1f} ms a batch "
           f"({p['windows_per_s']:,.0f} windows/s), {what} busy {p['busy_ms']:.1f} ms of it"]
    for r in p["top"]:
        share = r["ms"] / p["busy_ms"] if p["busy_ms"] else 0.0
        out.append(f"    {r['ms']:7.2f} ms {share:6.1%} {r['calls']:6.0f}x  {r['name'][:90]}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--window", type=int, default=10_240)
    ap.add_argument("--layout", choices=["1d", "2d", "2d8"], default="2d")
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    print("\n".join(describe(profile_step(a.device, a.batch, a.window, a.layout, a.steps))))
    print("\n".join(describe(profile_step(a.device, a.batch, a.window, a.layout, a.steps,
                                           top=8, evaluation=True))))


if __name__ == "__main__":
    main()
