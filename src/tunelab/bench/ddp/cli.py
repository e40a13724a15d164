"""``tunelab bench ddp …`` and ``python -m tunelab.bench.ddp``: the one option parser of the
DDP training benchmark and its subcommands (make-data, calibrate)."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Annotated

import typer

from tunelab.console import PLAIN_HELP, TaskProgress
from tunelab.errors import TunelabError

__all__ = ["app", "calibrate", "ddp", "main_ddp", "make_data"]

app = typer.Typer(invoke_without_command=True, add_completion=False, **PLAIN_HELP)


@app.callback()
def ddp(
    ctx: typer.Context,
    model: Annotated[str, typer.Option(help="resnet18 | resnet50 | leopard | unet3d")
                     ] = "resnet50",
    workers: Annotated[int, typer.Option("--workers", "-n", help="Workers in all.")] = 1,
    nodes: Annotated[int, typer.Option(help="Nodes; workers are spread evenly.")] = 1,
    batch_size: Annotated[int, typer.Option(
        "--batch-size", "-b", help="Global batch (divided evenly among the workers).")] = 64,
    steps: Annotated[int, typer.Option("--steps", "-s", help="Timed steps.")] = 10,
    warmup: Annotated[int, typer.Option(help="Untimed steps first.")] = 2,
    max_warmup: Annotated[int | None, typer.Option(
        help="At most this many untimed steps: the warm-up goes on until the loaders' "
             "read-ahead has drained or keeps pace (default: --warmup + 10 x loaders x "
             "prefetch; --max-warmup 0: a fixed warm-up).")] = None,
    compute: Annotated[str, typer.Option(
        help="real, emulate:SECONDS (wait SECONDS per step instead of computing) or "
             "emulate:MODEL/ACCELERATOR/bBATCH (a profile, e.g. "
             "emulate:resnet50/a100/b400).")] = "real",
    image_size: Annotated[int, typer.Option(help="ResNet input height and width.")] = 224,
    window: Annotated[int, typer.Option(help="Leopard window length (multiple of 32).")] = 2048,
    patch: Annotated[int, typer.Option(help="unet3d: edge of the cubic training patch.")] = 128,
    data: Annotated[str, typer.Option(
        help="synthetic | memory | memory:DIR | files:DIR (a dataset from make-data, an "
             "ImageNet-style JPEG folder, tar shards or .npz volumes).")] = "synthetic",
    loader_workers: Annotated[int, typer.Option(
        help="Data-loader processes per worker (0: load in the worker).")] = 2,
    prefetch: Annotated[int, typer.Option(
        help="Batches each loader process prepares ahead.")] = 2,
    cache: Annotated[str, typer.Option(
        help="files: cold (drop the dataset's pages before every epoch) | warm (read it "
             "once first) | keep (as found).")] = "cold",
    read_limit: Annotated[str | None, typer.Option(
        help="files: limit reads from the dataset's disk, e.g. 200MB/s (cgroup io/blkio "
             "throttle; root).")] = None,
    decode: Annotated[str, typer.Option(
        help="on: decode and crop samples in the loaders | off: read the bytes only (MLPerf "
             "Storage's method) | gpu: loaders read bytes, nvJPEG decodes on the GPU.")] = "on",
    on_corrupt: Annotated[str, typer.Option(
        help="skip (count and name corrupt samples) | fail (stop naming the file).")] = "skip",
    device: Annotated[str, typer.Option(help="auto | cpu | cuda")] = "auto",
    backend: Annotated[str, typer.Option(help="auto | gloo | nccl")] = "auto",
    amp: Annotated[str, typer.Option(help="auto (on for CUDA) | on | off")] = "auto",
    threads: Annotated[int | None, typer.Option(
        help="Threads per worker (default: cores / workers).")] = None,
    bucket_mb: Annotated[float, typer.Option(help="DDP gradient bucket size, MiB.")] = 25.0,
    allreduce: Annotated[str, typer.Option(
        help="auto | emulate (the fabric's ring all-reduce time, overlapped with the backward "
             "part; the default under emulated compute) | real (gloo/NCCL; the default with "
             "real compute) | off. One worker never all-reduces.")] = "auto",
    fabric: Annotated[str, typer.Option(
        help="--allreduce emulate: whose fabric (v100 | a100 | h100 | b200; auto: the "
             "profile's accelerator, else h100).")] = "auto",
    placement: Annotated[str, typer.Option(
        help="local (nodes on this host) | vnodes (virtual nodes; root)")] = "local",
    link_gbit: Annotated[float, typer.Option(
        help="vnodes: bandwidth limit of each node's link, Gbit/s (0: none).")] = 0.0,
    timeout: Annotated[float, typer.Option(
        help="Seconds a collective may wait for a peer before the run fails.")] = 120.0,
    rendezvous_timeout: Annotated[float, typer.Option(
        help="Seconds for every worker to join.")] = 180.0,
    port: Annotated[int, typer.Option(help="Rendezvous port (0: a free one).")] = 0,
    seed: Annotated[int, typer.Option(help="Seed of the data (synthetic, order).")] = 0,
    inject_fault: Annotated[str | None, typer.Option(
        hidden=True, help="Testing: rank=R,step=S,action=kill|kill-loader | "
                          "node=I,action=absent.")] = None,
    worker_config: Annotated[str | None, typer.Option(hidden=True)] = None,
    status_dir: Annotated[str | None, typer.Option(hidden=True)] = None,
    result_file: Annotated[str | None, typer.Option(hidden=True)] = None,
) -> None:
    """Data-parallel training throughput (PyTorch DDP) for a layout nodes x workers per node.

    Prints a table and, last, one JSON line of figures of merit (samples/s, seconds per step
    split into data wait, compute and all-reduce, accelerator utilisation, storage reads,
    gradient bytes, all-reduce bandwidth). Subcommands: make-data (a dataset), calibrate
    (an accelerator profile of the device at hand)."""
    if ctx.invoked_subcommand is not None:
        return
    from tunelab.bench.ddp.config import DDPConfig, parse_fault

    try:
        if worker_config is not None:
            cfg = DDPConfig.from_dict(json.loads(worker_config)).validate()
        else:
            cfg = DDPConfig(
                model=model, image_size=image_size, window=window, patch=patch,
                batch_size=batch_size, workers=workers, nodes=nodes, steps=steps,
                warmup=warmup, max_warmup=max_warmup, compute=compute, data=data,
                loader_workers=loader_workers,
                prefetch=prefetch, cache=cache, read_limit=read_limit, decode=decode,
                on_corrupt=on_corrupt, device=device, backend=backend, amp=amp,
                threads=threads, bucket_mb=bucket_mb, allreduce=allreduce, fabric=fabric,
                placement=placement,
                link_gbit=link_gbit, timeout=timeout, rendezvous_timeout=rendezvous_timeout,
                port=port, seed=seed, fault=parse_fault(inject_fault),
            ).validate()
        if cfg.model in ("resnet18", "resnet50") or cfg.data_spec.path:
            from tunelab.bench.ddp.models import import_torchvision

            import_torchvision()  # fail here, once, not in every worker
        under_torchrun = "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ
        if worker_config is not None or under_torchrun:
            from tunelab.bench.ddp.worker import worker_main

            code = worker_main(cfg, status_dir, result_file)
            # leave at once: torch's teardown of a gloo group can block after the results
            # are written, and torchrun reads only the exit status
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        else:
            from tunelab.bench.ddp.launch import launch

            # a study ends a run with SIGTERM: unwind, so that the workers (their own
            # session), the virtual nodes, the read limit's cgroup and the scratch go too
            signal.signal(signal.SIGTERM, _interrupt)
            code = launch(cfg)
    except TunelabError as exc:
        print(f"ddp: error: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        print("ddp: interrupted; the workers were stopped and what the run set up removed",
              file=sys.stderr)
        raise typer.Exit(130) from None
    raise typer.Exit(code)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@app.command("make-data")
def make_data(
    directory: Annotated[str, typer.Argument(help="New (or empty) directory to write.",
                                             show_default=False)],
    like: Annotated[str, typer.Option(help="imagenet (JPEGs, ~112 KiB) | unet3d (.npz "
                                           "volumes, ~140 MiB).")] = "imagenet",
    samples: Annotated[int, typer.Option(help="Number of samples.")] = 1000,
    layout: Annotated[str | None, typer.Option(
        help="imagenet: folder (class directories of JPEGs) | shards (tar files); unet3d: "
             "npz.")] = None,
    shard_samples: Annotated[int, typer.Option(help="Samples per tar shard.")] = 1251,
    classes: Annotated[int, typer.Option(help="imagenet: class directories.")] = 1000,
    seed: Annotated[int, typer.Option(help="Seed: the same seed makes the same files.")] = 0,
    jobs: Annotated[int, typer.Option(help="Processes (0: one per core).")] = 0,
    sample_scale: Annotated[float, typer.Option(
        help="Shrink every sample by this factor (tests only; the real sizes are the "
             "point).")] = 1.0,
) -> None:
    """Write a seeded dataset whose samples weigh what ImageNet's or KiTS19's do."""
    from tunelab.bench.ddp.makedata import MakeDataConfig, make_dataset

    try:
        cfg = MakeDataConfig(directory, like, samples,
                             layout or ("npz" if like == "unet3d" else "folder"), seed,
                             classes, shard_samples, sample_scale, jobs).validate()
        with TaskProgress("make-data", "samples") as bar:
            index = make_dataset(cfg, bar.update)
    except TunelabError as exc:
        print(f"ddp make-data: error: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    mean = index.bytes / max(1, index.samples)
    sys.stdout.write(f"{index.root}: {index.samples} samples ({index.layout}) in "
                     f"{len(index.entries)} files, {index.bytes / 1e6:,.1f} MB, mean "
                     f"{mean / 1e3:,.1f} kB ({mean / 1024:,.1f} KiB) per sample\n")


@app.command("calibrate")
def calibrate(
    model: Annotated[str, typer.Option(help="resnet18 | resnet50 | unet3d | leopard")
                     ] = "resnet50",
    batch: Annotated[int, typer.Option(help="Samples per step.")] = 32,
    steps: Annotated[int, typer.Option(help="Timed steps (the median is kept).")] = 5,
    warmup: Annotated[int, typer.Option(help="Untimed steps first.")] = 2,
    image_size: Annotated[int, typer.Option(help="ResNet input size.")] = 224,
    patch: Annotated[int, typer.Option(help="unet3d patch edge.")] = 128,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda")] = "auto",
    amp: Annotated[str, typer.Option(help="auto (on for CUDA) | on | off")] = "auto",
    name: Annotated[str | None, typer.Option(
        help="Accelerator name in the profile (default: cpu, or the GPU's name).")] = None,
    output: Annotated[str | None, typer.Option(
        help="Profile table to write (default: $TUNELAB_ACCELERATORS or "
             "~/.config/tunelab/accelerators.yaml).")] = None,
) -> None:
    """Time real training steps on the device at hand; write an accelerator profile entry
    for --compute emulate:MODEL/NAME/bBATCH."""
    from pathlib import Path

    from tunelab.bench.ddp.calibrate import calibrate_device

    try:
        profile, path = calibrate_device(model=model, batch=batch, steps=steps, warmup=warmup,
                                         image_size=image_size, patch=patch, device=device,
                                         amp=amp, name=name,
                                         output=Path(output) if output else None)
    except TunelabError as exc:
        print(f"ddp calibrate: error: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    sys.stdout.write(f"{profile.name}: {profile.step_s:.4f} s per step ({profile.kind}; "
                     f"{profile.source}) -> {path}\n"
                     f"use it with --compute emulate:{profile.name}\n")


def main_ddp() -> None:
    """Entry point of ``python -m tunelab.bench.ddp`` (the same commands)."""
    app()
