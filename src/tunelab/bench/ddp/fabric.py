"""The all-reduce of an emulated accelerator, at the speed of the fabric it would cross.

``--allreduce emulate`` (the default under emulated compute) does not move gradient bytes
through this host's CPU: each step waits the time a ring all-reduce of the model's gradient
buckets takes on the accelerator's fabric (``fabrics:`` in ``profiles.yaml``: NVLink inside a
node, InfiniBand between nodes), overlapped with the backward part of the emulated step as
DDP's buckets overlap it, so only the part that outlasts the backward pass is on the step's
critical path. One worker does no all-reduce at all.

The model (pure functions, :func:`plan_allreduce`):

* a ring all-reduce of ``b`` bytes over N workers on a link of bandwidth B and per-step
  latency L takes ``2(N-1)/N * b / B + 2(N-1) * L`` (:func:`ring_allreduce_s`);
* the emulated step of C seconds is a forward pass, then a backward pass of
  :data:`BACKWARD_SHARE` x C (backward costs about twice the forward); DDP's buckets
  (reverse parameter order, :func:`tunelab.bench.ddp.comm.bucket_sizes`) become ready in
  proportion to the bytes of gradient computed, bucket ``i`` when the backward pass has
  produced the bytes of buckets ``0..i``;
* buckets are reduced one after the other on the fabric, each as soon as it is ready and
  the previous one is done; the step ends when the last bucket is reduced (``exposed`` =
  that end minus C, never negative).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunelab.bench.ddp.profiles import read_section, shipped_table, user_profile_path
from tunelab.errors import WorkloadError

__all__ = ["ALLREDUCE_MODES", "BACKWARD_SHARE", "DEFAULT_FABRIC", "AllreducePlan", "Fabric",
           "Link", "find_fabric", "load_fabrics", "plan_allreduce", "ring_allreduce_s"]

#: ``--allreduce`` values: ``auto`` = emulate under emulated compute, else real
ALLREDUCE_MODES = ("auto", "emulate", "real", "off")
#: share of an emulated step that is the backward pass (backward ~ 2 x forward)
BACKWARD_SHARE = 2.0 / 3.0
#: the fabric of ``--compute emulate:SECONDS`` (no profile names an accelerator)
DEFAULT_FABRIC = "h100"


@dataclass(frozen=True)
class Link:
    """One kind of link: its name, bandwidth (bytes/s, per direction) and latency (s/step)."""

    name: str
    bandwidth: float
    latency: float


@dataclass(frozen=True)
class Fabric:
    """An accelerator's links: ``node`` (inside one node) and ``network`` (between nodes)."""

    accelerator: str
    node: Link
    network: Link
    kind: str
    source: str

    def link(self, nodes: int) -> Link:
        """The link a ring over ``nodes`` nodes is limited by."""
        return self.network if nodes > 1 else self.node


def _link(raw: Any, where: str) -> Link:
    if not isinstance(raw, dict):
        raise WorkloadError(f"{where}: a link must be a mapping with name, GBps, latency_us")
    try:
        link = Link(str(raw["name"]), float(raw["GBps"]) * 1e9, float(raw["latency_us"]) * 1e-6)
    except (KeyError, TypeError, ValueError) as exc:
        raise WorkloadError(f"{where}: bad link {raw} ({exc})") from None
    if not (math.isfinite(link.bandwidth) and link.bandwidth > 0
            and math.isfinite(link.latency) and link.latency >= 0):
        raise WorkloadError(f"{where}: link {link.name}: GBps must be > 0 and latency_us >= 0")
    return link


def _fabric(raw: Any, where: str) -> Fabric:
    if not isinstance(raw, dict) or "accelerator" not in raw:
        raise WorkloadError(f"{where}: a fabric must be a mapping with accelerator, node, "
                            "network, kind, source")
    name = str(raw["accelerator"]).lower()
    return Fabric(name, _link(raw.get("node"), f"{where}: fabric {name} node"),
                  _link(raw.get("network"), f"{where}: fabric {name} network"),
                  str(raw.get("kind", "derived")), str(raw.get("source", "")))


def load_fabrics(user: Path | None = None) -> dict[str, Fabric]:
    """The shipped fabrics, then the user's (same accelerator: the user's entry wins)."""
    out: dict[str, Fabric] = {}
    for path in (shipped_table(), user or user_profile_path()):
        for raw in read_section(path, "fabrics"):
            f = _fabric(raw, str(path))
            out[f.accelerator] = f
    return out


def find_fabric(name: str, fabrics: dict[str, Fabric] | None = None) -> Fabric:
    """The fabric of accelerator ``name``; an unknown name lists the known ones."""
    table = fabrics if fabrics is not None else load_fabrics()
    key = name.strip().lower()
    if key not in table:
        raise WorkloadError(f"--fabric: unknown value {name!r}; choose one of "
                            f"{', '.join(['auto', *sorted(table)])} (fabrics in the accelerator "
                            "profiles)")
    return table[key]


def ring_allreduce_s(nbytes: float, workers: int, link: Link) -> float:
    """Seconds a ring all-reduce of ``nbytes`` over ``workers`` takes on ``link``:
    2(N-1)/N * bytes / bandwidth + 2(N-1) * latency (0 for one worker)."""
    if workers <= 1:
        return 0.0
    n = workers
    return 2.0 * (n - 1) / n * nbytes / link.bandwidth + 2.0 * (n - 1) * link.latency


@dataclass(frozen=True)
class AllreducePlan:
    """One emulated step's all-reduce, seconds from the step's start: ``first`` bucket
    launched, the last one ``done``; ``fabric_s`` the fabric's busy time (the ring formula
    summed over the buckets); ``exposed`` = done - compute, at least 0."""

    first: float
    done: float
    fabric_s: float
    exposed: float
    bytes: int
    buckets: int

    @property
    def window(self) -> float:
        """First bucket launched to last bucket reduced."""
        return self.done - self.first


def plan_allreduce(bucket_bytes: Sequence[int], workers: int, link: Link, compute_s: float,
                   backward_share: float = BACKWARD_SHARE) -> AllreducePlan:
    """The all-reduce of buckets of ``bucket_bytes`` (DDP's order) during an emulated step of
    ``compute_s`` seconds whose last ``backward_share`` is the backward pass."""
    total = sum(bucket_bytes)
    if workers <= 1 or not total:
        return AllreducePlan(compute_s, compute_s, 0.0, 0.0, 0, 0)
    backward_start = compute_s * (1.0 - backward_share)
    backward = compute_s * backward_share
    free = 0.0  # when the fabric is free
    first = math.inf
    done_bytes = 0
    busy = 0.0
    for b in bucket_bytes:
        done_bytes += b
        ready = backward_start + backward * done_bytes / total
        start = max(ready, free)
        first = min(first, start)
        t = ring_allreduce_s(b, workers, link)
        busy += t
        free = start + t
    return AllreducePlan(first, free, busy, max(0.0, free - compute_s), total,
                         len(bucket_bytes))
