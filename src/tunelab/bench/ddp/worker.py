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
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunelab.bench.ddp.config import DDPConfig
from tunelab.errors import WorkloadError

if TYPE_CHECKING:
    import torch

__all__ = ["Runtime", "StatusFile", "read_status", "select_runtime", "worker_main"]

EXIT_FAILURE = 4


class StatusFile:
    """``status_dir/rank-R.json``: pid, node, phase, step; replaced atomically."""

    def __init__(self, directory: str | None, rank: int, node: int) -> None:
        self._path = Path(directory) / f"rank-{rank}.json" if directory else None
        self._base = {"pid": os.getpid(), "rank": rank, "node": node}
        self._step = -1

    def write(self, phase: str, step: int | None = None, error: str | None = None) -> None:
        """Record the phase this worker is in (and the step, kept until the next one)."""
        if step is not None:
            self._step = step
        step = self._step
        if self._path is None:
            return
        tmp = self._path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**self._base, "phase": phase, "step": step, "error": error}))
        os.replace(tmp, self._path)


def read_status(directory: str | Path, rank: int) -> dict[str, Any] | None:
    """A worker's last status, or None if it never wrote one."""
    try:
        return dict(json.loads((Path(directory) / f"rank-{rank}.json").read_text()))
    except (OSError, ValueError):
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
    if world != cfg.workers:
        raise WorkloadError(f"torchrun started {world} workers but --workers is {cfg.workers}")
    phase = "start"
    try:
        summary = _train(cfg, rank, world, local_rank, status)
        phase = "report"
        if rank == 0:
            _report(cfg, summary, result_file)
        status.write("done")
        return 0
    except WorkloadError:
        raise
    except Exception as exc:  # a peer that died, a timeout: one line, then exit non-zero
        msg = " ".join(str(exc).split())[:300]
        status.write("failed", error=msg)
        print(f"ddp: worker {rank} failed in phase {phase}: {type(exc).__name__}: {msg}",
              file=sys.stderr, flush=True)
        return EXIT_FAILURE


def _train(cfg: DDPConfig, rank: int, world: int, local_rank: int,
           status: StatusFile) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from tunelab.bench.ddp.comm import CommTimer, bucket_sizes, emulated_allreduce
    from tunelab.bench.ddp.data import make_source
    from tunelab.bench.ddp.metrics import RankRecord, StepRecord, summarize
    from tunelab.bench.ddp.models import build_model, parameter_count

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rt = select_runtime(cfg.device, cfg.backend, cfg.amp, local_rank,
                        cuda_devices=torch.cuda.device_count())
    device = torch.device(rt.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(rt.backend, timeout=datetime.timedelta(seconds=cfg.timeout))
    status.write("joined")
    compute = cfg.compute_mode
    model, spec = build_model(cfg.model, image_size=cfg.image_size, window=cfg.window,
                              device="meta" if compute.emulated else device)
    params = parameter_count(model)
    if compute.emulated:
        numels = [p.numel() for p in model.parameters() if p.requires_grad]
        buckets = [torch.zeros(n, dtype=torch.float32, device=device)
                   for n in bucket_sizes(numels, 4, cfg.bucket_mb)]
        del model

        def step_fn() -> tuple[float, float, float, float, float, int]:
            t0 = time.perf_counter()
            time.sleep(compute.seconds)
            t_c = time.perf_counter()
            comm = emulated_allreduce(buckets, world)
            t1 = time.perf_counter()
            return (t1 - t0, t_c - t0, comm.done - comm.first_launch, t1 - t_c, 0.0,
                    comm.bytes)
    else:
        step_fn = _real_step(cfg, model, spec, rt, device, world, rank, CommTimer, make_source)

    records: list[StepRecord] = []
    total = cfg.warmup + cfg.steps
    start = 0.0
    for i in range(total):
        if i == cfg.warmup:
            dist.barrier()
            start = time.perf_counter()
        timed = i - cfg.warmup
        status.write("warmup" if timed < 0 else "timed", step=i)
        fault = cfg.fault
        if fault and fault.action == "kill" and fault.rank == rank and timed == fault.step:
            os.kill(os.getpid(), signal.SIGKILL)
        step_s, compute_s, allreduce_s, exposed_s, other_s, nbytes = step_fn()
        if timed >= 0:
            records.append(StepRecord(step_s, compute_s, allreduce_s, exposed_s, other_s,
                                      nbytes))
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    status.write("gather")
    mine = RankRecord(rank, cfg.node_of(rank), elapsed, tuple(records))
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {"record": asdict(mine), "boot": _boot_id()})
    _leave_group()
    ranks = [RankRecord(g["record"]["rank"], g["record"]["node"], g["record"]["elapsed_s"],
                        tuple(StepRecord(**s) for s in g["record"]["steps"])) for g in gathered]
    hosts = len({g["boot"] for g in gathered})
    summary = summarize(ranks, cfg.batch_size)
    return {"summary": asdict(summary), "params": params, "unit": spec.unit,
            "device": rt.device if device.type == "cpu" else torch.cuda.get_device_name(device),
            "backend": rt.backend, "amp": rt.amp, "emulated": compute.emulated,
            "threads": torch.get_num_threads(), "hosts": hosts,
            "host_cores": os.cpu_count() or 1,
            "per_rank_elapsed_s": [r.elapsed_s for r in ranks]}


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


def _real_step(cfg: DDPConfig, model: torch.nn.Module, spec: Any, rt: Runtime,
               device: torch.device, world: int, rank: int, comm_timer: Any,
               make_source: Any) -> Any:
    """A closure running one real training step under DDP (forward, backward with the
    bucketed all-reduce overlapping it, optimizer step)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    cuda = device.type == "cuda"
    if cuda and spec.task == "classify":
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    ddp = DDP(model, device_ids=[device] if cuda else None, bucket_cap_mb=cfg.bucket_mb)
    timer = comm_timer(None, device)
    # a plain callable: DDP rejects hooks whose annotations are strings (PEP 563)
    ddp.register_comm_hook(None, lambda state, bucket: timer(state, bucket))
    if spec.task == "classify":
        loss_fn: Any = torch.nn.CrossEntropyLoss()
        opt: torch.optim.Optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    else:
        loss_fn = torch.nn.BCEWithLogitsLoss()
        opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda", enabled=rt.amp)
    source = make_source(cfg.data, spec, cfg.local_batch, device, cfg.seed + rank)
    step_no = [0]

    def step_fn() -> tuple[float, float, float, float, float, int]:
        x, y = source.batch(step_no[0])
        step_no[0] += 1
        ev0 = None
        if cuda:
            torch.cuda.synchronize()
            ev0 = torch.cuda.Event(enable_timing=True)
            ev0.record()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.float16, enabled=rt.amp):
            loss = loss_fn(ddp(x), y)
        scaler.scale(loss).backward()
        if cuda:
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        comm = timer.take(t0, ev0)
        if comm is None:
            return t2 - t0, t1 - t0, 0.0, 0.0, t2 - t1, 0
        compute_end = min(comm.last_launch, t1)
        return (t2 - t0, compute_end - t0, comm.done - comm.first_launch,
                max(0.0, t1 - compute_end), t2 - t1, comm.bytes)

    return step_fn


def _report(cfg: DDPConfig, result: dict[str, Any], result_file: str | None) -> None:
    if result_file:
        tmp = Path(result_file).with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        os.replace(tmp, result_file)
        return
    from tunelab.bench.ddp.report import fom_line, render_table

    print(render_table(cfg, result), flush=True)
    print(fom_line(cfg, result), flush=True)
