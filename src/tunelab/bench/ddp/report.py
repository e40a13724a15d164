"""Output: a short human-readable table, then ONE JSON line of figures of merit.

The JSON line is the last line of stdout and starts with ``{"benchmark": "ddp"``; the
``ddp`` workload parses it. Throughput is in samples per second (``images_per_s`` for the
ResNets, ``windows_per_s`` for Leopard, ``volumes_per_s`` for the 3-D U-Net, all also as
``throughput``); times in seconds per step; ``grad_bytes`` per step; bandwidths in bytes per
second; storage reads in bytes per second (``read_Bps``) and also as ``read_MBps``
(megabytes, 10^6 bytes) and ``read_MiBps`` (mebibytes, 2^20 bytes) per second, spelled out
in the table because the two differ by 4.9 %.
"""

from __future__ import annotations

import json
import math
from typing import Any

from tunelab.bench.ddp.config import DDPConfig

__all__ = ["cpu_demand", "fom_line", "fom_record", "render_table"]


MB = 1e6
MIB = float(1 << 20)


def _rate(bps: float) -> str:
    """A byte rate in both units, each spelled out."""
    return (f"{bps / MIB:,.1f} MiB/s (mebibytes per second) = {bps / MB:,.1f} MB/s "
            "(megabytes per second)")


def _compute_text(cfg: DDPConfig, result: dict[str, Any]) -> str:
    mode = cfg.compute_mode
    if mode.profile is not None:
        p = mode.profile
        return (f"EMULATED: each worker waits {p.step_s:g} s per step: {p.accelerator} "
                f"{p.model} at batch {p.batch}, {p.precision} ({p.kind}: {p.source})")
    if mode.emulated:
        return f"EMULATED: each worker waits {mode.seconds:g} s per step instead of computing"
    setup = result.get("setup") or {}
    return (f"real ({result.get('device', '?')}, {setup.get('precision', '?')}, "
            f"{setup.get('memory_format', '?')}, {setup.get('optimizer', '?')})")


def _allreduce_text(cfg: DDPConfig, result: dict[str, Any]) -> str:
    mode = result.get("allreduce", cfg.allreduce_mode)
    if cfg.workers == 1 or mode == "none":
        return "one worker: no all-reduce"
    if mode == "off":
        return "--allreduce off: none"
    if mode == "emulate":
        f = (result.get("setup") or {}).get("fabric") or {}
        return (f"EMULATED on {f.get('accelerator', '?')}'s {f.get('link', '?')} "
                f"({f.get('GBps', 0):g} GB/s, {f.get('latency_us', 0):g} us per ring step), "
                "overlapped with the backward part of the step")
    return f"real ({result.get('backend', '?')})"


def _layout_text(cfg: DDPConfig) -> str:
    text = f"{cfg.nodes} node(s) x {cfg.workers_per_node} worker(s), {cfg.placement}"
    if cfg.placement == "vnodes":
        text += f", link {cfg.link_gbit:g} Gbit/s" if cfg.link_gbit else ", link unlimited"
        if cfg.workers > 1 and cfg.allreduce_mode != "real":
            text += (f" (carries no gradients: the all-reduce is {cfg.allreduce_mode}; "
                     "--allreduce real sends them over the links)")
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
        ("Backend", f"{result['backend']}, {result.get('threads', '?')} thread(s) per worker"
                    f"{_cores_text(cfg, result)}"),
        ("Steps", f"{s['steps']} timed, {_warmup_text(cfg, result)}"),
        ("Throughput", f"{s['throughput']:.2f} {unit}/s total, "
                       f"{s['throughput_per_worker']:.2f} per worker{_beside(result)}"),
        ("  of bound", _bound_text(result, unit)),
        ("Step time", f"{s['step_s'] * 1e3:.1f} ms +/- {s['step_s_std'] * 1e3:.1f} ms"),
        ("  compute", f"{s['compute_s'] * 1e3:.1f} ms"),
        ("  all-reduce", f"{s['allreduce_s'] * 1e3:.1f} ms window, "
                         f"{s['exposed_s'] * 1e3:.1f} ms not overlapped; "
                         f"{_allreduce_text(cfg, result)}"),
        ("  other", f"{s['other_s'] * 1e3:.1f} ms (optimizer)"),
        ("Gradient bytes", f"{s['grad_bytes']:,} per step"),
        ("All-reduce bw", f"{s['algbw'] / gib:.3f} GiB/s algorithm, "
                          f"{s['busbw'] / gib:.3f} GiB/s bus (bytes / "
                          f"{s.get('allreduce_busy_s', 0.0) * 1e3:.1f} ms of the buckets' own "
                          "all-reduce time)"),
    ]
    e = result.get("energy")
    if e:
        rows.append(("GPU energy", f"{e['joules']:,.1f} J over the timed steps, "
                                   f"{e['J_per_sample']:.4f} J per {unit[:-1]}, mean "
                                   f"{e['watts']:,.1f} W (NVML, {e['method']})"))
    rows[0] = ("Model", f"{cfg.model} ({result['params']:,} trainable parameters)")
    rows[1:1] = _data_rows(cfg, result)
    rows += _input_rows(cfg, result)
    lines = ["DDP training benchmark", "-" * 72]
    lines += [f"{name:<16}| {value}" for name, value in rows]
    lines.append("-" * 72)
    return "\n".join(lines)


