"""One DDP worker: join the group torchrun set up, train, time every step, report.

Run by ``torchrun … -m tunelab.bench.ddp`` (it sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` and the rendezvous address). Each worker keeps a small status file (pid,
node, phase, step) that the launcher reads to name a worker that never started or died.
After the timed steps every worker's records are gathered on rank 0, which writes the
summary to ``result_file`` (under tunelab's launcher) or prints the table and the JSON line
(under a torchrun started by hand, e.g. on real hosts).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tunelab.bench.ddp.config import DDPConfig
from tunelab.errors import WorkloadError

__all__ = ["Runtime", "StatusFile", "check_gpu_layout", "error_line", "read_status",
           "select_runtime", "worker_main"]

EXIT_FAILURE = 4


class StatusFile:
    """``status_dir/rank-R.json``: pid, node, phase, step.

    Written every step, so it must be cheap: one ``pwrite`` of a record padded to
    :data:`STATUS_BYTES` at offset 0 of a file kept open (one page: a reader sees the old
    record or the new one); :func:`read_status` retries once if it catches neither.
    """

    def __init__(self, directory: str | None, rank: int, node: int) -> None:
        self.directory = directory
        self._path = Path(directory) / f"rank-{rank}.json" if directory else None
        self._base = {"pid": os.getpid(), "rank": rank, "node": node}
        self._step = -1
        self._fd: int | None = None
        #: the step the timed steps began at (None during the warm-up)
        self.timed_from: int | None = None

    def write(self, phase: str, step: int | None = None, error: str | None = None,
              origin: bool = False) -> None:
        """Record the phase this worker is in (and the step, kept until the next one);
        ``origin``: this worker's failure is a cause (its data loader), not a peer's echo."""
        if step is not None:
            self._step = step
        step = self._step
        if self._path is None:
            return
        record = {**self._base, "phase": phase, "step": step, "timed_from": self.timed_from,
                  "error": error, "origin": origin}
        data = json.dumps(record).encode()
        if len(data) >= STATUS_BYTES:
            record["error"] = (error or "")[:STATUS_BYTES // 2]
            data = json.dumps(record).encode()[:STATUS_BYTES - 1]
        if self._fd is None:
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        os.pwrite(self._fd, data.ljust(STATUS_BYTES), 0)


#: bytes of a status record (padded with spaces; within one page)
STATUS_BYTES = 1024


def read_status(directory: str | Path, rank: int) -> dict[str, Any] | None:
    """A worker's last status, or None if it never wrote one."""
    for _ in range(2):
        try:
            return dict(json.loads((Path(directory) / f"rank-{rank}.json").read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            continue
    return None


class Runtime:
    """Device, communication backend and precision of a worker."""

    def __init__(self, device: str, backend: str, amp: bool) -> None:
        self.device = device
        self.backend = backend
        self.amp = amp

    def __repr__(self) -> str:
        return f"Runtime({self.device!r}, {self.backend!r}, amp={self.amp})"


def select_runtime(device: str, backend: str, amp: str, local_rank: int, *,
                   cuda_devices: int) -> Runtime:
    """Pick the device (``cuda:LOCAL_RANK mod count`` when CUDA is there and wanted), the
    backend (NCCL on CUDA, gloo on CPU) and mixed precision (fp16 autocast on CUDA by
    default; off on CPU, where bf16 autocast can be many times slower)."""
    use_cuda = device == "cuda" or (device == "auto" and cuda_devices > 0)
    if use_cuda and cuda_devices == 0:
        raise WorkloadError("--device cuda: no CUDA device is available here")
    dev = f"cuda:{local_rank % cuda_devices}" if use_cuda else "cpu"
    be = backend if backend != "auto" else ("nccl" if use_cuda else "gloo")
    if be == "nccl" and not use_cuda:
        raise WorkloadError("--backend nccl needs a CUDA device")
    use_amp = amp == "on" or (amp == "auto" and use_cuda)
    if use_amp and not use_cuda:
        raise WorkloadError("--amp on needs a CUDA device (fp16 autocast)")
    return Runtime(dev, be, use_amp)


def _env_int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise WorkloadError(f"worker mode needs {name} in the environment (run under "
                                "torchrun, or without --worker-config to launch workers)")
        return default
    return int(value)


def worker_main(cfg: DDPConfig, status_dir: str | None, result_file: str | None) -> int:
    """Run this worker; the process exit status."""
    rank = _env_int("RANK")
    world = _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK", 0)
    node = cfg.node_of(rank) if world == cfg.workers else rank // max(1, _env_int(
        "LOCAL_WORLD_SIZE", 1))
    status = StatusFile(status_dir, rank, node)
    status.write("start")
    if result_file is None and cfg.read_limit:
        raise WorkloadError("--read-limit needs the benchmark's own launcher (python -m "
                            "tunelab.bench.ddp without torchrun): workers started by torchrun "
                            "would each throttle separately")
    if world != cfg.workers:
        raise WorkloadError(f"torchrun started {world} workers but --workers is {cfg.workers}")
    phase = _Phase()
    try:
        summary = _train(cfg, rank, world, local_rank, status, phase)
        phase.name = "report"
        if rank == 0:
            if summary.get("flops_per_sample") is None:  # emulated compute: no bound counted it
                summary["flops_per_sample"] = _flops_per_sample(cfg)
            _report(cfg, summary, result_file)
        status.write("done")
        return 0
    except WorkloadError as exc:  # bad input found on the node (e.g. too few GPUs): a cause
        status.write("failed", error=str(exc), origin=True)
        raise
    except Exception as exc:  # a peer that died, a timeout, NCCL: one line, then exit non-zero
        import traceback

        from tunelab.bench.ddp.data import LoaderFailure

        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # no second raise from the loader's
        full = traceback.format_exc()
        msg = error_line(exc)
        status.write("failed", error=msg if isinstance(exc, LoaderFailure)
                     else f"in phase {phase.name}: {msg}",
                     origin=isinstance(exc, LoaderFailure) or _is_device_error(full))
        print(f"ddp: worker {rank} failed in phase {phase.name}: {msg}", file=sys.stderr,
              flush=True)
        print(full, file=sys.stderr, flush=True)  # the launcher keeps it for the run's log
        return EXIT_FAILURE


