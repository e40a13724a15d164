"""Data-parallel plumbing for Leopard training with ``torch.distributed``.

Launch with ``torchrun`` (``python -m torch.distributed.run``): it sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous; :func:`init` then joins the group with
gloo on CPU and NCCL on CUDA. Without those variables everything runs as one process.

Rules that keep a run with W workers equal to a single process with the same global batch:

* every worker draws the same *global* plan of windows from the same seeded generator and
  keeps its own slice of each global batch (``plan[rank::W]``): no window is read twice;
* the loss of a step is the sum over the worker's labelled bases divided by the number of
  labelled bases of the whole global batch (one scalar ``all_reduce``), times W, so that
  DDP's gradient averaging yields exactly the gradient of the global mean;
* metrics are sums reduced with one ``all_reduce``; only rank 0 logs and writes files.

Learning-rate scaling: ``none`` keeps the base rate, ``linear`` multiplies it by W, ``sqrt``
by sqrt(W); with ``warmup_epochs > 0`` the rate ramps linearly from the base rate to the
scaled one over those epochs (Goyal et al., 2017). Plain linear scaling without warm-up is
what cost the seed team accuracy on several GPUs.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from tunelab.leopard.errors import LeopardError

if TYPE_CHECKING:
    import torch

__all__ = ["DistContext", "LRRule", "all_reduce_sum", "init", "lr_at", "scaled_lr", "shard"]

LRRule = Literal["none", "linear", "sqrt"]


@dataclass(frozen=True)
class DistContext:
    """Who this process is in the job, and its device."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    backend: str | None

    @property
    def is_main(self) -> bool:
        """True on rank 0, the only rank that logs and writes files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.world > 1


def init(device: str = "auto") -> DistContext:
    """Join the process group started by torchrun (or none) and pick the device."""
    import torch
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if device == "cuda" and not torch.cuda.is_available():
        raise LeopardError("--device cuda: no CUDA device is available")
    if use_cuda:
        torch.cuda.set_device(local % torch.cuda.device_count())
        dev = torch.device("cuda", local % torch.cuda.device_count())
    else:
        dev = torch.device("cpu")
    backend = None
    if world > 1:
        backend = "nccl" if use_cuda else "gloo"
        if not dist.is_initialized():
            dist.init_process_group(backend=backend)
    return DistContext(rank=rank, world=world, local_rank=local, device=dev, backend=backend)


def finish(ctx: DistContext) -> None:
    """Leave the process group."""
    import torch.distributed as dist

    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Sum ``t`` over all workers, in place (a no-op for one process)."""
    import torch.distributed as dist

    if ctx.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_max(value: float, ctx: DistContext) -> float:
    """Maximum of a float over workers."""
    import torch
    import torch.distributed as dist

    if not ctx.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def barrier(ctx: DistContext) -> None:
    """Wait for every worker."""
    import torch.distributed as dist

    if ctx.distributed:
        dist.barrier()


def shard(ids: np.ndarray, ctx: DistContext) -> np.ndarray:
    """This worker's share of ``ids``: every W-th element from its rank (disjoint, complete)."""
    return ids[ctx.rank::ctx.world]


def scaled_lr(base: float, world: int, rule: str) -> float:
    """The learning rate after scaling by the number of workers."""
    if rule == "none":
        return base
    if rule == "linear":
        return base * world
    if rule == "sqrt":
        return base * math.sqrt(world)
    raise LeopardError(f"unknown learning-rate scaling {rule!r}; valid: none, linear, sqrt")


def lr_at(step: int, steps_per_epoch: int, warmup_epochs: float, base: float,
          target: float) -> float:
    """Rate at global ``step``: linear ramp base -> target over the warm-up, then target."""
    warm = warmup_epochs * steps_per_epoch
    if warm <= 0 or step >= warm:
        return target
    return base + (target - base) * (step / warm)


def _global_batch_norm_cls() -> type:
    """A BatchNorm1d whose training statistics span all workers (works with gloo on CPU,
    where ``torch.nn.SyncBatchNorm`` refuses to run)."""
    import torch
    import torch.distributed as dist
    from torch import nn

    class _AllReduceSum(torch.autograd.Function):
        """Sum over workers; the gradient of a sum is the sum of the gradients."""

        @staticmethod
        def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
            y = x.clone()
            dist.all_reduce(y, op=dist.ReduceOp.SUM)
            return y

        @staticmethod
        def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:
            g = g.clone()
            dist.all_reduce(g, op=dist.ReduceOp.SUM)
            return g

    class GlobalBatchNorm1d(nn.BatchNorm1d):
        """Batch statistics summed over workers with an autograd-aware ``all_reduce``."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if not self.training or not dist.is_initialized() or dist.get_world_size() == 1:
                return super().forward(x)
            c = x.shape[1]
            xd = x.double()
            local = torch.cat([xd.sum(dim=(0, 2)), (xd * xd).sum(dim=(0, 2)),
                               xd.new_tensor([x.shape[0] * x.shape[2]])])
            total = _AllReduceSum.apply(local)
            n = total[-1]
            mean = total[:c] / n
            var = (total[c:2 * c] / n - mean * mean).clamp_min(0.0)
            with torch.no_grad():
                m = self.momentum if self.momentum is not None else 0.1
                assert self.running_mean is not None and self.running_var is not None
                self.running_mean.mul_(1 - m).add_(m * mean.to(self.running_mean.dtype))
                unbiased = var * n / (n - 1).clamp_min(1.0)
                self.running_var.mul_(1 - m).add_(m * unbiased.to(self.running_var.dtype))
                if self.num_batches_tracked is not None:
                    self.num_batches_tracked.add_(1)
            inv = torch.rsqrt(var + self.eps).to(x.dtype)
            y = (x - mean.to(x.dtype)[None, :, None]) * inv[None, :, None]
            if self.affine:
                y = y * self.weight[None, :, None] + self.bias[None, :, None]
            return y

    return GlobalBatchNorm1d


def convert_sync_batchnorm(model: torch.nn.Module, ctx: DistContext) -> torch.nn.Module:
    """Synchronise BatchNorm statistics across workers: ``torch.nn.SyncBatchNorm`` on CUDA,
    :class:`GlobalBatchNorm1d` on CPU (gloo). A no-op for one process."""
    import torch
    from torch import nn

    if not ctx.distributed:
        return model
    if ctx.device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    cls = _global_batch_norm_cls()

    def swap(mod: nn.Module) -> None:
        for name, child in mod.named_children():
            if isinstance(child, nn.BatchNorm1d) and not isinstance(child, cls):
                new = cls(child.num_features, eps=child.eps, momentum=child.momentum,
                          affine=child.affine, track_running_stats=child.track_running_stats)
                with torch.no_grad():
                    new.load_state_dict(child.state_dict())
                setattr(mod, name, new)
            else:
                swap(child)

    swap(model)
    return model