def _beside(result: dict[str, Any]) -> str:
    """``; 0.43 of bound``: what follows the throughput where the run measured its bound."""
    fraction = (result.get("bound") or {}).get("bound_fraction")
    if fraction is None:
        return ""
    return f"; {fraction:.2f} of bound{' (no bound: see below)' if fraction > 1 else ''}"


def _bound_text(result: dict[str, Any], unit: str) -> str:
    """The in-run bound: the training FLOP/s over the highest GEMM rate timed before the
    warm-up and after the steps."""
    if result.get("emulated"):
        return "none: emulated compute does no arithmetic"
    b = result.get("bound") or {}
    if "bound_fraction" not in b:
        return f"not measured ({b.get('bound_error', 'no record')})"
    rates = ", ".join(f"{b[k] / 1e9:,.1f} GFLOP/s {when}" for k, when in (
        ("gemm_before_flops_per_s", "before the warm-up"),
        ("gemm_after_flops_per_s", "after the timed steps")) if b.get(k) is not None)
    n = b.get("gemm_measurements")
    when = (f"the highest of {n} measured in the run: {rates}" if n and rates
            else "measured in the run after the timed steps")
    above = ("; above 1: no bound: the steps outran the GEMM every time it was measured "
             "(others' load slowed the GEMM more than the steps, or the model's kernels, "
             "e.g. oneDNN's convolutions, beat torch.matmul), so this is no fraction of the "
             "machine's rate (a study's best and report leave it out)"
             if b["bound_fraction"] > 1 else "")
    return (f"{b['bound_fraction']:.2f} = {b['achieved_flops_per_s'] / 1e9:,.1f} GFLOP/s "
            f"training ({b['flops_per_sample'] / 1e9:,.3f} GFLOP per {unit[:-1]}, forward "
            f"and backward, counted) / {b['gemm_flops_per_s'] / 1e9:,.1f} GFLOP/s "
            f"{b['gemm_precision']} GEMM ({b['bound_method']}; {when}; "
            f"{b['bound_s']:.2f} s){above}")


def cpu_demand(cfg: DDPConfig, result: dict[str, Any]) -> float | None:
    """Threads the workers of one host run per core of it (the virtual nodes of
    ``--placement vnodes`` all share this host); None where unknown. Above 1 the run is
    oversubscribed: the workers take turns on the cores."""
    cores, threads = result.get("host_cores"), result.get("threads")
    if str(result.get("device", "cpu")) != "cpu" or not cores or not threads:
        return None
    per_host = cfg.workers / max(1, int(result.get("hosts") or 1))
    return float(per_host * threads / cores)


