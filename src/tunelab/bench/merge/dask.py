"""The ``dask`` transport: the same merge as a ``dask.dataframe`` merge on a distributed cluster.

The N left and N right chunks (the same data as the other transports) are persisted on the
cluster once; each iteration runs ``left.merge(right, on="key", how="inner")`` with the chosen
shuffle (``tasks`` or ``p2p``) into N partitions and waits for it. Bandwidth comes from the
workers' own transfer logs, like dask-cuda's merge benchmark: per worker, bytes it sent to
other workers (``transfer_outgoing_log`` totals for ``tasks``; for ``p2p`` the shuffle's digests
``("p2p", id, "background-comms", "process", "bytes")``) ÷ the summed duration of those
transfers (``duration`` of the log entries; ``("p2p", …, "send", "seconds")``).
Dask's byte counts are of serialised pandas partitions (their index included), so they run
about 1.5× the 16 bytes per row the other transports count.
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any

from tunelab.bench.merge import data
from tunelab.bench.merge.comm import VerificationError, WorkerFailure
from tunelab.bench.merge.config import MergeConfig
from tunelab.bench.merge.metrics import WorkerIteration
from tunelab.bench.merge.worker import EXIT_FAILURE, EXIT_VERIFY, emit_report
from tunelab.errors import WorkloadError

__all__ = ["run_dask"]


def _left(rank: int, workers: int, chunk_size: int, seed: int) -> Any:
    import pandas as pd

    key, payload = data.left_chunk(rank, workers, chunk_size, seed)
    return pd.DataFrame({"key": key, "payload": payload})


def _right(rank: int, workers: int, chunk_size: int, frac: float, seed: int) -> Any:
    import pandas as pd

    key, payload = data.right_chunk(rank, workers, chunk_size, frac, seed)
    return pd.DataFrame({"key": key, "payload": payload})


def _expected_checksum(rank: int, workers: int, chunk_size: int, frac: float,
                       seed: int) -> int:
    key, payload = data.right_chunk(rank, workers, chunk_size, frac, seed)
    return data.expected_checksum(workers, chunk_size, seed, key, payload)


def _checksum(part: Any) -> int:
    return data.row_checksum(part["key"].to_numpy(), part["payload_left"].to_numpy(),
                             part["payload_right"].to_numpy())


def _clear_logs(dask_worker: Any) -> None:
    dask_worker.transfer_outgoing_log.clear()
    if hasattr(dask_worker.digests_total, "clear"):
        dask_worker.digests_total.clear()


def _sent(dask_worker: Any) -> tuple[float, float]:
    """(bytes sent to other workers, seconds spent sending) since the last clear."""
    total = sum(e["total"] for e in dask_worker.transfer_outgoing_log)
    seconds = sum(e["duration"] for e in dask_worker.transfer_outgoing_log)
    p2p_bytes = p2p_secs = 0.0
    for key, value in dict(dask_worker.digests_total).items():
        if isinstance(key, tuple) and len(key) == 5 and key[0] == "p2p" \
                and key[2] == "background-comms":
            if key[3:] == ("process", "bytes"):
                p2p_bytes += value
            elif key[3:] == ("send", "seconds"):
                p2p_secs += value
    return total + p2p_bytes, seconds + p2p_secs


def _client(cfg: MergeConfig) -> tuple[Any, Any]:
    from distributed import Client, LocalCluster

    if cfg.protocol == "ucxx" and importlib.util.find_spec("distributed_ucxx") is None:
        raise WorkloadError("--protocol ucxx needs distributed-ucxx; install it with "
                            "pip install 'tunelab[ucx]'")
    if cfg.scheduler or cfg.scheduler_file:
        client = Client(cfg.scheduler, scheduler_file=cfg.scheduler_file, timeout=cfg.timeout)
        return client, None
    cluster = LocalCluster(n_workers=cfg.workers, threads_per_worker=1, processes=True,
                           protocol=cfg.protocol if cfg.protocol == "ucxx" else "tcp://",
                           host="127.0.0.1", dashboard_address=None)
    return Client(cluster, timeout=cfg.timeout), cluster


def run_dask(cfg: MergeConfig) -> int:
    """Run the benchmark on a Dask cluster; print the report. Returns the exit status."""
    import sys

    import dask
    import dask.dataframe as dd
    from distributed import wait

    from tunelab.bench.merge.report import failure_line
    from tunelab.bench.merge.runner import compare_with_reference, reference_merge

    n = cfg.workers
    client, cluster = _client(cfg)
    where = "in phase generate"
    try:
        addresses = sorted(client.scheduler_info()["workers"])
        if len(addresses) != n:
            print(f"merge: note: the cluster has {len(addresses)} workers; the data has "
                  f"--workers {n} chunks", file=sys.stderr)
        left = dd.from_map(_left, range(n), workers=n, chunk_size=cfg.chunk_size,
                           seed=cfg.seed, enforce_metadata=False).persist()
        right = dd.from_map(_right, range(n), workers=n, chunk_size=cfg.chunk_size,
                            frac=cfg.frac_match, seed=cfg.seed,
                            enforce_metadata=False).persist()
        wait([left, right], timeout=cfg.timeout)
        expected = data.expected_matches(n, cfg.chunk_size, cfg.frac_match)
        reference = reference_merge(cfg, None) if cfg.full_verify else None
        want_sum = sum(dask.compute(*[
            dask.delayed(_expected_checksum)(r, n, cfg.chunk_size, cfg.frac_match, cfg.seed)
            for r in range(n)])) % (1 << 64)
        records: list[WorkerIteration] = []
        for it in range(cfg.total_iterations):
            where = f"in phase merge of iteration {it}"
            client.run(_clear_logs)
            t0 = time.perf_counter()
            merged = left.merge(right, on="key", how="inner", suffixes=("_left", "_right"),
                                npartitions=n, shuffle_method=cfg.dask_shuffle).persist()
            try:
                wait(merged, timeout=cfg.timeout)
            except TimeoutError:
                raise WorkerFailure(f"dask: the merge of iteration {it} did not finish within "
                                    f"{cfg.timeout:g} s") from None
            wall = time.perf_counter() - t0
            now = sorted(client.scheduler_info()["workers"])
            if now != addresses:
                lost = sorted(set(addresses) - set(now))
                raise WorkerFailure(f"dask: worker(s) {', '.join(lost) or '?'} left the cluster "
                                    f"during iteration {it} (phase merge)")
            sent = client.run(_sent)
            where = f"in phase verify of iteration {it}"
            rows = int(merged.map_partitions(len).compute().sum())
            if rows != expected:
                raise VerificationError(f"iteration {it}: the merge has {rows} rows in all, "
                                        f"expected {expected} matching keys")
            got_sum = sum(dask.compute(*[dask.delayed(_checksum)(p)
                                         for p in merged.to_delayed()])) % (1 << 64)
            if got_sum != want_sum:
                raise VerificationError(f"iteration {it}: the merged rows' checksum differs "
                                        "from the generated data's: a key or payload changed "
                                        "on the way")
            if reference is not None:
                problem = compare_with_reference(merged.compute(), reference)
                if problem:
                    raise VerificationError(f"iteration {it}: {problem}")
            for rank, addr in enumerate(addresses):
                nbytes, secs = sent.get(addr, (0.0, 0.0))
                records.append(WorkerIteration(
                    rank=rank, iteration=it - cfg.warmup, warmup=it < cfg.warmup, wall_s=wall,
                    exchange_left_s=secs, exchange_right_s=0.0, bytes_sent_left=int(nbytes),
                    bytes_sent_right=0, bytes_recv=0,
                    merged_rows=rows if rank == 0 else 0))
            del merged
        emit_report(cfg, records, extra_desc=f", {len(addresses)} dask workers",
                    dask_workers=len(addresses))
        return 0
    except VerificationError as exc:
        print(failure_line(cfg, str(exc)), flush=True)
        print(f"merge: verification failed: {exc}", file=sys.stderr)
        return EXIT_VERIFY
    except WorkerFailure as exc:
        print(f"merge: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as exc:  # dask's own failure (lost dependencies, a killed worker)
        text = " ".join(str(exc).split())
        print(f"merge: dask failed {where}: {type(exc).__name__}: "
              f"{text if len(text) <= 200 else text[:199] + '…'}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
