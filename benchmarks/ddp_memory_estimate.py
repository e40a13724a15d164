"""The up-front memory estimate of ``tunelab bench ddp`` against its real peaks.

For each ``MODEL:SIZE:LOCAL_BATCH[:WORKERS]`` given, runs ``tunelab bench ddp`` (1 thread per
worker, 3 steps, 1 of them warm-up, ``--compute`` as given) in a child process of its own and
prints a table row with two comparisons (docs/workloads/ddp.md, "Memory"):

* one worker: the peak RSS of the worker with the most (the largest ``ru_maxrss`` of the
  processes it waited for: torchrun passes its children's on) against what the estimate
  gives one worker, its private bytes (:func:`tunelab.bench.ddp.memory.worker_bytes`) and the
  shared libraries' pages it maps;
* the job: the peak, over samples every 0.2 s, of the sum of the proportional set sizes
  (``Pss`` of ``/proc/PID/smaps_rollup``: a page shared by k processes counts 1/k in each, so
  the sum holds the shared libraries once) of the launcher and everything under it (torchrun,
  the workers, their data-loader processes), less the launcher's private memory (in use
  before the launcher reads what is available), with the shared memory counted as the sizes
  of the ``/dev/shm`` files the job holds open or maps (the loaders' read-ahead: batches a
  worker has not taken are in no process's ``Pss``), against
  :func:`tunelab.bench.ddp.memory.job_bytes`.

Each case runs in a fresh process, so one case's peak never hides another's.

Usage::

    python benchmarks/ddp_memory_estimate.py resnet18:112:8 resnet18:112:128 leopard:512:16
    python benchmarks/ddp_memory_estimate.py --compute emulate:0.2 resnet50:224:4:8
    python benchmarks/ddp_memory_estimate.py --compute emulate:0.5 --data files:DIR \
        --loaders 8 --prefetch 2 resnet18:224:128
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

_FIELDS = ("Pss", "Pss_Anon", "Pss_Shmem")


def _rollup(pid: int) -> dict[str, int]:
    """The ``_FIELDS`` of a process's ``smaps_rollup``, bytes; {} when it is gone."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in _FIELDS:
                    out[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return out


def _shm_files(pids: list[int]) -> int:
    """Bytes of the ``/dev/shm`` files that the processes ``pids`` hold open or map, each file
    once (a loader's batch waiting for its worker is in no process's ``Pss``)."""
    import os

    files: dict[tuple[int, int], int] = {}
    for pid in pids:
        paths = []
        try:
            paths += [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
                paths += [f"/proc/{pid}/map_files/{line.split()[0]}" for line in f
                          if "/dev/shm/" in line]
        except OSError:
            continue
        for path in paths:
            try:
                if not os.readlink(path).startswith("/dev/shm/"):
                    continue
                st = os.stat(path)
            except OSError:
                continue
            files[(st.st_dev, st.st_ino)] = st.st_size
    return sum(files.values())


def _job_peak(proc: subprocess.Popen[bytes]) -> int:
    """Until ``proc`` ends: the largest sum of Pss of ``proc`` and its descendants, less
    ``proc``'s own private (anonymous and shmem) part."""
    import psutil

    root = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            family = root.children(recursive=True)
        except psutil.Error:
            break
        own = _rollup(proc.pid)
        total = own.get("Pss", 0) - own.get("Pss_Anon", 0) - own.get("Pss_Shmem", 0)
        for p in family:  # shared memory once, below
            rollup = _rollup(p.pid)
            total += rollup.get("Pss", 0) - rollup.get("Pss_Shmem", 0)
        total += _shm_files([p.pid for p in family])
        peak = max(peak, total)
        time.sleep(0.2)
    proc.wait()
    return peak


def _case(model: str, size: int, batch: int, workers: int, compute: str,
          data: tuple[str, int, int]) -> str:
    """One table row (run in a child of its own: see :func:`main`); ``data``: ``--data``,
    ``--loader-workers``, ``--prefetch``."""
    from tunelab.bench.ddp.config import DDPConfig
    from tunelab.bench.ddp.data import check_dataset
    from tunelab.bench.ddp.memory import job_bytes, loader_bytes, runtime, worker_bytes

    resnet = model.startswith("resnet")
    kw = {"image_size": size} if resnet else {"window": size}
    source, n_loaders, prefetch = data
    cfg = DDPConfig(model=model, workers=workers, batch_size=batch * workers, compute=compute,
                    data=source, loader_workers=n_loaders, prefetch=prefetch, **kw).validate()
    index = check_dataset(cfg, "volumes" if model == "unet3d" else "images")
    one = worker_bytes(cfg) + runtime().shared
    loaders = loader_bytes(cfg, index)
    job = job_bytes(cfg, index=index)
    cmd = [sys.executable, "-m", "tunelab", "bench", "ddp", "--model", model,
           "--image-size" if resnet else "--window", str(size), "--workers", str(workers),
           "-b", str(batch * workers), "--steps", "3", "--warmup", "1", "--threads", "1",
           "--compute", compute, "--rendezvous-timeout", "900", "--data", source,
           "--loader-workers", str(n_loaders), "--prefetch", str(prefetch), "--cache", "keep"]
    row = f"| {model} | {size} | {batch} | {workers} | {compute} | {n_loaders}x{prefetch} |"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak_job = _job_peak(proc)
    if proc.returncode:
        return f"{row} failed ({proc.returncode}) | | | | |"
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return (f"{row} {peak / 1e9:.3f} | {one / 1e9:.3f} ({one / peak:.2f}x) | "
            f"{loaders / 1e9:.3f} | {peak_job / 1e9:.3f} | {job / 1e9:.3f} "
            f"({job / peak_job:.2f}x) |")


def main() -> None:
    """Print the table, one child process per case."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+", help="MODEL:SIZE:LOCAL_BATCH[:WORKERS]")
    ap.add_argument("--compute", default="real", help="real or emulate:SECONDS")
    ap.add_argument("--data", default="synthetic", help="--data of the runs (synthetic)")
    ap.add_argument("--loaders", type=int, default=2, help="--loader-workers (2)")
    ap.add_argument("--prefetch", type=int, default=2, help="--prefetch (2)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        model, size, batch, *rest = args.cases[0].split(":")
        print(_case(model, int(size), int(batch), int(rest[0]) if rest else 1, args.compute,
                    (args.data, args.loaders, args.prefetch)), flush=True)
        return
    print(f"--data {args.data}")
    print("| model | size | local batch | workers | compute | loaders x prefetch | worker peak "
          "RSS GB | worker estimate GB | its loaders' estimate GB | job peak GB | job estimate "
          "GB |")
    print("|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|", flush=True)
    for case in args.cases:
        subprocess.run([sys.executable, __file__, "--one", "--compute", args.compute, "--data",
                        args.data, "--loaders", str(args.loaders), "--prefetch",
                        str(args.prefetch), case], check=False)


if __name__ == "__main__":
    main()
