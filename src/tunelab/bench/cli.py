"""``tunelab bench …`` commands; ``python -m tunelab.bench.merge`` and ``python -m
tunelab.bench.ddp`` use the same parsers.

Mount with ``main_app.add_typer(tunelab.bench.cli.app, name="bench")``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any

import typer

from tunelab.errors import TunelabError

__all__ = ["app", "calibrate", "ddp", "ddp_app", "main_ddp", "main_merge", "make_data", "merge"]

# plain help: the same on a terminal, in a pipe, at any width
PLAIN_HELP: dict[str, Any] = {"rich_markup_mode": None,
                    "context_settings": {"help_option_names": ["-h", "--help"]}}

app = typer.Typer(help="Benchmark programs tunelab owns (run by hand or as study workloads).",
                  no_args_is_help=True, add_completion=False, **PLAIN_HELP)


@app.callback()
def _bench() -> None:
    """Benchmark programs tunelab owns."""


@app.command("merge")
def merge(
    workers: Annotated[int, typer.Option("--workers", "-n",
                                         help="Number of workers N (>= 2).")] = 2,
    chunk_size: Annotated[int, typer.Option("--chunk-size", "-c",
                                            help="Rows per chunk (left and right).")] = 100_000,
    iterations: Annotated[int, typer.Option("--iterations", "-i",
                                            help="Timed iterations.")] = 5,
    warmup: Annotated[int, typer.Option(help="Untimed warm-up iterations first.")] = 1,
    frac_match: Annotated[float, typer.Option(help="Share of right keys that match.")] = 0.3,
    seed: Annotated[int, typer.Option(help="Seed of the generated data.")] = 42,
    transport: Annotated[str, typer.Option("--transport", "-t",
                                           help="mpi | tcp | dask | ucxx")] = "tcp",
    backend: Annotated[str, typer.Option(help="pandas | cudf")] = "pandas",
    timeout: Annotated[float, typer.Option(
        help="Seconds a worker waits for a peer in one phase before it fails.")] = 60.0,
    verify: Annotated[str, typer.Option(
        help="auto | full | count: compare rows with a pandas merge (full), or only the "
             "row count; auto = full when workers x chunk-size <= --verify-limit")] = "auto",
    verify_limit: Annotated[int, typer.Option(help="Row limit of --verify auto.")] = 1_000_000,
    mpi_pml: Annotated[str, typer.Option(help="Open MPI PML: ob1 | ucx (UCX_* apply).")] = "ob1",
    mpirun: Annotated[str, typer.Option(help="The mpirun executable.")] = "mpirun",
    hostfile: Annotated[str | None, typer.Option(help="mpirun hostfile (several hosts).")] = None,
    mpi_arg: Annotated[list[str] | None, typer.Option(
        "--mpi-arg", help="Extra mpirun argument (repeat the option).")] = None,
    host: Annotated[str, typer.Option(
        help="tcp/ucxx: address this worker listens on and advertises.")] = "127.0.0.1",
    address_dir: Annotated[str | None, typer.Option(
        help="tcp/ucxx: rendezvous directory (shared file system for several hosts).")] = None,
    rank: Annotated[int | None, typer.Option(
        help="tcp/ucxx: run only worker RANK (start one per host by hand).")] = None,
    protocol: Annotated[str, typer.Option(help="dask: tcp | ucxx.")] = "tcp",
    scheduler: Annotated[str | None, typer.Option(
        help="dask: address of an existing scheduler (default: a LocalCluster).")] = None,
    scheduler_file: Annotated[str | None, typer.Option(
        help="dask: scheduler file of an existing cluster.")] = None,
    dask_shuffle: Annotated[str, typer.Option(help="dask: tasks | p2p.")] = "tasks",
    records: Annotated[str | None, typer.Option(
        help="Also write every worker's per-iteration measurements to this JSON file.")] = None,
    inject_fault: Annotated[str | None, typer.Option(
        hidden=True, help="Testing: rank=R,phase=P,iteration=I,action=kill|hang|corrupt.")] = None,
    worker_config: Annotated[str | None, typer.Option(hidden=True)] = None,
    status_dir: Annotated[str | None, typer.Option(hidden=True)] = None,
) -> None:
    """All-to-all dataframe merge: N workers hash-partition, exchange and merge their chunks.

    Prints a table and, last, one JSON line of figures of merit (bytes/s, seconds)."""
    from tunelab.bench.merge.config import MergeConfig, parse_fault

    try:
        if worker_config is not None:
            cfg = MergeConfig.from_dict(json.loads(worker_config)).validate()
        else:
            cfg = MergeConfig(
                workers=workers, chunk_size=chunk_size, iterations=iterations, warmup=warmup,
                frac_match=frac_match, seed=seed, transport=transport, backend=backend,
                timeout=timeout, verify=verify, verify_limit=verify_limit, mpi_pml=mpi_pml,
                mpirun=mpirun, hostfile=hostfile, mpi_args=tuple(mpi_arg or ()), host=host,
                address_dir=address_dir, protocol=protocol, scheduler=scheduler,
                scheduler_file=scheduler_file, dask_shuffle=dask_shuffle,
                records=records, fault=parse_fault(inject_fault),
            ).validate()
        under_mpirun = cfg.transport == "mpi" and "OMPI_COMM_WORLD_SIZE" in os.environ
        if worker_config is not None or rank is not None or under_mpirun:
            from tunelab.bench.merge.worker import worker_main

            code = worker_main(cfg, rank, status_dir, address_dir)
        else:
            from tunelab.bench.merge.launch import launch

            code = launch(cfg)
    except TunelabError as exc:
        print(f"merge: error: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


def main_merge() -> None:
    """Entry point of ``python -m tunelab.bench.merge``."""
    single = typer.Typer(add_completion=False, **PLAIN_HELP)
    single.command()(merge)
    single()


ddp_app = typer.Typer(invoke_without_command=True, add_completion=False, **PLAIN_HELP)
app.add_typer(ddp_app, name="ddp")


@ddp_app.callback()
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
    compute: Annotated[str, typer.Option(
        help="real, emulate:SECONDS (wait SECONDS per step instead of computing; gradients "
             "are still all-reduced for real) or emulate:MODEL/ACCELERATOR/bBATCH (a profile, "
             "e.g. emulate:resnet50/a100/b400).")] = "real",
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
        help="on: decode and crop samples | off: read the bytes only (MLPerf Storage's "
             "method).")] = "on",
    on_corrupt: Annotated[str, typer.Option(
        help="skip (count and name corrupt samples) | fail (stop naming the file).")] = "skip",
    device: Annotated[str, typer.Option(help="auto | cpu | cuda")] = "auto",
    backend: Annotated[str, typer.Option(help="auto | gloo | nccl")] = "auto",
    amp: Annotated[str, typer.Option(help="auto (on for CUDA) | on | off")] = "auto",
    threads: Annotated[int | None, typer.Option(
        help="Threads per worker (default: cores / workers).")] = None,
    bucket_mb: Annotated[float, typer.Option(help="DDP gradient bucket size, MiB.")] = 25.0,
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
                warmup=warmup, compute=compute, data=data, loader_workers=loader_workers,
                prefetch=prefetch, cache=cache, read_limit=read_limit, decode=decode,
                on_corrupt=on_corrupt, device=device, backend=backend, amp=amp,
                threads=threads, bucket_mb=bucket_mb, placement=placement,
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

            code = launch(cfg)
    except TunelabError as exc:
        print(f"ddp: error: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


@ddp_app.command("make-data")
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
        with _Progress("make-data", "samples") as bar:
            index = make_dataset(cfg, bar.update)
    except TunelabError as exc:
        print(f"ddp make-data: error: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    mean = index.bytes / max(1, index.samples)
    sys.stdout.write(f"{index.root}: {index.samples} samples ({index.layout}) in "
                     f"{len(index.entries)} files, {index.bytes / 1e6:,.1f} MB, mean "
                     f"{mean / 1e3:,.1f} kB ({mean / 1024:,.1f} KiB) per sample\n")


@ddp_app.command("calibrate")
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


class _Progress:
    """A progress bar on a terminal (standard error), else a line every 10 %."""

    def __init__(self, what: str, unit: str) -> None:
        self.what = what
        self.unit = unit
        self._bar: Any = None
        self._task: Any = None
        self._shown = -1

    def __enter__(self) -> _Progress:
        from tunelab.report.output import is_terminal

        if is_terminal(sys.stderr):
            from rich.console import Console
            from rich.progress import Progress

            self._bar = Progress(console=Console(file=sys.stderr), transient=False)
            self._bar.start()
        return self

    def update(self, done: int, total: int) -> None:
        if self._bar is not None:
            if self._task is None:
                self._task = self._bar.add_task(self.what, total=total)
            self._bar.update(self._task, completed=done)
            return
        tenth = done * 10 // max(1, total)
        if tenth != self._shown:
            self._shown = tenth
            from tunelab.report.output import message

            message(f"{self.what}: {done}/{total} {self.unit} ({100 * done // max(1, total)}%)")

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


def main_ddp() -> None:
    """Entry point of ``python -m tunelab.bench.ddp`` (the same commands)."""
    ddp_app()
