"""One worker process of the mpi, tcp or ucxx transport, and the shared report printing."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from tunelab.bench.merge import report
from tunelab.bench.merge.backend import get_backend
from tunelab.bench.merge.comm import Comm, VerificationError, WorkerFailure
from tunelab.bench.merge.config import MergeConfig
from tunelab.bench.merge.metrics import WorkerIteration, per_iteration, summarize
from tunelab.errors import WorkloadError

__all__ = ["EXIT_FAILURE", "EXIT_VERIFY", "emit_report", "make_comm", "verification_text",
           "worker_main"]

EXIT_VERIFY = 3
EXIT_FAILURE = 4


def make_comm(cfg: MergeConfig, rank: int | None, status_dir: str | None,
              address_dir: str | None) -> Comm:
    """The transport endpoint of this worker."""
    if cfg.transport == "mpi":
        from tunelab.bench.merge.mpi import MpiComm

        return MpiComm(cfg.timeout, status_dir=status_dir, fault=cfg.fault)
    rank, address_dir = check_rank(cfg, rank, address_dir)
    if cfg.transport == "tcp":
        from tunelab.bench.merge.tcp import TcpComm

        return TcpComm(rank, cfg.workers, cfg.timeout, address_dir, cfg.host,
                       status_dir=status_dir, fault=cfg.fault)
    from tunelab.bench.merge.ucxx import UcxxComm

    return UcxxComm(rank, cfg.workers, cfg.timeout, address_dir, cfg.host,
                    status_dir=status_dir, fault=cfg.fault)


def check_rank(cfg: MergeConfig, rank: int | None,
               address_dir: str | None) -> tuple[int, str]:
    """The rank and address directory of a tcp/ucxx worker, or :class:`WorkloadError`
    naming what is missing or wrong: such a worker needs ``--rank`` (0 to workers - 1) and
    ``--address-dir``; mpi ranks are started by mpirun, and Dask has no worker processes."""
    if cfg.transport not in ("tcp", "ucxx"):
        raise WorkloadError(f"--rank: only tcp and ucxx workers are started by hand, not "
                            f"--transport {cfg.transport}")
    if rank is None or address_dir is None:
        raise WorkloadError(f"--transport {cfg.transport}: a worker started by hand needs "
                            "--rank and --address-dir (a directory all workers can read)")
    if not 0 <= rank < cfg.workers:
        raise WorkloadError(f"--rank {rank} is not a worker of --workers {cfg.workers} "
                            f"(0 to {cfg.workers - 1})")
    return rank, address_dir


def verification_text(cfg: MergeConfig, rows: int) -> str:
    """How the result was checked, for the table."""
    text = f"passed every iteration: {rows} merged rows = matching keys, checksum matches"
    if cfg.full_verify:
        text += "; rows equal a single-process pandas merge"
    else:
        text += (f" (no row-by-row comparison: {cfg.workers}x{cfg.chunk_size} rows > "
                 "--verify-limit)")
    return text


def emit_report(cfg: MergeConfig, records: Sequence[WorkerIteration], extra_desc: str = "",
                **extra: Any) -> None:
    """Print the table and the JSON line for all workers' records."""
    if cfg.records:
        with open(cfg.records, "w") as fh:
            json.dump([r.to_dict() for r in records], fh)
    stats = per_iteration(records, cfg.chunk_size)
    summary = summarize(stats, cfg.workers, cfg.chunk_size)
    print(report.render_table(cfg, stats, summary, verification_text(cfg, summary.merged_rows),
                              extra_desc))
    print(report.fom_line(cfg, summary, **extra), flush=True)


def _abort(comm: Comm | None) -> None:
    """End every worker of the job (MPI_Abort) after this one reported its failure."""
    abort = getattr(comm, "abort", None)
    if abort is not None:
        abort(EXIT_FAILURE)


def worker_main(cfg: MergeConfig, rank: int | None, status_dir: str | None,
                address_dir: str | None) -> int:
    """Run one worker; rank 0 prints the report. Returns the process exit status."""
    from tunelab.bench.merge.runner import run_worker

    backend = get_backend(cfg.backend)
    comm: Comm | None = None
    try:
        comm = make_comm(cfg, rank, status_dir, address_dir)
        records = run_worker(comm, cfg, backend)
        if comm.rank == 0:
            emit_report(cfg, records)
        return 0
    except VerificationError as exc:
        if comm is None or comm.rank == 0:
            print(report.failure_line(cfg, str(exc)), flush=True)
            print(f"merge: verification failed: {exc}", file=sys.stderr, flush=True)
        return EXIT_VERIFY
    except WorkerFailure as exc:
        print(f"merge: {exc}", file=sys.stderr, flush=True)
        _abort(comm)
        return EXIT_FAILURE
    except Exception as exc:  # noqa: BLE001 - any other fault of this worker ends the job
        # Under mpirun a rank that merely exited left its peers waiting the whole --timeout,
        # which then blamed it for "not answering": name the fault and end every rank now.
        where = "" if comm is None else f" in phase {comm.phase}"
        if comm is not None and comm.iteration >= 0:
            where += f" of iteration {comm.iteration}"
        rank_text = "?" if comm is None else str(comm.rank)
        traceback.print_exc()
        print(f"merge: worker {rank_text} failed{where}: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
        _abort(comm)
        return EXIT_FAILURE
    finally:
        if comm is not None:
            comm.close()
