"""Output: a human-readable table like the seed's, then ONE JSON line of figures of merit.

The JSON line is the last line of stdout and starts with ``{"benchmark": "merge"``; the
``merge`` workload parses it. A failed verification prints ``"verified": false`` and an
``error`` instead of numbers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from tunelab.bench.merge.config import MergeConfig
from tunelab.bench.merge.metrics import IterationStats, Summary

__all__ = ["failure_line", "fom_line", "format_bytes", "render_table"]

MiB = 1 << 20
GiB = 1 << 30


def format_bytes(n: float) -> str:
    """``1.50 MiB`` style."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _describe(cfg: MergeConfig, extra: str = "") -> str:
    transport = cfg.transport
    if transport == "mpi":
        transport += f" (pml {cfg.mpi_pml})"
    elif transport == "dask":
        transport += f" (protocol {cfg.protocol}, shuffle {cfg.dask_shuffle})"
    return f"{transport}{extra}"


def render_table(cfg: MergeConfig, stats: Sequence[IterationStats], summary: Summary,
                 verification: str, extra: str = "") -> str:
    """The seed-style report: settings, per-iteration lines, summary."""
    lines = [
        "Merge benchmark",
        "-" * 72,
        f"{'Transport':<24}| {_describe(cfg, extra)}",
        f"{'Backend':<24}| {cfg.backend}",
        f"{'Workers':<24}| {cfg.workers}",
        f"{'Chunk size':<24}| {cfg.chunk_size} rows",
        f"{'Frac-match':<24}| {cfg.frac_match}",
        f"{'Data processed':<24}| {format_bytes(summary.data_processed)} per worker and "
        f"iteration",
        f"{'Iterations':<24}| {summary.iterations} timed, {cfg.warmup} warm-up",
        f"{'Verification':<24}| {verification}",
        "-" * 72,
        f"{'iter':>4} {'wall':>9} {'throughput':>13} {'bw hmean':>13} {'bw min':>12} "
        f"{'bw max':>12} {'sent':>11}",
    ]
    for s in stats:
        lines.append(
            f"{s.iteration:>4} {s.wall_s * 1e3:>7.2f}ms {format_bytes(s.throughput) + '/s':>13} "
            f"{format_bytes(s.bandwidth) + '/s':>13} {format_bytes(s.bandwidth_min) + '/s':>12} "
            f"{format_bytes(s.bandwidth_max) + '/s':>12} {format_bytes(s.bytes_sent):>11}")
    lines += [
        "-" * 72,
        f"{'Throughput':<24}| {format_bytes(summary.throughput)}/s "
        f"+/- {format_bytes(summary.throughput_std)}/s",
        f"{'Bandwidth (hmean)':<24}| {format_bytes(summary.bandwidth)}/s "
        f"+/- {format_bytes(summary.bandwidth_std)}/s",
        f"{'Bandwidth min/med/max':<24}| {format_bytes(summary.bandwidth_min)}/s, "
        f"{format_bytes(summary.bandwidth_median)}/s, {format_bytes(summary.bandwidth_max)}/s",
        f"{'Wall clock':<24}| {summary.wall_s * 1e3:.2f} ms +/- {summary.wall_s_std * 1e3:.2f} ms",
    ]
    return "\n".join(lines)


def fom_line(cfg: MergeConfig, summary: Summary, **extra: Any) -> str:
    """The final JSON line: figures of merit in bytes, bytes/s and seconds."""
    record: dict[str, Any] = {
        "benchmark": "merge",
        "transport": cfg.transport,
        "backend": cfg.backend,
        "mpi_pml": cfg.mpi_pml if cfg.transport == "mpi" else None,
        "protocol": cfg.protocol if cfg.transport == "dask" else None,
        "verified": True,
        "workers": cfg.workers,
        "chunk_size": cfg.chunk_size,
        "iterations": summary.iterations,
        "data_processed": summary.data_processed,
        "throughput": summary.throughput,
        "throughput_std": summary.throughput_std,
        "bandwidth": summary.bandwidth,
        "bandwidth_std": summary.bandwidth_std,
        "bandwidth_min": summary.bandwidth_min,
        "bandwidth_median": summary.bandwidth_median,
        "bandwidth_max": summary.bandwidth_max,
        "bandwidth_lr": summary.bandwidth_lr,
        "wall_iter_s": summary.wall_s,
        "wall_iter_s_std": summary.wall_s_std,
        "exchange_s": summary.exchange_s,
        "bytes_sent": summary.bytes_sent,
        "merged_rows": summary.merged_rows,
    }
    if math.isfinite(summary.bandwidth_transfer):  # transports that time the count swap
        record.update(bandwidth_transfer=summary.bandwidth_transfer, sync_s=summary.sync_s)
    record.update(extra)
    return json.dumps(record)


def failure_line(cfg: MergeConfig, error: str) -> str:
    """The JSON line of a run whose result was wrong: no figures of merit."""
    return json.dumps({"benchmark": "merge", "transport": cfg.transport, "verified": False,
                       "error": error})
