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

The set-up (configuration, data, model, optimiser, precision, compile) is in
:mod:`tunelab.leopard.trainsetup`; this module runs the loop, checkpoints and writes results.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tunelab.leopard import distributed as D
from tunelab.leopard.data import build_inputs
from tunelab.leopard.errors import LeopardError
from tunelab.leopard.prefetch import prefetch
from tunelab.leopard.trainsetup import TrainConfig, WindowSource, prepare_training
from tunelab.leopard.trainstep import restore_lr_kind, set_lr

if TYPE_CHECKING:
    import torch

    from tunelab.leopard.bound import Bound

__all__ = ["TrainConfig", "load_checkpoint", "train"]

#: evaluation batch on a GPU (at least): fewer, fuller forward passes
CUDA_EVAL_BATCH = 256

FOM_KEYS = ("val_pr_auc", "val_loss", "val_dice", "val_iou", "test_pr_auc", "test_loss",
            "test_dice", "test_iou", "test_positive_fraction", "train_time_s",
            "windows_per_s", "windows_per_s_per_worker", "epochs", "best_epoch",
            "world_size", "lr_effective", "global_batch")


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


# ------------------------------------------------------------------------- main


def train(cfg: TrainConfig) -> dict[str, float]:
    """Train (resuming if asked), evaluate the best weights, write results; return FOMs."""
    import torch

    from tunelab.leopard.bound import measure_bound
    from tunelab.leopard.metrics import MetricState
    from tunelab.leopard.model import flops_per_window

    wall0 = time.perf_counter()
    ctx = D.init(cfg.device)
    try:
        st = prepare_training(cfg, ctx)
        # windows/s beside the GEMM rate of this run (a CPU's; benchmarks/leopard_gpu.py
        # measures a GPU's)
        bound = None if st.cuda else _all_workers(measure_bound(
            "bf16" if st.amp and st.amp_dtype == torch.bfloat16 else "fp32",
            flops_per_window(st.arch, st.window)), ctx)
        if bound is not None:
            st.log(f"bound: {bound.describe()}")
        # where the wall time goes: set-up (data, model, the runtime probe), the steps,
        # validation, checkpoints, the final evaluation
        phases = {"setup_s": time.perf_counter() - wall0, "steps_s": 0.0, "validation_s": 0.0,
                  "checkpoints_s": 0.0, "final_evaluation_s": 0.0}
        log, arch, sources, window = st.log, st.arch, st.sources, st.window
        gb, steps, cuda, model, opt = st.global_batch, st.steps, st.cuda, st.model, st.opt
        train_src, lr_target, out = sources["train"], st.lr_target, st.out
        counts, chosen_layout = st.counts, st.layout
        step, forward, feeds = st.step, st.forward, st.feeds

        start_epoch, history = 0, []
        best: dict[str, Any] = {"val_loss": math.inf, "epoch": -1, "state": None}
        wait, train_time = 0, 0.0
        last = out / "last.pt"
        if cfg.resume and last.is_file():
            ck = load_checkpoint(last, arch)
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["optimizer"])
            restore_lr_kind(opt, ctx.device, step.graph)
            start_epoch, history = ck["epoch"] + 1, ck["history"]
            best = {"val_loss": ck["best_val_loss"], "epoch": ck["best_epoch"],
                    "state": ck["best_state"]}
            wait, train_time = ck["wait"], ck["train_time_s"]
            log(f"resuming from {last} after epoch {ck['epoch'] + 1}")
        stopped = start_epoch > 0 and wait >= cfg.patience

        eval_ids = {"val": sources["val"].eval_ids(cfg.max_eval_windows, cfg.seed,
                                                   cfg.val_windows),
                    "test": sources["test"].eval_ids(cfg.max_eval_windows, cfg.seed)}
        for split, ids in eval_ids.items():  # (PR-AUC of windows without a bound base:
            sources[split].check_labels(split, ids)  # undefined, never a 0 to rank by)
        # on a GPU larger evaluation batches (of one shape, for a captured forward pass)
        ebatch = max(cfg.batch_size, CUDA_EVAL_BATCH if cuda else 1)

        def evaluate(split: str) -> dict[str, float]:
            model.eval()
            state = MetricState(ctx.device)
            ids = D.shard(eval_ids[split], ctx)
            if feeds is not None:
                for x, y in feeds[split].eval_batches(ids, ebatch):
                    state.update(forward(x), y)
            else:
                for i in range(0, len(ids), ebatch):
                    b = sources[split].get(ids[i:i + ebatch])
                    x = torch.from_numpy(build_inputs(b, cfg.in_channels)).to(ctx.device)
                    state.update(forward(x), torch.from_numpy(b.label).to(ctx.device))
            D.all_reduce_sum(state.state, ctx)
            return state.compute()

        n_local_windows, step_time = 0, 0.0
        lr_now: float | None = None
        deadline = wall0 + cfg.time_limit if cfg.time_limit else None
        out_of_time = False
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
            batches = (feeds["train"].batches(plan, scales, steps, gb, ctx.rank, ctx.world)
                       if feeds is not None else _host_batches(train_src, plan, scales, steps,
                                                               gb, ctx, cfg.in_channels))
            done = 0
            for s, (x, y) in enumerate(batches):
                if deadline is not None and time.perf_counter() > deadline:
                    out_of_time = True  # (the host's clock: no sync)
                    break
                rate = D.lr_at(epoch * steps + s, steps, cfg.warmup_epochs, cfg.lr, lr_target)
                if rate != lr_now:  # (a tensor rate is written on the device: no sync)
                    set_lr(opt, rate)
                    lr_now = rate
                lsum, cnt = step(x, y)  # device tensors: nothing is read back in an epoch
                loss_sum += torch.stack([lsum.double(), cnt.double()])
                n_local_windows += len(x)
                done = s + 1
                if prog is not None:
                    prog.update(task, advance=1)
            del batches  # (a loader left early stops here)
            if step.fallback and epoch == start_epoch:
                log(f"warning: {step.fallback}")
            if cuda:
                torch.cuda.synchronize()
            epoch_steps_s = time.perf_counter() - t_steps
            step_time += epoch_steps_s
            if prog is not None:
                prog.stop()
            D.all_reduce_sum(loss_sum, ctx)
            t_val = time.perf_counter()
            val = evaluate("val")
            phases["validation_s"] += time.perf_counter() - t_val
            ep_time = time.perf_counter() - t_epoch
            train_time += ep_time
            row = {"epoch": epoch + 1, "train_loss": float(loss_sum[0] / loss_sum[1].clamp_min(1)),
                   "val_loss": val["loss"], "val_pr_auc": val["pr_auc"], "val_dice": val["dice"],
                   "val_iou": val["iou"], "lr": float(opt.param_groups[0]["lr"]),
                   "epoch_s": ep_time,
                   "windows_per_s": done * gb / max(ep_time, 1e-9),
                   "step_windows_per_s": done * gb / max(epoch_steps_s, 1e-9),
                   "steps": done, "train_time_s": train_time}
            if bound is not None:
                row["bound_fraction"] = bound.fraction(row["windows_per_s"])
            history.append(row)
            improved = val["loss"] < best["val_loss"]
            if improved:
                best = {"val_loss": val["loss"], "epoch": epoch,
                        "state": copy.deepcopy(_plain_state(model)), "val": val}
                wait = 0
            else:
                wait += 1
            if ctx.is_main:  # intermediate figures for a study's pruner (tunelab.search)
                print(json.dumps({"intermediate": {"epoch": epoch + 1, "val_pr_auc": val["pr_auc"],
                                                   "val_loss": val["loss"]}}), flush=True)
            beside = f" ({bound.beside(row['windows_per_s'])})" if bound else ""
            log(f"epoch {epoch + 1}/{cfg.epochs}  loss {row['train_loss']:.4g}  val_loss "
                f"{val['loss']:.4g}  val_pr_auc {val['pr_auc']:.4f}  {row['windows_per_s']:.1f} "
                f"windows/s{beside}{'  *' if improved else ''}")
            t_save = time.perf_counter()
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
            phases["checkpoints_s"] += time.perf_counter() - t_save
            if wait >= cfg.patience:
                log(f"early stop: val_loss has not improved for {cfg.patience} epochs")
                break
            if out_of_time:
                log(f"time limit ({cfg.time_limit:g} s) reached after {done} of {steps} steps "
                    f"of epoch {epoch + 1}")
                break
        t_final = time.perf_counter()
        if best["state"] is not None:
            model.load_state_dict(best["state"])
        # the best epoch's validation was of this very state: not run again
        val = best.get("val") or evaluate("val")
        test = evaluate("test")
        phases["final_evaluation_s"] = time.perf_counter() - t_final
        phases["steps_s"] = step_time
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
            # the work of a window and the arithmetic it ran in, for the fraction of bound
            "flops_per_window": (bound.flops_per_window if bound is not None
                                 else flops_per_window(arch, window)),
            "cuda": float(cuda), "amp": float(st.amp),
            "amp_bf16": float(st.amp and st.amp_dtype == torch.bfloat16),
        })
        if not cuda:  # the threads the steps ran with (not the machine's core count)
            foms["cpu_threads"] = float(torch.get_num_threads())
        if bound is not None:
            bound = bound.remeasured(together=lambda now: _all_workers(now, ctx))
            foms["gemm_flops_per_s"] = bound.flops_per_s
            foms["bound_fraction"] = bound.fraction(overall)
            gflops = overall * bound.flops_per_window / 1e9
            log(f"training: {overall:.1f} windows/s ({bound.beside(overall)}: {gflops:,.1f} "
                f"of {bound.flops_per_s / 1e9:,.1f} GFLOP/s {bound.precision})")
        if ctx.is_main:
            _write_results(out, cfg, arch.to_dict(), counts, val, test, foms, history,
                           [float(r) for r in rates.cpu().tolist()], steps,
                           time.perf_counter() - wall0, chosen_layout,
                           st.runtime + (f"; {step.fallback}" if step.fallback else ""),
                           phases)
        return foms
    finally:
        D.finish(ctx)


