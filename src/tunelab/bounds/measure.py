"""Measure a machine's bounds: the plan (quick or thorough) and the run that fills a profile.

:func:`make_plan` turns the command line's choices into a :class:`Plan`; :func:`measure`
runs it, one kind after another, and returns a :class:`~tunelab.bounds.profile.Profile`
keyed by the machine's fingerprint. A part that cannot run here (no torch, no ``mpirun``,
no mpi4py) becomes a note, never a failure of the rest.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunelab.bounds.profile import BOUND_KINDS, Bound, Profile, median_of
from tunelab.errors import TunelabError

if TYPE_CHECKING:
    from tunelab.noise import NoiseWatch

__all__ = ["Plan", "make_plan", "measure"]

MiB = 1 << 20


@dataclass(frozen=True)
class Plan:
    """What one ``tunelab bounds`` run measures, and how long it may take at each step."""

    quick: bool
    kinds: tuple[str, ...]
    device: str
    threads: tuple[int, ...]
    gemm_n: int
    gemm_repeats: int
    triad_elements: int
    stacks: tuple[str, ...]
    patterns: tuple[str, ...]
    sizes: tuple[int, ...]
    ranks: int | None
    link_repeats: int
    block_bytes: int
    hostfile: Path | None = None
    storage: tuple[Path, ...] = ()
    storage_bytes: int = 256 * MiB
    seconds_per_step: float = 6.0
    notes: tuple[str, ...] = field(default=())


def make_plan(*, quick: bool, kinds: Sequence[str] = (), device: str = "auto",
              threads: Sequence[int] = (), stacks: Sequence[str] = (),
              sizes: Sequence[int] = (), ranks: int | None = None,
              hostfile: Path | None = None, storage: Sequence[Path] = (),
              storage_bytes: int | None = None) -> Plan:
    """The plan for these choices (empty sequences take the defaults of ``quick`` or
    thorough); one-line errors for values that cannot be measured."""
    from tunelab.bounds.compute import cpu_threads, cuda_available, quick_gemm_n
    from tunelab.bounds.link import LINK_STACKS
    from tunelab.bounds.linkprobe import PATTERNS

    bad = [k for k in kinds if k not in BOUND_KINDS]
    if bad:
        raise TunelabError(f"unknown bound kind {bad[0]!r}; valid: {', '.join(BOUND_KINDS)}")
    if device not in ("auto", "cpu", "cuda"):
        raise TunelabError(f"unknown device {device!r}; valid: auto, cpu, cuda")
    has_cuda = cuda_available() if device != "cpu" else False
    if device == "cuda" and not has_cuda:
        raise TunelabError("--device cuda: torch sees no CUDA device here")
    chosen = "cuda" if has_cuda else "cpu"
    cores = cpu_threads()
    if any(t < 1 for t in threads):
        raise TunelabError("--threads must be whole numbers >= 1")
    thread_list = tuple(threads) or ((cores,) if quick else tuple(sorted({1, cores})))
    bad = [s for s in stacks if s not in LINK_STACKS]
    if bad:
        raise TunelabError(f"unknown link stack {bad[0]!r}; valid: {', '.join(LINK_STACKS)}")
    if any(s < 1 or s > 1 << 30 for s in sizes):
        raise TunelabError("--sizes: message sizes are bytes from 1 to 1 GiB")
    if ranks is not None and ranks < 2:
        raise TunelabError("--ranks: a link needs at least 2 ranks")
    if hostfile is not None and not hostfile.is_file():
        raise TunelabError(f"--hostfile {hostfile} does not exist")
    for d in storage:
        if not d.is_dir():
            raise TunelabError(f"--storage {d} is not a directory")
    wanted = tuple(kinds) or tuple(k for k in BOUND_KINDS if k != "storage" or storage)
    if "storage" in wanted and not storage:
        raise TunelabError("--only storage needs --storage DIR (the directory to read)")
    gpu = chosen == "cuda"
    return Plan(
        quick=quick, kinds=wanted, device=chosen, threads=thread_list,
        gemm_n=quick_gemm_n(chosen) if quick else (8192 if gpu else 4096),
        gemm_repeats=5 if quick else 10,
        triad_elements=(1 << 26 if gpu else 1 << 24) if quick else (1 << 28 if gpu else 1 << 26),
        stacks=tuple(stacks) or LINK_STACKS, patterns=PATTERNS,
        sizes=tuple(sizes) or ((MiB, 4 * MiB) if quick else (64 << 10, MiB, 4 * MiB, 16 * MiB)),
        ranks=ranks, link_repeats=3 if quick else 7,
        block_bytes=(128 if quick else 512) * MiB, hostfile=hostfile, storage=tuple(storage),
        storage_bytes=storage_bytes or ((256 if quick else 1024) * MiB),
        seconds_per_step=4.0 if quick else 20.0)


Progress = Callable[[str], None]


def _gemm(plan: Plan, say: Progress, notes: list[str]) -> list[Bound]:
    from tunelab.bounds.compute import gemm_rates, precisions_for

    out = []
    for threads in plan.threads if plan.device == "cpu" else (0,):
        wanted, why = precisions_for(plan.device, threads or None)
        notes.extend(why)
        fp32 = None
        for precision in wanted:
            say(f"gemm {precision} {plan.gemm_n}^3 on {plan.device}"
                + (f", {threads} thread{'s' * (threads != 1)}" if threads else ""))
            r = gemm_rates(precision, n=plan.gemm_n, device=plan.device, threads=threads or None,
                           repeats=plan.gemm_repeats, seconds=plan.seconds_per_step)
            value = median_of(r.samples)
            if precision == "fp32":
                fp32 = value
            elif precision == "bf16" and plan.device == "cpu" and fp32 and value < fp32:
                notes.append(f"bf16 left out ({threads} thread{'s' * (threads != 1)}): "
                             f"{value / 1e9:,.1f} GFLOP/s, "
                             f"slower than fp32's {fp32 / 1e9:,.1f}")
                continue
            variant: dict[str, Any] = {"precision": precision, "device": plan.device}
            if plan.device == "cpu":
                variant["threads"] = threads
            out.append(Bound("gemm", variant, value, r.samples, r.method))
    return out


def _memory(plan: Plan, say: Progress) -> list[Bound]:
    from tunelab.bounds.compute import triad_rates

    out = []
    for threads in plan.threads if plan.device == "cpu" else (0,):
        say(f"memory triad on {plan.device}"
            + (f", {threads} thread{'s' * (threads != 1)}" if threads else ""))
        r = triad_rates(elements=plan.triad_elements, device=plan.device,
                        threads=threads or None, repeats=20 if plan.quick else 40,
                        seconds=plan.seconds_per_step / 2)
        variant: dict[str, Any] = {"device": plan.device}
        if plan.device == "cpu":
            variant["threads"] = threads
        out.append(Bound("memory", variant, median_of(r.samples), r.samples, r.method))
    return out


def _link(plan: Plan, say: Progress, notes: list[str]) -> list[Bound]:
    from tunelab.bounds.link import link_rates

    out = []
    for stack in plan.stacks:
        if stack != "tcp" and shutil.which("mpirun") is None:
            notes.append(f"link {stack}: mpirun is not installed (apt-get install -y "
                         "openmpi-bin)")
            continue
        say(f"link {stack}: {', '.join(plan.patterns)} at "
            f"{', '.join(_size_text(s) for s in plan.sizes)}")
        try:
            run = link_rates(stack, patterns=plan.patterns, sizes=plan.sizes, ranks=plan.ranks,
                             repeats=plan.link_repeats, block_bytes=plan.block_bytes,
                             hostfile=plan.hostfile)
        except TunelabError as exc:
            notes.append(f"link {stack}: {exc}")
            continue
        where = f"{run.nodes} nodes" if run.nodes > 1 else "one machine"
        how = "mpirun -np" if stack != "tcp" else "sockets, ranks:"
        for r in run.results:
            variant = {"stack": stack, "pattern": r.pattern, "ranks": r.ranks,
                       "nodes": run.nodes, "message_bytes": r.message_bytes}
            out.append(Bound("link", variant, median_of(r.samples), r.samples,
                             f"link probe {r.pattern} over {how} {r.ranks} ({where}), "
                             f"{_size_text(r.message_bytes)} messages"))
    return out


def _storage(plan: Plan, say: Progress, notes: list[str]) -> list[Bound]:
    from tunelab.bounds.disk import read_rates

    out = []
    for directory in plan.storage:
        say(f"storage read of {directory} ({_size_text(plan.storage_bytes)}), cold and warm")
        try:
            r = read_rates(directory, nbytes=plan.storage_bytes, repeats=2 if plan.quick else 3)
        except TunelabError as exc:  # one directory lost, not the bounds measured before it
            notes.append(f"storage {directory}: not measured ({exc})")
            continue
        how = (f"{r.files} files, {_size_text(r.nbytes)}"
               + (f" (a {_size_text(r.scratch)} scratch file included)" if r.scratch else "")
               + ", 1 MiB reads")
        if r.resident is not None and r.resident > 0.1:
            notes.append(f"storage {r.directory}: {r.resident:.0%} of the pages stayed cached "
                         "after the drop (tmpfs or a file system that keeps them): the cold "
                         "rate is not a disk's")
        for cache, samples in (("cold", r.cold), ("warm", r.warm)):
            dropped = (f"; {r.resident:.0%} resident before the read"
                       if cache == "cold" and r.resident is not None else "")
            out.append(Bound("storage", {"directory": r.directory, "cache": cache},
                             median_of(samples), samples, how + dropped))
    return out


def _size_text(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:g} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


def measure(plan: Plan, say: Progress = lambda _: None,
            watch: NoiseWatch | None = None) -> Profile:
    """Run ``plan`` on this machine; the profile (not yet stored). ``watch`` (the noise
    watch of this process's cores by default) marks the bounds of a step during which
    other processes took enough of the cores to lower them, and says so in a note."""
    from dataclasses import replace

    from tunelab.noise import NoiseWatch
    from tunelab.sysinfo import fingerprint, machine_identity, snapshot

    watch = watch or NoiseWatch()

    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    snap = snapshot()
    notes: list[str] = list(plan.notes)
    bounds: list[Bound] = []
    steps: dict[str, Callable[[], list[Bound]]] = {
        "gemm": lambda: _gemm(plan, say, notes), "memory": lambda: _memory(plan, say),
        "link": lambda: _link(plan, say, notes), "storage": lambda: _storage(plan, say, notes)}
    for kind in plan.kinds:
        before = watch.start()
        try:
            found = steps[kind]()
        except (ImportError, RuntimeError) as exc:
            notes.append(f"{kind}: not measured ({exc})")
            continue
        sample = watch.stop(before)
        if sample.disturbed and found:
            evidence = sample.evidence or "other processes took the cores"
            found = [replace(b, disturbed=evidence) for b in found]
            notes.append(f"{kind}: measured while {evidence}: these bounds may be low, and "
                         f"fractions of them high; measure again when the machine is quiet "
                         f"(`tunelab bounds --only {kind}`)")
        bounds += found
    return Profile(
        fingerprint=fingerprint(snap), machine=machine_identity(snap),
        taken_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"), bounds=tuple(bounds),
        quick=plan.quick, loadavg=(round(load0, 2), round(os.getloadavg()[0], 2)),
        notes=tuple(notes), seconds=round(time.perf_counter() - t0, 1))
