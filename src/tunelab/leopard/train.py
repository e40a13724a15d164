"""Training: masked BCE, Adam, early stopping, checkpoints, (distributed) data parallelism.

``python -m tunelab.leopard train --data DATA --out DIR`` where ``DATA`` is a data manifest
(``leopard.json`` or its directory: windows are drawn fresh every epoch from the genome) or a
directory of pre-extracted ``train.npz`` / ``val.npz`` / ``test.npz`` (fixed windows,
reshuffled every epoch). Rank 0 writes into ``DIR``:

* ``metrics.json`` — configuration, parameter counts, validation and test metrics of the
  restored best weights, training time, windows/s per worker and overall, history;
* ``history.csv`` — one row per epoch;
* ``best.pt`` / ``last.pt`` — the best weights, and everything needed to resume.

The last line on stdout is one JSON object of figures of merit (the engine's contract).
Progress and logs go to stderr. ``--batch-size`` is per worker: the global batch is
``batch_size * world_size``.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tunelab.leopard import distributed as D
from tunelab.leopard.data import (
    ChromosomeSet,
    WindowBatch,
    build_inputs,
    load_chromosomes,
    load_manifest,
)
from tunelab.leopard.errors import LeopardError
from tunelab.leopard.prefetch import prefetch
from tunelab.leopard.windows import WindowArrays, eval_starts, load_windows

if TYPE_CHECKING:
    import torch

__all__ = ["TrainConfig", "load_checkpoint", "train"]

FOM_KEYS = ("val_pr_auc", "val_loss", "val_dice", "val_iou", "test_pr_auc", "test_loss",
            "test_dice", "test_iou", "test_positive_fraction", "train_time_s",
            "windows_per_s", "windows_per_s_per_worker", "epochs", "best_epoch",
            "world_size", "lr_effective", "global_batch")


@dataclass
class TrainConfig:
    """Everything a training run depends on."""

    data: Path
    out: Path
    window: int | None = None  # None: from the .npz files, else 10240
    in_channels: int = 5
    base_filters: int = 15
    depth: int = 5
    kernel_size: int = 7
    batch_size: int = 64
    lr: float = 1e-3
    lr_scaling: str = "none"
    warmup_epochs: float = 0.0
    epochs: int = 10
    steps_per_epoch: int | None = None
    patience: int = 5
    augment_scale: float = 0.1
    bn_momentum: float = 0.01  # PyTorch convention; Keras' 0.99
    max_eval_windows: int | None = 256
    seed: int = 0
    sync_bn: bool = False
    device: str = "auto"
    amp: bool | None = None  # None: on CUDA only; True on a CPU: bf16 autocast
    compile: bool = False
    layout: str = "auto"  # CPU convolutions: "1d", "2d" (channels-last) or "auto" (measured)
    threads: int | None = None
    resume: bool = False
    progress: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------- data sources


class _Source:
    """Windows by id: a genome (ids are global starts) or fixed arrays (ids are indices)."""

    def __init__(self, cs: ChromosomeSet | None, arrays: WindowArrays | None, window: int,
                 name: str) -> None:
        self.cs, self.arrays, self.window, self.name = cs, arrays, window, name

    def n_distinct(self) -> int:
        if self.arrays is not None:
            return len(self.arrays)
        assert self.cs is not None
        return self.cs.n_positions(self.window)

    def bases(self) -> int:
        if self.arrays is not None:
            return len(self.arrays) * self.window
        assert self.cs is not None
        return self.cs.total_length

    def plan(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.arrays is not None:
            k = math.ceil(n / len(self.arrays))
            return np.concatenate([rng.permutation(len(self.arrays)) for _ in range(k)])[:n]
        assert self.cs is not None
        return self.cs.sample_starts(n, self.window, rng)

    def eval_ids(self, max_eval: int | None, seed: int) -> np.ndarray:
        if self.arrays is not None:
            return np.arange(len(self.arrays))
        assert self.cs is not None
        return eval_starts(self.cs, self.window, max_eval, seed)

    def get(self, ids: np.ndarray) -> WindowBatch:
        if self.arrays is not None:
            return self.arrays.take(ids)
        assert self.cs is not None
        return self.cs.gather(ids, self.window)


def _open_sources(cfg: TrainConfig, multiple: int) -> tuple[dict[str, _Source], int]:
    data = Path(cfg.data)
    need_avg = cfg.in_channels == 6
    if data.is_dir() and (data / "train.npz").is_file():
        sources = {}
        window = None
        for split in ("train", "val", "test"):
            arr = load_windows(data / f"{split}.npz")
            if window is None:
                window = arr.window
            elif arr.window != window:
                raise LeopardError(f"{arr.source}: window length {arr.window} differs from "
                                   f"train.npz's {window}")
            if need_avg and arr.batch.dnase_avg is None:
                raise LeopardError(f"{arr.source}: 6 input channels need 'dnase_avg' windows")
            sources[split] = _Source(None, arr, arr.window, arr.source)
        assert window is not None
        if cfg.window is not None and cfg.window != window:
            raise LeopardError(f"{data}: windows are {window} bp long, --window asks "
                               f"{cfg.window}")
        if window % multiple:
            raise LeopardError(f"{data}: window length {window} is not divisible by "
                               f"{multiple}")
        return sources, window
    window = cfg.window if cfg.window is not None else 10240
    if window <= 0 or window % multiple:
        raise LeopardError(f"window length {window} is not divisible by {multiple}")
    m = load_manifest(data)
    sources = {s: _Source(load_chromosomes(m, m.chromosomes(s), need_avg=need_avg), None,
                          window, f"{m.path} ({s})") for s in ("train", "val", "test")}
    for s, src in sources.items():
        if src.n_distinct() == 0:
            raise LeopardError(f"{m.path}: no {s} chromosome is as long as the window "
                               f"({window} bp)")
    return sources, window


# ------------------------------------------------------------------------- checkpoints


def load_checkpoint(path: Path, arch: Any | None = None) -> dict[str, Any]:
    """Read a checkpoint; with ``arch``, refuse one saved for a different architecture."""
    import torch

    if not path.is_file():
        raise LeopardError(f"{path}: checkpoint not found")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise LeopardError(f"{path}: not a readable checkpoint ({type(exc).__name__})") from exc
    if not isinstance(ck, dict) or "arch" not in ck or "model" not in ck:
        raise LeopardError(f"{path}: not a Leopard checkpoint (no architecture recorded)")
    if arch is not None and ck["arch"] != arch.to_dict():
        diff = ", ".join(f"{k}={ck['arch'].get(k)} (wanted {v})"
                         for k, v in arch.to_dict().items() if ck["arch"].get(k) != v)
        raise LeopardError(f"{path}: checkpoint is for a different architecture: {diff}")
    return ck


def _save(obj: dict[str, Any], path: Path) -> None:
    import torch

    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


# ------------------------------------------------------------------------- helpers


def _setup_threads(cfg: TrainConfig, ctx: D.DistContext) -> None:
    import torch

    if ctx.device.type != "cpu":
        return
    if cfg.threads:
        n = cfg.threads
    elif os.environ.get("OMP_NUM_THREADS"):
        n = int(os.environ["OMP_NUM_THREADS"])
    else:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        n = max(1, (os.cpu_count() or 1) // local_world)
    torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # already set, or parallel work started
        torch.set_num_interop_threads(1)


def _masked_bce_sum(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor,
                                                                         torch.Tensor]:
    """Sum of BCE over labelled bases (label >= 0) and their count."""
    import torch.nn.functional as F

    mask = (labels >= 0).float()
    target = labels.clamp(min=0).float()
    loss = F.binary_cross_entropy_with_logits(logits.float(), target, weight=mask,
                                              reduction="sum")
    return loss, mask.sum()


class _Log:
    def __init__(self, ctx: D.DistContext, progress: bool | None) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, soft_wrap=True)
        self.main = ctx.is_main
        self.progress = ctx.is_main and (self.console.is_terminal if progress is None
                                         else progress)

    def __call__(self, msg: str) -> None:
        if self.main:
            self.console.print(msg, highlight=False)


# ------------------------------------------------------------------------- main


def train(cfg: TrainConfig) -> dict[str, float]:
    """Train (resuming if asked), evaluate the best weights, write results; return FOMs."""
    import torch

    from tunelab.leopard.metrics import MetricState
    from tunelab.leopard.model import Architecture, LeopardUNet, count_parameters
    from tunelab.leopard.runtime import choose_training_layout, has_cxx_compiler

    wall0 = time.perf_counter()
    ctx = D.init(cfg.device)
    try:
        _setup_threads(cfg, ctx)
        log = _Log(ctx, cfg.progress)
        arch = Architecture(in_channels=cfg.in_channels, base_filters=cfg.base_filters,
                            depth=cfg.depth, kernel_size=cfg.kernel_size)
        if cfg.batch_size < 1 or cfg.epochs < 1 or cfg.lr <= 0:
            raise LeopardError("batch size and epochs must be >= 1 and lr > 0")
        sources, window = _open_sources(cfg, arch.multiple)
        gb = cfg.batch_size * ctx.world
        train_src = sources["train"]
        if gb > train_src.n_distinct():
            raise LeopardError(
                f"{train_src.name}: batch size {cfg.batch_size} x {ctx.world} worker(s) = {gb} "
                f"is larger than the {train_src.n_distinct()} training windows")
        steps = cfg.steps_per_epoch or max(1, train_src.bases() // (window * gb))
        cuda = ctx.device.type == "cuda"
        amp = cuda if cfg.amp is None else cfg.amp
        amp_dtype = (torch.float16 if cuda and not torch.cuda.is_bf16_supported()
                     else torch.bfloat16)
        if amp and not cuda:
            from tunelab.leopard.runtime import bf16_capable, cpu_flags

            if not bf16_capable(cpu_flags()):
                log("warning: --amp on a CPU without native bf16 (no avx512_bf16/amx_bf16): "
                    "bf16 is emulated there and much slower than fp32")
        if cuda:
            torch.backends.cudnn.benchmark = True
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        torch.manual_seed(cfg.seed)
        model: torch.nn.Module = LeopardUNet(arch)
        counts = count_parameters(model)
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm1d):
                mod.momentum = cfg.bn_momentum
        if cfg.sync_bn:
            model = D.convert_sync_batchnorm(model, ctx)
        model.to(ctx.device)
        chosen_layout = "1d"
        if isinstance(model, LeopardUNet):
            layout, why = choose_training_layout(model, cfg.layout, cfg.batch_size, window,
                                                 amp_dtype if amp and not cuda else None,
                                                 compiled=cfg.compile and has_cxx_compiler())
            model.channels_last_training = layout == "2d"
            chosen_layout = layout
            log(f"training layout {layout}: {why}")
        net: torch.nn.Module = model
        if ctx.distributed:
            from torch.nn.parallel import DistributedDataParallel as DDP

            net = DDP(model, device_ids=[ctx.device.index] if cuda else None)
        if cfg.compile:
            net = _compiled(net, log)
        lr_target = D.scaled_lr(cfg.lr, ctx.world, cfg.lr_scaling)
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, eps=1e-7)
        scaler = torch.amp.GradScaler("cuda", enabled=amp and cuda and
                                      amp_dtype == torch.float16)
        out = Path(cfg.out)
        if ctx.is_main:
            out.mkdir(parents=True, exist_ok=True)

        start_epoch, history = 0, []
        best: dict[str, Any] = {"val_loss": math.inf, "epoch": -1, "state": None}
        wait, train_time = 0, 0.0
        last = out / "last.pt"
        if cfg.resume and last.is_file():
            ck = load_checkpoint(last, arch)
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["optimizer"])
            start_epoch, history = ck["epoch"] + 1, ck["history"]
            best = {"val_loss": ck["best_val_loss"], "epoch": ck["best_epoch"],
                    "state": ck["best_state"]}
            wait, train_time = ck["wait"], ck["train_time_s"]
            log(f"resuming from {last} after epoch {ck['epoch'] + 1}")
        stopped = start_epoch > 0 and wait >= cfg.patience

        eval_ids = {s: sources[s].eval_ids(cfg.max_eval_windows, cfg.seed)
                    for s in ("val", "test")}
        ebatch = max(cfg.batch_size, 1)

        def evaluate(split: str) -> dict[str, float]:
            model.eval()
            state = MetricState(ctx.device)
            ids = D.shard(eval_ids[split], ctx)
            with torch.no_grad():
                for i in range(0, len(ids), ebatch):
                    b = sources[split].get(ids[i:i + ebatch])
                    x = torch.from_numpy(build_inputs(b, cfg.in_channels)).to(ctx.device)
                    y = torch.from_numpy(b.label).to(ctx.device)
                    with torch.autocast(ctx.device.type, dtype=amp_dtype, enabled=amp):
                        logits = model(x)
                    state.update(logits, y)
            D.all_reduce_sum(state.state, ctx)
            return state.compute()

        n_local_windows, step_time = 0, 0.0
        for epoch in range(start_epoch, cfg.epochs):
            if stopped:
                break
            t_epoch = time.perf_counter()
            model.train()
            rng = np.random.default_rng([cfg.seed, epoch])
            plan = train_src.plan(steps * gb, rng)
            a = cfg.augment_scale
            scales = rng.uniform(1 - a, 1 + a, len(plan)) if a > 0 else None
            loss_sum = torch.zeros(2, dtype=torch.float64, device=ctx.device)
            prog = None
            if log.progress:
                from rich.progress import Progress

                prog = Progress(console=log.console, transient=True)
                prog.start()
                task = prog.add_task(f"epoch {epoch + 1}/{cfg.epochs}", total=steps)
            t_steps = time.perf_counter()
            batches = prefetch(_batches(train_src, plan, scales, steps, gb, ctx,
                                        cfg.in_channels), depth=2, name="leopard-loader")
            for s, (ids, xa, ya) in enumerate(batches):
                gstep = epoch * steps + s
                for g in opt.param_groups:
                    g["lr"] = D.lr_at(gstep, steps, cfg.warmup_epochs, cfg.lr, lr_target)
                x = torch.from_numpy(xa).to(ctx.device, non_blocking=True)
                y = torch.from_numpy(ya).to(ctx.device, non_blocking=True)
                with torch.autocast(ctx.device.type, dtype=amp_dtype, enabled=amp):
                    logits = net(x)
                lsum, cnt = _masked_bce_sum(logits, y)
                total = D.all_reduce_sum(cnt.detach().double().reshape(1).clone(), ctx)
                loss = lsum * (ctx.world / total.clamp_min(1.0).float())
                opt.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                loss_sum += torch.stack([lsum.detach().double(), cnt.detach().double()])
                n_local_windows += len(ids)
                if prog is not None:
                    prog.update(task, advance=1)
            if cuda:
                torch.cuda.synchronize()
            step_time += time.perf_counter() - t_steps
            if prog is not None:
                prog.stop()
            D.all_reduce_sum(loss_sum, ctx)
            val = evaluate("val")
            ep_time = time.perf_counter() - t_epoch
            train_time += ep_time
            row = {"epoch": epoch + 1, "train_loss": float(loss_sum[0] / loss_sum[1].clamp_min(1)),
                   "val_loss": val["loss"], "val_pr_auc": val["pr_auc"], "val_dice": val["dice"],
                   "val_iou": val["iou"], "lr": opt.param_groups[0]["lr"], "epoch_s": ep_time,
                   "windows_per_s": steps * gb / max(ep_time, 1e-9),
                   "train_time_s": train_time}
            history.append(row)
            improved = val["loss"] < best["val_loss"]
            if improved:
                best = {"val_loss": val["loss"], "epoch": epoch,
                        "state": copy.deepcopy(_plain_state(model))}
                wait = 0
            else:
                wait += 1
            if ctx.is_main:  # intermediate figures for a study's pruner (tunelab.search)
                print(json.dumps({"intermediate": {"epoch": epoch + 1, "val_pr_auc": val["pr_auc"],
                                                   "val_loss": val["loss"]}}), flush=True)
            log(f"epoch {epoch + 1}/{cfg.epochs}  loss {row['train_loss']:.4g}  val_loss "
                f"{val['loss']:.4g}  val_pr_auc {val['pr_auc']:.4f}  {row['windows_per_s']:.1f} "
                f"windows/s{'  *' if improved else ''}")
            if ctx.is_main:
                _save({"arch": arch.to_dict(), "window": window, "model": _plain_state(model),
                       "optimizer": opt.state_dict(), "epoch": epoch, "history": history,
                       "best_val_loss": best["val_loss"], "best_epoch": best["epoch"],
                       "best_state": best["state"], "wait": wait, "train_time_s": train_time,
                       "config": _jsonable(cfg)}, last)
                if improved:
                    _save({"arch": arch.to_dict(), "window": window, "model": best["state"],
                           "epoch": epoch},
                          out / "best.pt")
            if wait >= cfg.patience:
                log(f"early stop: val_loss has not improved for {cfg.patience} epochs")
                break
        if best["state"] is not None:
            model.load_state_dict(best["state"])
        val, test = evaluate("val"), evaluate("test")
        # throughput: windows of the training steps / the slowest worker's step time
        rates = torch.zeros(ctx.world, dtype=torch.float64, device=ctx.device)
        rates[ctx.rank] = n_local_windows / step_time if step_time > 0 else 0.0
        D.all_reduce_sum(rates, ctx)
        slowest = D.all_reduce_max(step_time, ctx)
        overall = n_local_windows * ctx.world / slowest if slowest > 0 else 0.0
        foms = {f"val_{k}": v for k, v in val.items() if k in ("pr_auc", "loss", "dice", "iou")}
        foms.update({f"test_{k}": v for k, v in test.items()
                     if k in ("pr_auc", "loss", "dice", "iou")})
        foms.update({
            "test_positive_fraction": test["positive_fraction"],
            "val_positive_fraction": val["positive_fraction"],
            "train_time_s": train_time,
            "windows_per_s": overall,
            "windows_per_s_per_worker": overall / ctx.world,
            "bp_per_s": overall * window,
            "epochs": float(len(history)),
            "best_epoch": float(best["epoch"] + 1),
            "world_size": float(ctx.world),
            "lr_effective": lr_target,
            "global_batch": float(gb),
            "window": float(window),
        })
        if ctx.is_main:
            _write_results(out, cfg, arch.to_dict(), counts, val, test, foms, history,
                           [float(r) for r in rates.cpu().tolist()], steps,
                           time.perf_counter() - wall0, chosen_layout)
        return foms
    finally:
        D.finish(ctx)


def _batches(src: _Source, plan: np.ndarray, scales: np.ndarray | None, steps: int, gb: int,
             ctx: D.DistContext, in_channels: int) -> Iterator[tuple[np.ndarray, np.ndarray,
                                                                     np.ndarray]]:
    """``(ids, inputs, labels)`` of this worker's share of every step (run by the loader
    thread, ahead of the model: gathering and encoding never stall a step)."""
    for s in range(steps):
        sl = slice(s * gb, (s + 1) * gb)
        ids = plan[sl][ctx.rank::ctx.world]
        sc = None if scales is None else scales[sl][ctx.rank::ctx.world]
        b = src.get(ids)
        yield ids, build_inputs(b, in_channels, sc), b.label


def _compiled(net: torch.nn.Module, log: _Log) -> torch.nn.Module:
    """``torch.compile(net)``, falling back to eager (logged) where Inductor cannot work."""
    import torch

    from tunelab.leopard.runtime import has_cxx_compiler

    if not has_cxx_compiler():
        log("warning: --compile needs a C++ compiler; training eagerly")
        return net
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True  # a graph that fails to compile runs eagerly
    log("compiling the model (torch.compile); the first step takes a while")
    return torch.compile(net)  # type: ignore[return-value]


def _plain_state(model: torch.nn.Module) -> dict[str, Any]:
    """The model's state dict with tensors cloned to CPU."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _jsonable(cfg: TrainConfig) -> dict[str, Any]:
    d = asdict(cfg)
    d["data"], d["out"] = str(cfg.data), str(cfg.out)
    return d


def _write_results(out: Path, cfg: TrainConfig, arch: dict[str, Any], counts: dict[str, int],
                   val: dict[str, float], test: dict[str, float], foms: dict[str, float],
                   history: list[dict[str, Any]], rates: list[float], steps: int,
                   wall: float, layout: str) -> None:
    doc = {"config": _jsonable(cfg), "architecture": arch, "parameters": counts,
           "training_layout": layout,
           "steps_per_epoch": steps, "val": val, "test": test, "foms": foms,
           "windows_per_s_by_worker": rates, "wall_s": wall, "history": history}
    (out / "metrics.json").write_text(json.dumps(doc, indent=2) + "\n")
    with (out / "history.csv").open("w", newline="") as fh:
        cols = ["epoch", "train_loss", "val_loss", "val_pr_auc", "val_dice", "val_iou", "lr",
                "epoch_s", "windows_per_s", "train_time_s"]
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for row in history:
            w.writerow({k: row[k] for k in cols})


def print_foms(foms: dict[str, float]) -> None:
    """The engine's contract: the last stdout line is one JSON object of FOMs."""
    sys.stdout.write(json.dumps({k: float(v) for k, v in foms.items()}, sort_keys=True) + "\n")
    sys.stdout.flush()
