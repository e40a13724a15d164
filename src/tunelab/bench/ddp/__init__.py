"""Data-parallel training benchmark (the seed's HPE ResNet-50 scale-up vs scale-out study).

``python -m tunelab.bench.ddp`` (or ``tunelab bench ddp``) trains ResNet-18/50 (torchvision)
or the Leopard U-Net with PyTorch DDP on ``nodes x workers_per_node`` workers and prints the
throughput, the step time split into compute and all-reduce, the gradient bytes per step and
the achieved all-reduce bandwidth, last as one JSON line. ``--compute emulate:SECONDS``
replaces each step's computation by a wait (an emulated accelerator) while the gradient
buffers of the model's size still cross the real network.

Modules: :mod:`.config` (options and bounds), :mod:`.models` (networks, torchvision import),
:mod:`.data` (the data seam), :mod:`.comm` (bucketing and the timing communication hook),
:mod:`.metrics` (pure FOM formulas), :mod:`.worker` (one rank), :mod:`.placement` (where
nodes run), :mod:`.launch` (torchrun per node, failure reports), :mod:`.report` (table, JSON).
"""

from __future__ import annotations

from tunelab.bench.ddp.config import MODELS, DDPConfig, parse_compute
from tunelab.bench.ddp.metrics import RankRecord, StepRecord, Summary, ring_factor, summarize

__all__ = [
    "MODELS",
    "DDPConfig",
    "RankRecord",
    "StepRecord",
    "Summary",
    "parse_compute",
    "ring_factor",
    "summarize",
]