def _cores_text(cfg: DDPConfig, result: dict[str, Any]) -> str:
    demand = cpu_demand(cfg, result)
    if demand is None or demand <= 1.0:
        return ""
    timed = ("all-reduce times include" if cfg.compute_mode.emulated  # compute: a sleep
             else "compute and all-reduce times include")
    return (f"; OVERSUBSCRIBED: {demand:g} threads per core ({cfg.workers} workers on "
            f"{result['host_cores']} cores): the workers take turns on the cores, so {timed} "
            "waiting for a core")


def _warmup_text(cfg: DDPConfig, result: dict[str, Any]) -> str:
    """The warm-up run, and why it was longer than ``--warmup`` (see
    :mod:`tunelab.bench.ddp.warmup`)."""
    warm = int(result.get("warmup", cfg.warmup_steps))
    end = result.get("warmup_end", "fixed")
    text = f"{warm} warm-up"
    if cfg.warmup_steps != cfg.warmup:
        text += (f" (--warmup {cfg.warmup} raised to at least the loaders' read-ahead, "
                 f"{cfg.loader_workers} process(es) x prefetch {cfg.prefetch}, so that the "
                 "timed steps do not begin on batches read before them)")
    reason = {"drained": "until the read-ahead had drained (a step waited for its batch)",
              "steady": "until the loaders kept pace with the steps (the read-ahead stays)",
              "limit": f"stopped at its limit of {cfg.warmup_max_steps} steps with the "
                       "loaders still behind and batches read ahead left: the timed steps "
                       "run partly on them (give more --steps)"}.get(str(end))
    return f"{text}; {reason}" if reason and warm > cfg.warmup_steps else text


def _data_rows(cfg: DDPConfig, result: dict[str, Any]) -> list[tuple[str, str]]:
    st = result.get("storage") or {}
    rows = [("Data", str(cfg.data))]
    if st.get("layout"):
        rows.append(("  dataset", f"{st['layout']}, {st['samples']:,} samples, "
                                  f"{st['bytes'] / MB:,.1f} MB, mean "
                                  f"{st['mean_sample_bytes'] / 1e3:,.1f} kB per sample"))
    if cfg.data_spec.kind != "synthetic":
        loaders = (f"{cfg.loader_workers} loader process(es) per worker, prefetch "
                   f"{cfg.prefetch}" if cfg.loader_workers else "loading in the worker itself")
        rows.append(("  loader", f"{loaders}, decode {cfg.decode}"))
    if cfg.data_spec.kind == "files":
        share = result["summary"].get("device_share", math.nan)
        measured = ("the kernel counted no reads" if not math.isfinite(share) else
                    f"measured: {share:.1%} of the bytes read came from the device")
        rows.append(("  cache", f"{cfg.cache}: {'; '.join(st.get('cache_actions', []))}; "
                                f"{measured}"))
    if st.get("read_limit"):
        rows.append(("  read limit", st["read_limit"]))
    for note in st.get("notes", []):
        rows.append(("  note", note))
    return rows