class _Phase:
    """The phase a worker is in (init, setup, train, report), named when it fails."""

    def __init__(self) -> None:
        self.name = "start"


_NCCL_LAST = re.compile(r"Last error:\s*(.+)", re.S)


def error_line(exc: BaseException) -> str:
    """One line for a worker's error: NCCL's own message (its "Last error:" text, where it
    gives one) or the exception's, without tracebacks, at most 300 characters."""
    text = str(exc)
    m = _NCCL_LAST.search(text)
    kind = type(exc).__name__
    if m:
        text = f"NCCL: {m.group(1)}"
    elif "NCCL" in text or "nccl" in kind.lower():
        kind = f"{kind} (NCCL)"
    return f"{kind}: {' '.join(text.split())[:300]}"


def _is_device_error(text: str) -> bool:
    """The failure comes from this worker's device or NCCL (a cause, not a peer's echo)."""
    return "Last error:" in text or "CUDA error" in text or "Duplicate GPU" in text


def check_gpu_layout(workers_per_node: int, gpus: int, backend: str) -> None:
    """Refuse more workers on a node than it has GPUs (NCCL needs one GPU per worker),
    naming both counts and the choices; gloo may share a GPU."""
    if backend == "gloo" or workers_per_node <= gpus:
        return
    raise WorkloadError(f"{workers_per_node} workers per node need {workers_per_node} GPUs "
                        f"with NCCL, but this node has {gpus} visible: use at most {gpus} "
                        f"worker(s) per node (--workers), more nodes (--nodes), or "
                        f"--backend gloo to share a GPU")


