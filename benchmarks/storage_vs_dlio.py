#!/usr/bin/env python3
"""tunelab's storage benchmark against DLIO 2.0.0 (MLPerf Storage's engine), in one run.

Both tools read a dataset of the same shape — ``--samples`` samples of tunelab's ImageNet-like
size (JPEG files for tunelab; DLIO's own TFRecords of the same sample count and mean sample
bytes, its resnet50 workload's format) — one after the other, with the same emulated steps
(``--compute``, seconds), the same readers per process (``--readers``: tunelab's loader
processes, DLIO's read threads), the same batch per process, 1 and 2 processes, page cache
warm (read once before) and cold (dropped before the run; root), alternating tool by tool in
every round so a busy moment of the machine hits both. ResNet-50 for both, bytes only
(``--decode off``: MLPerf Storage's method, DLIO decodes nothing either).

Per run it prints **AU** as both define it (emulated compute / time: tunelab's ``au``, DLIO's
``train_au_mean_percentage``), samples/s, MB/s (10^6 bytes/s: samples/s x mean sample bytes,
both tools), and **bytes read / counted**: what the kernel counted (``rchar`` of the reading
processes) over what the tool says it read (tunelab: its ``io_check``; DLIO: samples x
record length, the basis of its MB/s — its reads are counted from ``/proc/self/io`` of each
rank around its main function, the imports done before). Then tunelab / DLIO ratios.

    bash scripts/dlio-venv.sh
    .venv/bin/python benchmarks/storage_vs_dlio.py --dlio-venv ~/.cache/tunelab/dlio-venv

Without ``--dlio-venv`` (or where DLIO cannot run) the DLIO rows are skipped with the reason
and tunelab's side still runs. Root is needed for cold runs (``/proc/sys/vm/drop_caches``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: run by the DLIO venv's python under mpirun: DLIO's main with this rank's rchar around it
DLIO_RANK = """
import json, os, sys
import tensorflow, dlio_benchmark.main as m  # imports first: their reads are not the data's
def rchar():
    for line in open('/proc/self/io'):
        if line.startswith('rchar:'):
            return int(line.split()[1])
r0 = rchar()
sys.argv = ['dlio_benchmark'] + sys.argv[2:]
try:
    m.main()
finally:
    rank = os.environ.get('OMPI_COMM_WORLD_RANK', '0')
    with open(os.path.join(os.environ['DLIO_IO_DIR'], f'rank-{rank}.json'), 'w') as f:
        json.dump({'rchar': rchar() - r0}, f)
"""


def _env_tunelab() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = f"{ROOT / 'src'}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def drop_caches() -> None:
    """Write back and drop the machine's clean page cache (root)."""
    subprocess.run(["sync"], check=False)
    Path("/proc/sys/vm/drop_caches").write_text("1\n")


def warm(paths: list[Path]) -> None:
    """Read every file once (into the page cache)."""
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.read(1 << 20):
                pass


# --------------------------------------------------------------------------- tunelab


