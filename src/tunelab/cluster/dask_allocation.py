"""``python -m tunelab.cluster.dask_allocation --scheduler-file F --workers W --nodes N --
DRIVER …``: a Dask cluster inside a batch allocation for the length of one command.

Starts ``dask scheduler`` on this (the first) node, listening on its address
(``TUNELAB_HEAD_ADDR`` when the job step set it), then ``srun`` of W single-threaded
``dask worker`` processes spread over N nodes, all finding the scheduler through the
scheduler file on the shared file system; waits until the W workers joined, runs DRIVER
(which connects with ``--scheduler-file F``), and stops workers and scheduler whatever
DRIVER did. The exit status is DRIVER's (or 1 when the cluster did not come up).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["main"]

_MAX_WORKERS = 100_000


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_workers(scheduler_file: Path, workers: int, timeout_s: float) -> None:
    from distributed import Client

    with Client(scheduler_file=str(scheduler_file), timeout=timeout_s) as client:
        client.wait_for_workers(workers, timeout=timeout_s)


def main(argv: list[str] | None = None) -> int:
    """Start the cluster, run the driver, stop the cluster; the driver's exit status."""
    parser = argparse.ArgumentParser(prog="python -m tunelab.cluster.dask_allocation")
    parser.add_argument("--scheduler-file", type=Path, required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("driver", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    driver = args.driver[1:] if args.driver[:1] == ["--"] else args.driver
    if not driver or not 1 <= args.workers <= _MAX_WORKERS or not 1 <= args.nodes <= \
            args.workers:
        parser.error("need a driver command, 1 <= workers, 1 <= nodes <= workers")
    args.scheduler_file.unlink(missing_ok=True)
    py = sys.executable
    host = os.environ.get("TUNELAB_HEAD_ADDR")
    scheduler = workers = None
    try:
        scheduler = subprocess.Popen(
            [py, "-m", "distributed.cli.dask_scheduler", "--scheduler-file",
             str(args.scheduler_file), "--no-dashboard", *(["--host", host] if host else [])],
            stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + args.timeout
        while not args.scheduler_file.exists():
            if scheduler.poll() is not None or time.monotonic() > deadline:
                print("dask_allocation: the scheduler did not start", file=sys.stderr)
                return 1
            time.sleep(0.1)
        workers = subprocess.Popen(
            ["srun", f"--nodes={args.nodes}", f"--ntasks={args.workers}", "--cpus-per-task=1",
             py, "-m", "distributed.cli.dask_worker", "--scheduler-file",
             str(args.scheduler_file), "--nthreads", "1", "--nworkers", "1", "--no-dashboard"],
            stdin=subprocess.DEVNULL)
        try:
            _wait_workers(args.scheduler_file, args.workers, args.timeout)
        except (OSError, TimeoutError) as exc:
            print(f"dask_allocation: {args.workers} workers did not join within "
                  f"{args.timeout:g} s ({exc})", file=sys.stderr)
            return 1
        return subprocess.run(driver, stdin=subprocess.DEVNULL).returncode
    finally:
        _stop(workers)
        _stop(scheduler)


if __name__ == "__main__":
    sys.exit(main())
