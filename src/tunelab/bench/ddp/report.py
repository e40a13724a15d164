"""Output: a short human-readable table, then ONE JSON line of figures of merit.

The JSON line is the last line of stdout and starts with ``{"benchmark": "ddp"``; the
``ddp`` workload parses it. Throughput is in samples per second (``images_per_s`` for the
ResNets, ``windows_per_s`` for Leopard, both also as ``throughput``); times in seconds per
step; ``grad_bytes`` per step; bandwidths in bytes per second.
"""

from __future__ import annotations

import json
from typing import Any

from tunelab.bench.ddp.config import DDPConfig

__all__ = ["fom_line", "fom_record", "render_table"]


def _compute_text(cfg: DDPConfig, result: dict[str, Any]) -> str:
    mode = cfg.compute_mode
    if mode.emulated:
        return (f"EMULATED: each worker waits {mode.seconds:g} s per step instead of computing; "
                "gradients of the model's size are all-reduced for real")
    return f"real ({result.get('device', '?')}, amp {'on' if result.get('amp') else 'off'})"


def _layout_text(cfg: DDPConfig) -> str:
    text = f"{cfg.nodes} node(s) x {cfg.workers_per_node} worker(s), {cfg.placement}"
    if cfg.placement == "vnodes":
        text += f", link {cfg.link_gbit:g} Gbit/s" if cfg.link_gbit else ", link unlimited"
    return text


def render_table(cfg: DDPConfig, result: dict[str, Any]) -> str:
    """The settings and the measured figures, one per line (independent of terminal width)."""
    s = result["summary"]
    unit = result["unit"]
    gib = 1 << 30
    rows = [
        ("Model", f"{cfg.model} ({result['params']:,} trainable parameters), data {cfg.data}"),
        ("Workers", f"{cfg.workers}: {_layout_text(cfg)}"),
        ("Batch", f"{cfg.batch_size} global = {cfg.local_batch} per worker"),
        ("Compute", _compute_text(cfg, result)),
        ("Backend", f"{result['backend']}, {result.get('threads', '?')} thread(s) per worker"),
        ("Steps", f"{s['steps']} timed, {cfg.warmup} warm-up"),
        ("Throughput", f"{s['throughput']:.2f} {unit}/s total, "
                       f"{s['throughput_per_worker']:.2f} per worker"),
        ("Step time", f"{s['step_s'] * 1e3:.1f} ms +/- {s['step_s_std'] * 1e3:.1f} ms"),
        ("  compute", f"{s['compute_s'] * 1e3:.1f} ms"),
        ("  all-reduce", f"{s['allreduce_s'] * 1e3:.1f} ms window, "
                         f"{s['exposed_s'] * 1e3:.1f} ms not overlapped"),
        ("  other", f"{s['other_s'] * 1e3:.1f} ms (optimizer)"),
        ("Gradient bytes", f"{s['grad_bytes']:,} per step"),
        ("All-reduce bw", f"{s['algbw'] / gib:.3f} GiB/s algorithm, "
                          f"{s['busbw'] / gib:.3f} GiB/s bus"),
    ]
    lines = ["DDP training benchmark", "-" * 72]
    lines += [f"{name:<16}| {value}" for name, value in rows]
    lines.append("-" * 72)
    return "\n".join(lines)


def fom_record(cfg: DDPConfig, result: dict[str, Any]) -> dict[str, Any]:
    """The figures of merit and the settings that produced them."""
    s = result["summary"]
    unit = result["unit"]
    return {
        "benchmark": "ddp",
        "model": cfg.model,
        "params": result["params"],
        "data": cfg.data,
        "compute": str(cfg.compute_mode),
        "compute_emulated": bool(result["emulated"]),
        "device": result["device"],
        "backend": result["backend"],
        "amp": bool(result["amp"]),
        "threads": result.get("threads"),
        "hosts": result.get("hosts", 1),
        "host_cores": result.get("host_cores"),
        "gpu": str(result["device"]) != "cpu",
        "workers": cfg.workers,
        "nodes": cfg.nodes,
        "workers_per_node": cfg.workers_per_node,
        "placement": cfg.placement,
        "link_gbit": cfg.link_gbit,
        "batch_size": cfg.batch_size,
        "local_batch": cfg.local_batch,
        "steps": s["steps"],
        "warmup": cfg.warmup,
        "unit": unit,
        "throughput": s["throughput"],
        f"{unit}_per_s": s["throughput"],
        "throughput_per_worker": s["throughput_per_worker"],
        "step_s": s["step_s"],
        "step_s_std": s["step_s_std"],
        "compute_s": s["compute_s"],
        "allreduce_s": s["allreduce_s"],
        "exposed_s": s["exposed_s"],
        "other_s": s["other_s"],
        "grad_bytes": s["grad_bytes"],
        "allreduce_algbw": s["algbw"],
        "allreduce_busbw": s["busbw"],
    }


def fom_line(cfg: DDPConfig, result: dict[str, Any]) -> str:
    """The final JSON line."""
    return json.dumps(fom_record(cfg, result))