def make_tunelab_data(root: Path, samples: int, layout: str, files: int) -> dict[str, Any]:
    """``tunelab bench ddp make-data`` once (``layout`` folder: one JPEG per sample; shards:
    ``files`` tar shards, as many as DLIO's TFRecord files); the manifest's figures."""
    manifest = root / "tunelab-dataset.json"
    if not manifest.is_file():
        subprocess.run([sys.executable, "-m", "tunelab.bench.ddp", "make-data", str(root),
                        "--like", "imagenet", "--samples", str(samples), "--jobs", "2",
                        "--layout", layout, "--shard-samples", str(max(1, samples // files))],
                       check=True, env=_env_tunelab(), stdout=subprocess.DEVNULL)
    sys.path.insert(0, str(ROOT / "src"))
    from tunelab.bench.ddp.dataset import index_dataset

    index = index_dataset(str(root))
    return {"samples": index.samples, "bytes": index.bytes,
            "mean": index.bytes / max(1, index.samples)}


def run_tunelab(data: Path, procs: int, compute: float, readers: int, batch: int,
                steps: int, cache: str) -> dict[str, Any]:
    """One ``tunelab bench ddp`` run; its figures."""
    argv = [sys.executable, "-m", "tunelab.bench.ddp", "--model", "resnet50", "--decode", "off",
            "--loader-workers", str(readers), "--warmup", "2", "-n", str(procs),
            "-b", str(batch * procs), "-s", str(steps), "--compute", f"emulate:{compute:g}",
            "--data", f"files:{data}", "--cache", cache]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800,
                          env=_env_tunelab())
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"au": r["au"], "samples_per_s": r["throughput"],
            "MBps": r["throughput"] * r["mean_sample_bytes"] / 1e6,
            "read_over_counted": r["io_check"], "allreduce_s": r["allreduce_s"],
            "comm_frac": r["comm_frac"], "data_ms": r["data_s"] * 1e3}


# --------------------------------------------------------------------------- DLIO


def _dlio_env(venv: Path, io_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_mpi_yield_when_idle="1", TF_CPP_MIN_LOG_LEVEL="3",
               DLIO_IO_DIR=str(io_dir))
    env.pop("PYTHONPATH", None)
    return env


def _dlio_argv(venv: Path, procs: int, overrides: list[str]) -> list[str]:
    return ["mpirun", "-np", str(procs), "--oversubscribe", "--bind-to", "none",
            "-x", "PATH", "-x", "TF_CPP_MIN_LOG_LEVEL", "-x", "DLIO_IO_DIR",
            "-x", "OMPI_MCA_mpi_yield_when_idle",
            str(venv / "bin" / "python"), "-c", DLIO_RANK, "dlio",
            "workload=resnet50_a100", *overrides]


def _dlio_shape(files: int, samples: int, record: float, folder: Path) -> list[str]:
    return [f"++workload.dataset.num_files_train={files}",
            f"++workload.dataset.num_samples_per_file={samples // files}",
            f"++workload.dataset.record_length={record:.0f}",
            f"++workload.dataset.data_folder={folder}"]


def make_dlio_data(venv: Path, folder: Path, samples: int, record: float, files: int,
                   work: Path) -> None:
    """DLIO's own generation (TFRecords and their index files), once."""
    if (folder / "train").is_dir() and any((folder / "train").iterdir()):
        return
    argv = _dlio_argv(venv, 2, [*_dlio_shape(files, samples, record, folder),
                                "++workload.workflow.generate_data=True",
                                "++workload.workflow.train=False",
                                f"++workload.output.folder={work / 'gen'}"])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600,
                          env=_dlio_env(venv, work), cwd=work)
    if proc.returncode != 0:
        raise RuntimeError(f"DLIO data generation failed: {proc.stderr.strip()[-500:]}")