def _all_workers(bound: Bound, ctx: D.DistContext) -> Bound:
    """The bound of all workers together: their GEMM rates, measured at the same moment
    (the windows/s it is put beside are every worker's)."""
    import torch

    if ctx.world == 1:
        return bound
    total = torch.tensor([bound.flops_per_s], dtype=torch.float64, device=ctx.device)
    D.all_reduce_sum(total, ctx)
    return dataclasses.replace(bound, flops_per_s=float(total[0]), workers=ctx.world)


def _host_batches(src: WindowSource, plan: np.ndarray, scales: np.ndarray | None, steps: int,
                  gb: int, ctx: D.DistContext, in_channels: int
                  ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(inputs, labels)`` of this worker's share of every step, gathered and encoded by
    numpy in a loader thread two steps ahead of the model (the CPU's path)."""
    import torch

    made = prefetch(numpy_batches(src, plan, scales, steps, gb, ctx.rank, ctx.world,
                                  in_channels), depth=2, name="leopard-loader")
    for xa, ya in made:
        yield (torch.from_numpy(xa).to(ctx.device, non_blocking=True),
               torch.from_numpy(ya).to(ctx.device, non_blocking=True))


def numpy_batches(src: WindowSource, plan: np.ndarray, scales: np.ndarray | None, steps: int,
                  gb: int, rank: int, world: int, in_channels: int
                  ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(inputs, labels)`` arrays of worker ``rank``'s share of every step: the numpy path
    (:class:`~tunelab.leopard.devicedata.DeviceWindows` makes the same on a device)."""
    for s in range(steps):
        sl = slice(s * gb, (s + 1) * gb)
        ids = plan[sl][rank::world]
        sc = None if scales is None else scales[sl][rank::world]
        b = src.get(ids)
        yield build_inputs(b, in_channels, sc), b.label


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
                   wall: float, layout: str, runtime: str, phases: dict[str, float]) -> None:
    doc = {"config": _jsonable(cfg), "architecture": arch, "parameters": counts,
           "training_layout": layout, "runtime": runtime,
           "steps_per_epoch": steps, "val": val, "test": test, "foms": foms,
           "windows_per_s_by_worker": rates, "wall_s": wall, "phases": phases,
           "history": history}
    (out / "metrics.json").write_text(json.dumps(doc, indent=2) + "\n")
    with (out / "history.csv").open("w", newline="") as fh:
        cols = ["epoch", "train_loss", "val_loss", "val_pr_auc", "val_dice", "val_iou", "lr",
                "epoch_s", "windows_per_s", "train_time_s", "steps", "step_windows_per_s",
                "bound_fraction"]
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for row in history:  # (rows of a run resumed from an older checkpoint lack the last)
            w.writerow({k: row.get(k, "") for k in cols})


def print_foms(foms: dict[str, float]) -> None:
    """The engine's contract: the last stdout line is one JSON object of FOMs."""
    sys.stdout.write(json.dumps({k: float(v) for k, v in foms.items()}, sort_keys=True) + "\n")
    sys.stdout.flush()