def _train(cfg: DDPConfig, rank: int, world: int, local_rank: int,
           status: StatusFile, phase: _Phase) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from tunelab.bench.ddp.bound import gemm_before, inrun_record
    from tunelab.bench.ddp.comm import bucket_sizes
    from tunelab.bench.ddp.data import make_source
    from tunelab.bench.ddp.metrics import RankRecord, RunAccount, StepRecord, summarize
    from tunelab.bench.ddp.models import build_model, parameter_count
    from tunelab.bench.ddp.step import emulated_step, training_step

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    phase.name = "init"
    rt = select_runtime(cfg.device, cfg.backend, cfg.amp, local_rank,
                        cuda_devices=torch.cuda.device_count())
    device = torch.device(rt.device)
    if device.type == "cuda":
        check_gpu_layout(_env_int("LOCAL_WORLD_SIZE", cfg.workers_per_node),
                         torch.cuda.device_count(), rt.backend)
        torch.cuda.set_device(device)
    dist.init_process_group(rt.backend, timeout=datetime.timedelta(seconds=cfg.timeout))
    status.write("joined")
    phase.name = "setup"
    compute = cfg.compute_mode
    allreduce = cfg.allreduce_mode if world > 1 else "none"  # one worker: no all-reduce
    model, spec = build_model(cfg.model, image_size=cfg.image_size, window=cfg.window,
                              patch=cfg.patch, device="meta" if compute.emulated else device)
    params = parameter_count(model)
    t_prep = time.perf_counter()
    source = make_source(cfg, spec, device, rank, world, status.directory)
    prep_s = time.perf_counter() - t_prep
    setup: dict[str, Any] = {}
    if compute.emulated:
        numels = [p.numel() for p in model.parameters() if p.requires_grad]
        sizes = bucket_sizes(numels, 4, cfg.bucket_mb)
        del model
        buckets = ([torch.zeros(n, dtype=torch.float32, device=device) for n in sizes]
                   if allreduce == "real" and world > 1 else [])
        link = cfg.fabric_spec.link(cfg.nodes) if allreduce == "emulate" else None
        step_fn = emulated_step(compute.seconds, allreduce, world, buckets=buckets,
                                bucket_bytes=[4 * n for n in sizes], link=link, device=device)
        if link is not None:
            setup["fabric"] = {"accelerator": cfg.fabric_spec.accelerator, "link": link.name,
                               "GBps": link.bandwidth / 1e9, "latency_us": link.latency * 1e6}
    else:
        train = training_step(model, spec, device, rt.amp,
                              ddp=world > 1 and allreduce == "real", bucket_mb=cfg.bucket_mb)
        setup = asdict(train.setup)
        step_fn = train

    # the GEMM rate before the warm-up, so that the bound need not rest on one moment's load
    # alone (tunelab.bench.ddp.bound); the warm-up steps run after it
    status.write("bound-before")
    before = None if compute.emulated else gemm_before(cfg, device.type, rt.amp)
    phase.name = "train"
    meter = None
    if device.type == "cuda":
        from tunelab.bench.ddp.energy import open_meter

        meter = open_meter(device.index or 0)
    try:
        marks, parts, start, warm, warm_end = _loop(
            cfg, rank, source, step_fn, status, compute.emulated,
            meter.start if meter is not None else None)
    except (RuntimeError, OSError, EOFError) as exc:  # a loader's death surfaces anywhere
        raise source.translate(exc) from None
    if device.type == "cuda":
        torch.cuda.synchronize()
    t_end = time.perf_counter()
    elapsed = t_end - start
    energy = meter.stop() if meter is not None else None
    status.write("shutdown")
    source.close()
    t_close = time.perf_counter()
    marks.append(t_end)
    steps = [StepRecord(step_s=marks[k + 1] - marks[k], compute_s=c, allreduce_s=a,
                        exposed_s=e, other_s=o, bytes=nb, data_s=d, drop_s=dr, peer_s=pw,
                        comm_busy_s=cb,
                        samples=int(info.get("samples", -1)),
                        read_bytes=int(info.get("bytes", 0)), rchar=int(info.get("rchar", -1)),
                        device_bytes=int(info.get("device_bytes", -1)),
                        corrupt=int(info.get("corrupt", 0)))
             for k, (d, dr, c, a, e, o, nb, pw, cb, info) in enumerate(parts)]
    run = RunAccount(run_s=t_close - marks[0], compute_s=sum(s.accel_s for s in steps),
                     wait_s=sum(s.data_s for s in steps), drop_s=sum(s.drop_s for s in steps),
                     first_wait_s=steps[0].data_s, shutdown_s=t_close - t_end,
                     read_bytes=sum(s.read_bytes for s in steps),
                     rchar=sum(s.rchar for s in steps),
                     device_bytes=sum(s.device_bytes for s in steps),
                     corrupt=sum(s.corrupt for s in steps))
    status.write("gather")
    mine = RankRecord(rank, cfg.node_of(rank), elapsed, tuple(steps[warm:]), run)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {"record": asdict(mine), "boot": _boot_id(),
                                      "data": source.summary(), "prep_s": prep_s,
                                      "energy": asdict(energy) if energy else None})
    ranks = [_rank_record(g["record"]) for g in gathered]
    hosts = len({g["boot"] for g in gathered})
    summary = summarize(ranks, cfg.batch_size)
    status.write("bound")
    bound = {} if compute.emulated else inrun_record(cfg, summary.throughput, device.type,
                                                     rt.amp, before)
    _leave_group()
    return {"summary": asdict(summary), "params": params, "unit": spec.unit,
            "device": rt.device if device.type == "cpu" else torch.cuda.get_device_name(device),
            "backend": rt.backend, "amp": rt.amp, "emulated": compute.emulated,
            "threads": torch.get_num_threads(), "hosts": hosts,
            "host_cores": os.cpu_count() or 1,
            "per_rank_elapsed_s": [r.elapsed_s for r in ranks],
            "data": _merge_data([g["data"] for g in gathered]),
            "prep_s": max(g["prep_s"] for g in gathered), "allreduce": allreduce,
            "setup": setup, "warmup": warm, "warmup_end": warm_end,
            "energy": _merge_energy([g["energy"] for g in gathered], summary.samples),
            "bound": bound, "flops_per_sample": bound.get("flops_per_sample")}