def run_dlio(venv: Path, folder: Path, procs: int, compute: float, readers: int, batch: int,
             samples: int, record: float, files: int, epochs: int, work: Path,
             ) -> dict[str, Any]:
    """One DLIO training run; its figures."""
    out = Path(tempfile.mkdtemp(prefix="dlio-run-", dir=work))
    argv = _dlio_argv(venv, procs, [
        *_dlio_shape(files, samples, record, folder), "++workload.workflow.generate_data=False",
        "++workload.workflow.train=True", "++workload.workflow.checkpoint=False",
        f"++workload.train.computation_time={compute}", f"++workload.train.epochs={epochs}",
        f"++workload.reader.batch_size={batch}", f"++workload.reader.read_threads={readers}",
        f"++workload.output.folder={out}"])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600,
                          env=_dlio_env(venv, out), cwd=out)
    summary = out / "summary.json"
    if proc.returncode != 0 or not summary.is_file():
        tail = [ln for ln in proc.stderr.splitlines() if "rror" in ln][-1:] or \
            proc.stderr.strip().splitlines()[-1:]
        return {"error": f"DLIO exited {proc.returncode}: {' '.join(tail)[:300]}"}
    m = json.loads(summary.read_text())["metric"]
    rchar = sum(json.loads(p.read_text())["rchar"] for p in out.glob("rank-*.json"))
    sps = float(m["train_throughput_mean_samples_per_second"])
    steps = (samples // files * files) // (batch * procs)  # per epoch and rank
    counted = epochs * steps * batch * procs * record  # the samples DLIO counts, as it counts
    return {"au": float(m["train_au_mean_percentage"]) / 100, "samples_per_s": sps,
            "MBps": sps * record / 1e6, "read_over_counted": rchar / counted,
            "MiBps_dlio": float(m["train_io_mean_MB_per_second"])}


# --------------------------------------------------------------------------- main


def _fmt(r: dict[str, Any] | None) -> str:
    if r is None:
        return f"{'(skipped)':>42}"
    if "error" in r:
        return f"  error: {r['error'][:120]}"
    return (f"{r['au']:>7.1%} {r['samples_per_s']:>10,.0f} {r['MBps']:>9,.1f} "
            f"{r['read_over_counted']:>9.3f}")


def main() -> int:
    """Measure and print."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dlio-venv", type=Path, default=None)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "storage-vs-dlio",
                    help="where the two datasets are made (kept for later runs)")
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--files", type=int, default=64, help="DLIO: TFRecord files")
    ap.add_argument("--batch", type=int, default=400, help="samples per process and step")
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--compute", default="0.05,0.005", help="emulated step seconds, comma list")
    ap.add_argument("--procs", default="1,2")
    ap.add_argument("--cache", default="warm,cold")
    ap.add_argument("--epochs", type=int, default=2, help="DLIO epochs per run (tunelab "
                                                          "runs the same number of steps)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--tunelab-layout", choices=["folder", "shards"], default="folder",
                    help="tunelab's dataset: JPEG files (folder) or tar shards, as many as "
                         "DLIO's files (a sequential read like DLIO's TFRecords)")
    args = ap.parse_args()
    computes = [float(c) for c in args.compute.split(",")]
    procs_list = [int(p) for p in args.procs.split(",")]
    caches = args.cache.split(",")
    if "cold" in caches and os.geteuid() != 0:
        print("cold runs need root (drop_caches): only warm", file=sys.stderr)
        caches = [c for c in caches if c != "cold"]
    args.dir.mkdir(parents=True, exist_ok=True)
    work = args.dir / "work"
    work.mkdir(exist_ok=True)
    t0 = time.monotonic()
    tl_dir = args.dir / ("tunelab" if args.tunelab_layout == "folder" else "tunelab-shards")
    tl = make_tunelab_data(tl_dir, args.samples, args.tunelab_layout, args.files)
    # DLIO's record: a sample's bytes (tar shards add headers that are not the sample's)
    folder = args.dir / "tunelab"
    record = (make_tunelab_data(folder, args.samples, "folder", args.files)["mean"]
              if args.tunelab_layout == "shards" and (folder / "tunelab-dataset.json").is_file()
              else tl["mean"])
    dlio_reason = None
    venv = args.dlio_venv
    if venv is None:
        dlio_reason = "no --dlio-venv (bash scripts/dlio-venv.sh makes one)"
    elif shutil.which("mpirun") is None:
        dlio_reason = "no mpirun (apt-get install openmpi-bin)"
    dlio_data = args.dir / "dlio"
    if dlio_reason is None:
        assert venv is not None
        try:
            make_dlio_data(venv, dlio_data, args.samples, record, args.files, work)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            dlio_reason = str(exc)[:300]
    print(f"datasets: {tl['samples']:,} samples, mean {record / 1e3:,.1f} kB ({args.dir}); "
          f"made in {time.monotonic() - t0:,.0f} s", file=sys.stderr)
    tl_files = sorted(p for p in tl_dir.rglob("*") if p.suffix in (".JPEG", ".tar"))
    dl_files = sorted(dlio_data.rglob("*.tfrecord")) if dlio_reason is None else []
    rows: dict[tuple[str, float, int], dict[str, list[dict[str, Any]]]] = {}
    for rnd in range(args.rounds):
        for cache in caches:
            for compute in computes:
                for procs in procs_list:
                    key = (cache, compute, procs)
                    cell = rows.setdefault(key, {"tunelab": [], "dlio": []})
                    steps_per_epoch = args.samples // (args.batch * procs)
                    steps = max(1, args.epochs * steps_per_epoch - 2)
                    if cache == "warm":
                        warm(tl_files)
                    cell["tunelab"].append(run_tunelab(tl_dir, procs, compute,
                                                       args.readers, args.batch, steps, cache))
                    if dlio_reason is None:
                        assert venv is not None
                        epochs = args.epochs
                        if cache == "warm":
                            warm(dl_files)
                        else:
                            drop_caches()
                            epochs = 1  # a second epoch would read from the page cache
                        cell["dlio"].append(run_dlio(venv, dlio_data, procs, compute,
                                                     args.readers, args.batch, args.samples,
                                                     record, args.files, epochs, work))
                    print(f"round {rnd + 1}: {cache} {compute:g} s x{procs}: tunelab "
                          f"{_fmt(cell['tunelab'][-1])} | DLIO "
                          f"{_fmt(cell['dlio'][-1] if cell['dlio'] else None)}",
                          file=sys.stderr)
    _print(args, tl, rows, dlio_reason)
    return 0


def _median(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[-1] if runs else None
    return {k: statistics.median(r[k] for r in ok) for k in ("au", "samples_per_s", "MBps",
                                                             "read_over_counted")}


def _print(args: argparse.Namespace, tl: dict[str, Any],
           rows: dict[tuple[str, float, int], dict[str, list[dict[str, Any]]]],
           dlio_reason: str | None) -> None:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                .splitlines() if ln.startswith("model name")), "?")
    layout = ("JPEG files" if args.tunelab_layout == "folder"
              else f"{args.files} tar shards")
    print(f"ResNet-50 storage benchmark, tunelab ({layout}) vs DLIO 2.0.0 ({args.files} "
          f"TFRecord files): {tl['samples']:,} samples of "
          f"mean {tl['mean'] / 1e3:,.1f} kB, batch {args.batch} per process, {args.readers} "
          f"readers per process, {args.rounds} round(s) (medians); {cpu}, {os.cpu_count()} "
          f"cores, load average {os.getloadavg()[0]:.1f}")
    if dlio_reason:
        print(f"DLIO skipped: {dlio_reason}")
    head = f"{'AU':>7} {'samples/s':>10} {'MB/s':>9} {'read/cnt':>9}"
    print(f"{'cache':<5} {'step':>6} {'procs':>5} | tunelab {head} | DLIO    {head} | "
          f"{'AU x':>6} {'sps x':>6}")
    for (cache, compute, procs), cell in rows.items():
        a, b = _median(cell["tunelab"]), _median(cell["dlio"])
        ratio = ""
        if a and b and "error" not in a and "error" not in b:
            ratio = f"{a['au'] / b['au']:>6.2f} {a['samples_per_s'] / b['samples_per_s']:>6.2f}"
        print(f"{cache:<5} {compute * 1e3:>4g}ms {procs:>5} | tunelab {_fmt(a)} | DLIO    "
              f"{_fmt(b)} | {ratio}")
    print("AU: emulated compute / time (tunelab: of its timed steps; DLIO: of each epoch less "
          "its first step); MB/s = samples/s x mean sample bytes; read/cnt = bytes the kernel "
          "counted (rchar) / bytes the tool counts; x = tunelab / DLIO")


if __name__ == "__main__":
    raise SystemExit(main())
