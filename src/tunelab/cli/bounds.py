"""``tunelab bounds``: measure, keep and show this machine's limits."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from tunelab.cli.common import FormatOpt, OutputFormat, emit
from tunelab.errors import TunelabError
from tunelab.report.output import message

__all__ = ["bounds", "parse_bytes", "parse_list"]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gib": 1 << 30, "kb": 1000, "mb": 10**6, "gb": 10**9}


def parse_bytes(text: str, what: str) -> int:
    """``4194304``, ``4M``, ``4MiB``, ``64K``, ``1GB`` -> bytes (one-line error otherwise)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise TunelabError(f"{what}: {text!r} is not a size (e.g. 65536, 64K, 4M, 1GiB)")
    return int(float(m.group(1)) * _UNITS[unit])


def parse_list(text: str | None) -> list[str]:
    """``a,b`` -> ``["a", "b"]`` (None -> [])."""
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def bounds(
    quick: Annotated[bool, typer.Option("--quick", help="Small sizes, few repeats "
                                        "(under a minute on 2 cores).")] = False,
    refresh: Annotated[bool, typer.Option("--refresh", help="Measure again even when this "
                                          "machine's bounds are stored.")] = False,
    only: Annotated[str | None, typer.Option(help="Measure only these kinds: gemm, memory, "
                                             "link, storage (comma-separated).")] = None,
    threads: Annotated[str | None, typer.Option(help="CPU threads for GEMM and the triad, "
                                                "e.g. 1,8 (default: the cores; thorough "
                                                "adds 1).")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    stacks: Annotated[str | None, typer.Option(help="Link stacks: mpi-ob1, mpi-ucx, tcp "
                                               "(default all).")] = None,
    sizes: Annotated[str | None, typer.Option(help="Link message sizes, e.g. 64K,4M "
                                              "(default 1M,4M quick; 64K,1M,4M,16M).")] = None,
    ranks: Annotated[int | None, typer.Option(help="Ranks of the link probe (default 2, or "
                                              "one per node of an allocation).")] = None,
    hostfile: Annotated[Path | None, typer.Option(help="Hosts for the link probe (mpirun "
                                                  "--hostfile): the link between nodes.")]
    = None,
    storage: Annotated[list[Path] | None, typer.Option(help="A directory whose read rate to "
                                                       "measure, cold and warm (repeatable).")]
    = None,
    storage_bytes: Annotated[str | None, typer.Option(help="Bytes to read per directory "
                                                      "(default 256M quick, 1G).")] = None,
    fmt: FormatOpt = OutputFormat.text,
) -> None:
    """Measure this machine's limits (GEMM per precision, memory triad, links between ranks,
    storage reads), keep them, and show them; studies judge their points against them."""
    from tunelab.bounds.measure import make_plan, measure
    from tunelab.bounds.profile import load_profile, profile_path, save_profile
    from tunelab.report.bounds import bounds_view
    from tunelab.sysinfo import fingerprint, snapshot

    size_list = [parse_bytes(s, "--sizes") for s in parse_list(sizes)]
    thread_list = []
    for t in parse_list(threads):
        if not t.isdigit():
            raise TunelabError(f"--threads: {t!r} is not a whole number")
        thread_list.append(int(t))
    asked = bool(quick or only or threads or stacks or sizes or ranks or hostfile or storage
                 or storage_bytes or device != "auto")
    plan = make_plan(quick=quick, kinds=parse_list(only), device=device, threads=thread_list,
                     stacks=parse_list(stacks), sizes=size_list, ranks=ranks,
                     hostfile=hostfile, storage=storage or (),
                     storage_bytes=parse_bytes(storage_bytes, "--storage-bytes")
                     if storage_bytes else None)
    machine = fingerprint(snapshot())
    stored = load_profile(machine)
    if stored is not None and not refresh and not asked:
        emit(bounds_view(stored, path=str(profile_path(machine)), measured_now=False), fmt)
        return
    message(f"tunelab bounds: measuring ({'quick' if plan.quick else 'thorough'}): "
            f"{', '.join(plan.kinds)}")
    profile = measure(plan, say=lambda text: message(f"  {text} …"))
    if stored is not None:
        profile = stored.merged(profile)
    path = save_profile(profile)
    message(f"tunelab bounds: {len(profile.bounds)} bounds kept in {path}")
    emit(bounds_view(profile, path=str(path)), fmt)