def _loop(cfg: DDPConfig, rank: int, source: Any, step_fn: Any, status: StatusFile,
          emulated: bool, on_timed: Any = None,
          ) -> tuple[list[float], list[Any], float, int, str]:
    """Every step: ask for a batch (timed: the data wait), run the step; the start of each
    step, its parts, when the timed steps began (``on_timed`` is called then), the warm-up
    steps run and why the warm-up ended (:func:`tunelab.bench.ddp.warmup.warmup_end`)."""
    import torch.distributed as dist

    from tunelab.bench.ddp.data import LoaderFailure
    from tunelab.bench.ddp.warmup import warmup_end

    # The barrier and the agreement below run once before any batch is asked for, so their
    # code is paged in now: the page cache was dropped (--cache cold), and under --read-limit
    # a page fault of this process waits in the throttle behind the loaders' queued reads.
    # At the first barrier after the warm-up that wait was 7.3 s (8 batches read ahead at
    # 50 MB/s) and the loaders refilled their read-ahead meanwhile: the timed steps ran on it.
    dist.barrier()
    _agreed(None, dist)
    parts: list[Any] = []
    marks: list[float] = []
    asked: list[float] = []
    ready: list[float | None] = []
    start = 0.0
    warm: int | None = None  # the warm-up's steps, once it has ended
    why = "fixed"
    i = 0
    while warm is None or i < warm + cfg.steps:
        if warm is None and i >= cfg.warmup_steps:
            end = warmup_end(asked, ready, min_steps=cfg.warmup_steps,
                             max_steps=cfg.warmup_max_steps, read_ahead=cfg.read_ahead)
            if i < cfg.warmup_max_steps:  # adaptive: every worker says whether it may end
                end = _agreed(end, dist)
            if end is not None:
                warm, why = i, end
                dist.barrier()
                if on_timed is not None:
                    on_timed()
                start = time.perf_counter()
                status.timed_from = i
        t0 = time.perf_counter()
        marks.append(t0)
        timed = i - warm if warm is not None else -1
        status.write("warmup" if warm is None else "timed", step=i)
        fault = cfg.fault
        if fault and fault.rank == rank and timed == fault.step:
            if fault.action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif fault.action == "kill-loader":
                source.kill_loader()
        t_req = time.perf_counter()
        asked.append(time.monotonic())
        x, y, info = source.next_batch()
        t1 = time.perf_counter()
        ready.append(info.get("ready"))
        if not emulated and int(info.get("samples", 1)) == 0:
            raise LoaderFailure(f"every sample of a batch of worker {rank} was corrupt "
                                f"(first: {(info.get('corrupt_files') or ['?'])[0]})")
        drop = source.drop_s
        c, a, e, o, nbytes, peer, busy = step_fn(x, y)
        parts.append((t1 - t_req - drop, drop, c, a, e, o, nbytes, peer, busy, info))
        i += 1
    return marks, parts, start, warm, why


