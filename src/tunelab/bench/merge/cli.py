"""``tunelab bench merge`` and ``python -m tunelab.bench.merge``: the one option parser of the
merge benchmark."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated

import typer

from tunelab.console import PLAIN_HELP, usage_error_line
from tunelab.errors import TunelabError

__all__ = ["main_merge", "merge"]


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
        hidden=True,
        help="Testing: rank=R,phase=P,iteration=I,action=kill|hang|raise|corrupt|flip.")] = None,
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

            if rank is not None and worker_config is None:  # one worker started by hand
                from tunelab.bench.merge.config import check_memory
                from tunelab.bench.merge.worker import check_rank
                from tunelab.sysinfo import mem_available

                if not under_mpirun:
                    check_rank(cfg, rank, address_dir)
                check_memory(cfg, 1, mem_available())

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
    try:
        rc = single(standalone_mode=False)  # returns a typer.Exit's code instead of raising it
    except typer.exceptions.TyperException as exc:  # usage errors: one line, as tunelab's
        line = usage_error_line(exc)
        if line is None:
            raise
        print(f"merge: error: {line}", file=sys.stderr)
        sys.exit(int(getattr(exc, "exit_code", 2)))
    sys.exit(rc if isinstance(rc, int) else 0)