def _input_rows(cfg: DDPConfig, result: dict[str, Any]) -> list[tuple[str, str]]:
    s = result["summary"]
    if cfg.data_spec.kind == "synthetic" and not s.get("read_bytes"):
        return [("Data wait", f"{s.get('data_s', 0.0) * 1e3:.2f} ms per step (synthetic: "
                              "one batch made once)"),
                ("AU", f"{s['au']:.2%} (compute / step time); all-reduce not overlapped "
                       f"{s['comm_frac']:.2%}")]
    bound = "INPUT-BOUND" if s["input_bound"] else "not input-bound"
    rows = [
        ("Step split", f"data wait {s['data_s'] * 1e3:.1f} ms, compute {s['compute_s'] * 1e3:.1f}"
                       f" ms, all-reduce {s['exposed_s'] * 1e3:.1f} ms not overlapped"
                       + _peer_text(s) + ", other "
                       f"{s['other_s'] * 1e3:.1f} ms, harness {s['overhead_s'] * 1e3:.2f} ms"
                       + (f", cache drop {s['drop_s'] * 1e3:.1f} ms" if s["drop_s"] else "")),
        ("AU", f"{s['au']:.2%} of the timed steps computing (compute / step time, MLPerf "
               f"Storage's AU; lowest worker {s['au_min']:.2%}); beside it: all-reduce not "
               f"overlapped {s['comm_frac']:.2%}, waiting for input {s['wait_frac']:.2%}, "
               f"harness {s['overhead_frac']:.2%}; {bound} (data wait {s['input_frac']:.1%} "
               "of the step)"),
        ("AU whole run", f"{s['au_run']:.2%} (lowest {s['au_run_min']:.2%}): first step waited "
                         f"{s['first_wait_s']:.3f} s for the loader to start, shutdown "
                         f"{s['shutdown_s']:.3f} s, set-up before {result.get('prep_s', 0):.3f} s"
                         " (not in the run)"),
    ]
    if s.get("read_bytes") or cfg.data_spec.kind == "files":
        rows.append(("Read", f"{_rate(s['read_Bps'])}; "
                             f"{s['read_Bps'] / cfg.workers / MB:,.1f} MB/s per worker"))
        if s.get("rchar", -1) >= 0:
            check = s["rchar"] / s["read_bytes"] if s["read_bytes"] else math.nan
            rows.append(("  /proc io", f"rchar {_rate(s['rchar_Bps'])} ({check:.3f} x counted); "
                                       f"read_bytes from the device "
                                       f"{s['device_Bps'] / MB:,.1f} MB/s"))
    corrupt = s.get("corrupt", 0)
    if corrupt:
        files = "; ".join((result.get("data") or {}).get("corrupt_files", []))
        rows.append(("Corrupt", f"{corrupt} sample(s) skipped: {files}"))
    return rows


def _peer_text(s: dict[str, Any]) -> str:
    """The part of the exposed all-reduce spent waiting for workers that are behind."""
    peer = s.get("peer_s", 0.0)
    if peer < 5e-5:
        return ""
    return (f" (of which {peer * 1e3:.1f} ms waiting for workers that are behind, most often "
            "for their data)")


def fom_record(cfg: DDPConfig, result: dict[str, Any]) -> dict[str, Any]:
    """The figures of merit and the settings that produced them."""
    s = result["summary"]
    unit = result["unit"]
    return {
        "benchmark": "ddp",
        "model": cfg.model,
        "params": result["params"],
        "flops_per_sample": result.get("flops_per_sample"),
        "data": cfg.data,
        "synthetic_data": cfg.data_spec.kind == "synthetic",
        "compute": str(cfg.compute_mode),
        "compute_emulated": bool(result["emulated"]),
        "device": result["device"],
        "backend": result["backend"],
        "amp": bool(result["amp"]),
        "threads": result.get("threads"),
        "hosts": result.get("hosts", 1),
        "host_cores": result.get("host_cores"),
        "cpu_demand": cpu_demand(cfg, result),
        "oversubscribed": (cpu_demand(cfg, result) or 0.0) > 1.0,
        "gpu": str(result["device"]) != "cpu",
        "workers": cfg.workers,
        "nodes": cfg.nodes,
        "workers_per_node": cfg.workers_per_node,
        "placement": cfg.placement,
        "link_gbit": cfg.link_gbit,
        "batch_size": cfg.batch_size,
        "local_batch": cfg.local_batch,
        "steps": s["steps"],
        "warmup": int(result.get("warmup", cfg.warmup_steps)),
        "warmup_end": result.get("warmup_end", "fixed"),
        "warmup_max": cfg.warmup_max_steps,
        "unit": unit,
        "throughput": s["throughput"],
        f"{unit}_per_s": s["throughput"],
        "throughput_per_worker": s["throughput_per_worker"],
        "step_s": s["step_s"],
        "step_s_std": s["step_s_std"],
        "compute_s": s["compute_s"],
        "allreduce_s": s["allreduce_s"],
        "allreduce_busy_s": s.get("allreduce_busy_s", 0.0),
        "exposed_s": s["exposed_s"],
        "peer_s": s.get("peer_s", 0.0),
        "other_s": s["other_s"],
        "grad_bytes": s["grad_bytes"],
        "allreduce": result.get("allreduce", cfg.allreduce_mode),
        "allreduce_fabric": ((result.get("setup") or {}).get("fabric") or {}).get("link"),
        "precision": (result.get("setup") or {}).get("precision"),
        "memory_format": (result.get("setup") or {}).get("memory_format"),
        "allreduce_algbw": s["algbw"],
        "allreduce_busbw": s["busbw"],
        **_energy_record(result),
        **(result.get("bound") or {}),
        **_storage_record(cfg, result),
    }