def _agreed(end: str | None, dist: Any) -> str | None:
    """``end`` where every worker's warm-up may end at this step, else None (the workers
    time the same steps); one worker alone decides for itself."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return end
    import torch

    backend = dist.get_backend()
    device = f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"
    flag = torch.full((1,), 0.0 if end is None else 1.0, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return end if flag.item() > 0 else None


def _merge_energy(per_rank: list[dict[str, Any] | None], samples: int,
                  ) -> dict[str, Any] | None:
    """The GPUs' energy over the timed steps (every worker's summed), per sample and the mean
    power; None unless every worker's GPU reported it."""
    if not per_rank or any(e is None for e in per_rank):
        return None
    joules = sum(float(e["joules"]) for e in per_rank if e)
    seconds = max(float(e["seconds"]) for e in per_rank if e)
    return {"joules": joules, "J_per_sample": joules / samples if samples else None,
            "watts": joules / seconds if seconds > 0 else None,
            "method": per_rank[0]["method"] if per_rank[0] else ""}


def _rank_record(d: dict[str, Any]) -> Any:
    from tunelab.bench.ddp.metrics import RankRecord, RunAccount, StepRecord

    run = RunAccount(**d["run"]) if d.get("run") else None
    return RankRecord(d["rank"], d["node"], d["elapsed_s"],
                      tuple(StepRecord(**s) for s in d["steps"]), run)


def _merge_data(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Every worker's data-source summary as one."""
    names: list[str] = []
    for d in per_rank:
        names += [n for n in d.get("corrupt_files", []) if n not in names]
    return {"epochs": max(d.get("epochs", 0) for d in per_rank),
            "corrupt_files": names[:5], "cache": per_rank[0].get("cache", "n/a"),
            "dropped_files": sum(d.get("dropped_files", 0) for d in per_rank)}


def _boot_id() -> str:
    """This machine's boot id: virtual nodes share it, separate machines do not."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        import socket

        return socket.gethostname()


def _leave_group(wait_s: float = 10.0) -> None:
    """Destroy the process group, giving up after ``wait_s``: a gloo group's teardown was
    seen to block once after every collective had completed, and the results are in hand."""
    import threading

    import torch.distributed as dist

    t = threading.Thread(target=dist.destroy_process_group, daemon=True)
    t.start()
    t.join(wait_s)


def _flops_per_sample(cfg: DDPConfig) -> float | None:
    """The model's training FLOPs per sample (after the timed steps: nothing they measure
    waits for it); None where the count fails (it never fails the run)."""
    from tunelab.bench.ddp.models import flops_per_sample

    try:
        return flops_per_sample(cfg.model, image_size=cfg.image_size, window=cfg.window,
                                patch=cfg.patch)
    except Exception:  # a model the counter cannot trace: the run stands without it
        return None


def _report(cfg: DDPConfig, result: dict[str, Any], result_file: str | None) -> None:
    if result_file:
        tmp = Path(result_file).with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        os.replace(tmp, result_file)
        return
    from tunelab.bench.ddp.report import fom_line, render_table

    result["storage"] = _storage_without_launcher(cfg)
    print(render_table(cfg, result), flush=True)
    print(fom_line(cfg, result), flush=True)


def _storage_without_launcher(cfg: DDPConfig) -> dict[str, Any]:
    """What a torchrun started by hand (or by srun) knows of the dataset: no launcher
    dropped the machine's cache or filled it; each worker still drops its files' pages
    before every epoch under ``--cache cold``."""
    if not cfg.data_spec.path:
        return {}
    from tunelab.bench.ddp.dataset import index_dataset

    index = index_dataset(cfg.data_spec.path)
    actions = {"cold": ["posix_fadvise(DONTNEED) on each worker's files before every epoch "
                        "(workers started by torchrun: /proc/sys/vm/drop_caches not written)"],
               "warm": ["not filled before the run (workers started by torchrun)"],
               "keep": ["nothing done (the page cache as found)"]}[cfg.cache]
    return {"dataset": index.root, "layout": index.layout, "samples": index.samples,
            "bytes": index.bytes, "mean_sample_bytes": index.bytes / max(1, index.samples),
            "notes": list(index.notes), "cache_actions": actions}
