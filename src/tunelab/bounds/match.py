"""Which measured bound a run's work is judged against, and the fraction of it reached.

:func:`find_bound` picks, among a profile's bounds of the work's kind, the one whose variant
fits: the same precision (gemm), stack and pattern (link), directory or file system
(storage) are required; thread counts, rank counts and message sizes are matched exactly
when measured, else to the nearest measured one, and the :class:`Match` says so — but a
message size more than :data:`SIZE_RATIO` times from every measured one has no bound.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunelab.bounds.profile import Bound, Profile
from tunelab.workload import Work

__all__ = ["SIZE_RATIO", "Match", "bound_label", "find_bound", "headroom_word", "value_text"]


@dataclass(frozen=True)
class Match:
    """The bound a work item is judged against; ``fraction`` = rate / bound; ``approx``
    names what differs from the work's own variant (nearest size, other thread count)."""

    bound: Bound
    fraction: float
    approx: tuple[str, ...] = ()


def _nearest(candidates: list[Bound], key: str, want: Any, log: bool = False,
             ) -> tuple[list[Bound], str | None]:
    """The candidates whose ``key`` is nearest ``want`` (all of them when ``want`` is None),
    and a note when that is not ``want`` itself."""
    have = [b for b in candidates if key in b.variant]
    if want is None or not have:
        return candidates, None
    try:
        target = float(want)
    except (TypeError, ValueError):
        return candidates, None

    def distance(b: Bound) -> float:
        v = float(b.variant[key])
        return abs(math.log(v / target)) if log and v > 0 and target > 0 else abs(v - target)

    best = min(distance(b) for b in have)
    chosen = [b for b in have if distance(b) == best]
    got = chosen[0].variant[key]
    note = (None if float(got) == target
            else f"{key} {value_text(key, got)} (measured) for {value_text(key, want)}")
    return chosen, note


SIZE_RATIO = 4.0
"""A link bound stands for messages at most this factor smaller or larger than its own:
further off, latency (small) or another protocol decides the rate, not that bound."""


def _too_far(bound: Bound, want: Any) -> bool:
    """Whether ``bound``'s message size is more than :data:`SIZE_RATIO` from ``want``."""
    if want is None or "message_bytes" not in bound.variant:
        return False
    try:
        got, target = float(bound.variant["message_bytes"]), float(want)
    except (TypeError, ValueError):
        return False
    return got > 0 and target > 0 and max(got / target, target / got) > SIZE_RATIO


def value_text(key: str, value: Any) -> str:
    """A variant value in words: message sizes in KiB or MiB, the rest as they are."""
    if key == "message_bytes":
        v = float(value)
        return f"{v / 2**20:.2f} MiB" if v >= 2**20 else f"{v / 1024:.0f} KiB"
    return str(value)


def _same_storage(bound_dir: str, want: str) -> int:
    """How well a measured directory stands for ``want``: 3 the same, 2 an ancestor, 1 the
    same file system, 0 not at all."""
    a, b = Path(bound_dir), Path(want).expanduser()
    with_resolved = b.resolve() if b.exists() else b
    if a == with_resolved:
        return 3
    if a in with_resolved.parents:
        return 2
    try:
        return 1 if os.stat(a).st_dev == os.stat(with_resolved).st_dev else 0
    except OSError:
        return 0


def find_bound(profile: Profile, work: Work) -> Match | None:
    """The bound of ``profile`` that ``work`` is judged against, or None."""
    if not (math.isfinite(work.rate) and work.rate >= 0):
        return None
    v: Mapping[str, Any] = work.variant
    cands = [b for b in profile.bounds if b.kind == work.kind]
    notes: list[str] = []
    if work.kind == "gemm":
        cands = [b for b in cands if b.variant.get("precision") == v.get("precision", "fp32")]
    if work.kind in ("gemm", "memory") and v.get("device"):
        cands = [b for b in cands if b.variant.get("device") == v["device"]]
    if work.kind == "link":
        cands = [b for b in cands if b.variant.get("stack") == v.get("stack")
                 and b.variant.get("pattern") == v.get("pattern", "alltoall")]
    if work.kind == "storage":
        cands = [b for b in cands if b.variant.get("cache") == v.get("cache", "cold")]
        if v.get("directory"):
            score = {id(b): _same_storage(str(b.variant.get("directory")), str(v["directory"]))
                     for b in cands}
            top = max(score.values(), default=0)
            cands = [b for b in cands if score[id(b)] == top and top > 0]
            if cands and top < 3:
                notes.append(f"directory {cands[0].variant['directory']} (measured) for "
                             f"{v['directory']}")
    for key, log in (("threads", False), ("nodes", False), ("ranks", False),
                     ("message_bytes", True)):
        cands, note = _nearest(cands, key, v.get(key), log)
        if note:
            notes.append(note)
    if not cands or _too_far(cands[0], v.get("message_bytes")):
        return None
    bound = cands[-1]  # the latest measured of equals
    return Match(bound, work.rate / bound.value, tuple(notes))


def bound_label(bound: Bound) -> str:
    """The bound in words: ``link mpi-ucx all-to-all, 2 ranks, 3.81 MiB``."""
    v = bound.variant
    if bound.kind == "gemm":
        where = f", {_threads(v['threads'])}" if "threads" in v else f" on {v.get('device')}"
        return f"{v.get('precision')} GEMM{where}"
    if bound.kind == "memory":
        where = f", {_threads(v['threads'])}" if "threads" in v else f" on {v.get('device')}"
        return f"memory triad{where}"
    if bound.kind == "link":
        pattern = {"alltoall": "all-to-all", "bothways": "both ways",
                   "oneway": "one way"}.get(str(v.get("pattern")), str(v.get("pattern")))
        nodes = f", {v['nodes']} nodes" if int(v.get("nodes", 1) or 1) > 1 else ""
        return (f"link {v.get('stack')} {pattern}, {v.get('ranks')} ranks{nodes}, "
                f"{value_text('message_bytes', v.get('message_bytes', 0))}")
    return f"storage {v.get('cache')} read of {v.get('directory')}"


def _threads(n: Any) -> str:
    return f"{n} thread{'' if str(n) == '1' else 's'}"


ABOVE = 1.1
"""A fraction of bound above this is beyond what measurement noise explains: the bound does
not hold for that work (:func:`headroom_word` says why it may not)."""


def headroom_word(fraction: float, kind: str = "") -> str:
    """What a fraction of bound leaves: ``little room left`` (0.8 to 1.1), ``some room``
    (>= 0.5), ``room to gain`` below; above 1.1 the bound itself is in doubt, and for
    ``memory`` work the likelier reason is data that fit in a cache."""
    if fraction > ABOVE:
        cache = ("the data may fit in a cache (the bound is main memory's: judge only work "
                 "on arrays far larger than the last-level cache against it), or "
                 if kind == "memory" else "")
        return (f"above the measured limit: {cache}the bound was measured at a busier moment "
                "or in another way; measure it again with `tunelab bounds --refresh`")
    if fraction >= 0.8:
        return "little room left"
    if fraction >= 0.5:
        return "some room left"
    return "room to gain"