def _energy_record(result: dict[str, Any]) -> dict[str, Any]:
    """GPU energy over the timed steps where NVML reported it (absent otherwise)."""
    e = result.get("energy")
    if not e:
        return {}
    return {"energy_J": e["joules"], "energy_J_per_sample": e["J_per_sample"],
            "power_W": e["watts"], "energy_method": e["method"]}


def _finite(v: Any) -> Any:
    return v if not isinstance(v, float) or math.isfinite(v) else None


def _storage_record(cfg: DDPConfig, result: dict[str, Any]) -> dict[str, Any]:
    """The input pipeline's figures (JSON: NaN as null)."""
    s = result["summary"]
    st = result.get("storage") or {}
    data = result.get("data") or {}
    mode = cfg.compute_mode
    check = s["rchar"] / s["read_bytes"] if s.get("read_bytes") and s.get("rchar", -1) >= 0 \
        else math.nan
    rec: dict[str, Any] = {
        "data_kind": cfg.data_spec.kind,
        "dataset_layout": st.get("layout"),
        "dataset_samples": st.get("samples"),
        "dataset_bytes": st.get("bytes"),
        "mean_sample_bytes": st.get("mean_sample_bytes"),
        "loader_workers": cfg.loader_workers,
        "prefetch": cfg.prefetch,
        "decode": cfg.decode,
        "cache": cfg.cache if cfg.data_spec.kind == "files" else "n/a",
        "cache_actions": st.get("cache_actions", []),
        "read_limit": cfg.read_limit,
        "read_limit_Bps": cfg.read_limit_bps,
        "read_limit_setting": st.get("read_limit"),
        "samples": s["samples"],
        "busy_s": s["compute_s"] + s["exposed_s"] + s["other_s"],
        "data_s": s["data_s"],
        "drop_s": s["drop_s"],
        "overhead_s": s["overhead_s"],
        "au": s["au"],
        "au_min": s["au_min"],
        "comm_frac": s["comm_frac"],
        "peer_frac": s.get("peer_frac", math.nan),
        "wait_frac": s["wait_frac"],
        "overhead_frac": s["overhead_frac"],
        "input_frac": s["input_frac"],
        "input_bound": bool(s["input_bound"]),
        "bound": "input-bound" if s["input_bound"] else "",
        "au_run": s["au_run"],
        "au_run_min": s["au_run_min"],
        "first_wait_s": s["first_wait_s"],
        "shutdown_s": s["shutdown_s"],
        "prep_s": result.get("prep_s"),
        "read_bytes": s["read_bytes"],
        "read_Bps": s["read_Bps"],
        "read_MBps": s["read_Bps"] / MB,
        "read_MiBps": s["read_Bps"] / MIB,
        "read_MBps_per_worker": s["read_Bps"] / cfg.workers / MB,
        "proc_rchar_bytes": s["rchar"],
        "proc_rchar_Bps": s["rchar_Bps"],
        "proc_device_bytes": s["device_bytes"],
        "proc_device_Bps": s["device_Bps"],
        "io_check": check,
        "device_share": s["device_share"],
        "corrupt_samples": s["corrupt"],
        "corrupt_files": data.get("corrupt_files", []),
        "epochs": data.get("epochs", 0),
        "compute_step_s": mode.seconds if mode.emulated else None,
        "compute_profile": mode.profile.name if mode.profile else None,
        "compute_kind": mode.profile.kind if mode.profile else None,
        "compute_source": mode.profile.source if mode.profile else None,
    }
    return {k: _finite(v) for k, v in rec.items()}


def fom_line(cfg: DDPConfig, result: dict[str, Any]) -> str:
    """The final JSON line."""
    return json.dumps(fom_record(cfg, result))
