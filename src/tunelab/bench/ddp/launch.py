"""Start one ``torchrun`` per node, watch the workers, and report the first one that fails.

Layout ``nodes x workers_per_node``: node ``i`` runs ``torchrun --nnodes K --node_rank i
--nproc_per_node W --master_addr A --master_port P …`` (static rendezvous: ranks are numbered
node by node, rank ``r`` lives on node ``r // W``). Where the nodes are is a
:class:`~tunelab.bench.ddp.placement.Placement`: ``local`` runs every node's torchrun on this
host over the loopback interface; ``vnodes`` runs each inside a virtual node (network
namespace, a link with a bandwidth limit) — see :mod:`tunelab.bench.ddp.placement`.

Failures, each one line on stderr and exit status 4 (the workers' and torchrun's own output,
tracebacks included, is kept out of stderr and written to ``ddp-failure.log`` in the current
directory, which the line names):

* a rendezvous that does not complete within ``--rendezvous-timeout`` names the ranks that
  never joined and the nodes they belong to;
* a worker that dies names its rank, node, pid, step and signal (read from torchrun's
  failure report and the worker's status file); the other nodes are stopped after a short
  grace period, so nothing hangs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from tunelab.bench.ddp.config import DDPConfig
from tunelab.bench.ddp.placement import NodeSlot, open_placement
from tunelab.bench.ddp.worker import EXIT_FAILURE, read_status
from tunelab.errors import WorkloadError

if TYPE_CHECKING:
    from tunelab.bench.ddp.dataset import DatasetIndex

__all__ = ["FAILURE_LOG", "check_devices", "describe_ranks", "launch", "node_argv",
           "worker_threads"]

_ROOT_CAUSE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*exitcode\s*:\s*(-?\d+)")
_GRACE_S = 5.0
#: where a failed run's full output goes (the current directory: a study's run directory)
FAILURE_LOG = "ddp-failure.log"


class _Pump:
    """Keep a child's output for diagnosis, not shown: a failure is one line on stderr (the
    launcher's) and the full text (torchrun's and the workers' messages and tracebacks) goes
    to the run's log (:data:`FAILURE_LOG`)."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._stream = stream
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for line in self._stream:
            self.lines.append(line)
            if len(self.lines) > 5000:
                del self.lines[:1000]

    def join(self) -> str:
        self._thread.join(timeout=5)
        return "".join(self.lines)


def worker_threads(cfg: DDPConfig, cores: int) -> int:
    """Threads per worker: ``--threads``, else the host's cores shared by every worker on it
    (all virtual nodes share this host), at least 1."""
    if cfg.threads:
        return cfg.threads
    return max(1, cores // cfg.workers)


def node_argv(cfg: DDPConfig, node: int, master: str, port: int, local_addr: str,
              status_dir: str, result_file: str) -> list[str]:
    """The torchrun command line of ``node``."""
    worker_cfg = cfg.to_dict()
    return [sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(cfg.nodes), "--node_rank", str(node),
            "--nproc_per_node", str(cfg.workers_per_node),
            "--master_addr", master, "--master_port", str(port),
            "--local_addr", local_addr,
            "--rdzv_conf", f"timeout={int(cfg.rendezvous_timeout) + 30}",
            "--max_restarts", "0", "--monitor_interval", "0.2",
            "-m", "tunelab.bench.ddp",
            "--worker-config", json.dumps(worker_cfg),
            "--status-dir", status_dir, "--result-file", result_file]


def describe_ranks(ranks: Sequence[int]) -> str:
    """``2``, ``2, 3`` or ``4-7``."""
    r = sorted(ranks)
    if len(r) > 2 and r == list(range(r[0], r[-1] + 1)):
        return f"{r[0]}-{r[-1]}"
    return ", ".join(map(str, r))


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _kill(proc: subprocess.Popen[str], wait_s: float = 10.0) -> None:
    """Kill a node's torchrun and everything below it. torchrun starts each worker in a
    session of its own, out of reach of a signal to torchrun's process group: the
    descendants are found first, then killed with the group (a worker left alive would go on
    reading and training after the run ended)."""
    if proc.poll() is None:
        import psutil

        try:
            family = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            family = []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for child in family:
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(family, timeout=wait_s)
    proc.wait()


def _with_launcher(argv: list[str]) -> list[str]:
    """``argv`` run so that it gets SIGTERM when the launcher dies, however it dies (``kill
    -9``, the OOM killer): torchrun then stops its workers. Without it a launcher killed
    outright left torchrun and the workers — each in a session of its own — training for
    the rest of their steps. ``setpriv --pdeathsig`` (util-linux) where it is installed."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", *argv] if setpriv else argv


class _Run:
    """The torchrun processes of one benchmark run."""

    def __init__(self, cfg: DDPConfig, slots: Sequence[NodeSlot], tmp: Path) -> None:
        self.cfg = cfg
        self.status_dir = str(tmp / "status")
        self.result_file = str(tmp / "result.json")
        os.mkdir(self.status_dir)
        master = slots[0].address
        port = slots[0].rendezvous_port(cfg.port)
        threads = worker_threads(cfg, os.cpu_count() or 1)
        absent = cfg.fault.node if cfg.fault and cfg.fault.action == "absent" else -1
        self.procs: list[subprocess.Popen[str] | None] = []
        self.pumps: list[_Pump] = []
        self.text = ""
        for slot in slots:
            if slot.index == absent:
                self.procs.append(None)
                continue
            env = {**os.environ, **slot.env, "OMP_NUM_THREADS": str(threads),
                   "MKL_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
            argv = [*slot.prefix, *_with_launcher(node_argv(
                cfg, slot.index, master, port, slot.address, self.status_dir,
                self.result_file))]
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, errors="replace",
                                    start_new_session=True)
            self.procs.append(proc)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    self.pumps.append(_Pump(stream))

    def joined(self) -> list[int]:
        out = []
        for r in range(self.cfg.workers):
            st = read_status(self.status_dir, r)
            if st is not None and st.get("phase") not in (None, "start"):
                out.append(r)
        return out

    def wait(self) -> str | None:
        """Wait for every node; None on success, else the one-line reason."""
        cfg = self.cfg
        rdzv_deadline = time.monotonic() + cfg.rendezvous_timeout
        kill_at: float | None = None
        all_joined = False
        try:
            while True:
                codes = [p.poll() if p is not None else None for p in self.procs]
                live = [p for p in self.procs if p is not None]
                if all(p.poll() is not None for p in live) and len(live) == len(self.procs):
                    break
                if not all_joined:
                    all_joined = len(self.joined()) == cfg.workers
                if not all_joined and time.monotonic() > rdzv_deadline:
                    return self._rendezvous_failure(codes)
                if any(c not in (None, 0) for c in codes) and kill_at is None:
                    kill_at = time.monotonic() + _GRACE_S
                if kill_at is not None and time.monotonic() > kill_at:
                    break
                time.sleep(0.05)
        finally:
            for p in self.procs:
                if p is not None:
                    _kill(p)
        text = self.text = "".join(pump.join() for pump in self.pumps)
        codes = [p.returncode if p is not None else None for p in self.procs]
        if all(c == 0 for c in codes) and Path(self.result_file).is_file():
            return None
        return self._worker_failure(text, codes)

    def _rendezvous_failure(self, codes: Sequence[int | None]) -> str:
        cfg = self.cfg
        joined = set(self.joined())
        missing = [r for r in range(cfg.workers) if r not in joined]
        parts = []
        for node, proc in enumerate(self.procs):
            ranks = [r for r in cfg.ranks_of(node) if r in missing]
            if not ranks:
                continue
            if proc is None:
                why = "its node was never started"
            elif codes[node] is not None:
                why = f"its torchrun exited with status {codes[node]}"
            else:
                started = [r for r in ranks if read_status(self.status_dir, r) is not None]
                why = ("started, waiting for the others" if started
                       else "no worker started (the node agents wait for each other)")
            parts.append(f"node {node} ranks {describe_ranks(ranks)}: {why}")
        return (f"rendezvous did not complete within {cfg.rendezvous_timeout:g} s: "
                f"rank(s) {describe_ranks(missing)} never joined ({'; '.join(parts)})")

    def _where(self, rank: int) -> str:
        st = read_status(self.status_dir, rank)
        node = self.cfg.node_of(rank)
        if st is None:
            return f"worker {rank} (node {node}) before it started"
        where = f"worker {rank} (node {node}, pid {st.get('pid')})"
        if st.get("phase") != "failed":
            where += f" in phase {st.get('phase')}"
        step = int(st.get("step", -1))
        if step >= 0:
            start = st.get("timed_from")
            where += f" at step {step - start}" if isinstance(start, int) and step >= start \
                else f" at warm-up step {step}"
        return where

    def _worker_failure(self, text: str, codes: Sequence[int | None]) -> str:
        failed = [(r, st) for r in range(self.cfg.workers)
                  if (st := read_status(self.status_dir, r)) and st.get("phase") == "failed"]
        failed.sort(key=lambda item: not item[1].get("origin"))  # causes before echoes
        if failed and failed[0][1].get("origin"):  # e.g. its data loader died
            r, st = failed[0]
            return f"{self._where(r)} failed: {st.get('error')}"
        causes = [(int(r), int(c)) for r, c in _ROOT_CAUSE.findall(text)]
        # torchrun SIGTERMs the survivors of a dead worker: another signal is the root cause
        signalled = sorted(((r, c) for r, c in causes if c < 0),
                           key=lambda rc: rc[1] == -signal.SIGTERM)
        if signalled:
            rank, code = signalled[0]
            return f"{self._where(rank)} died: killed by {_signal_name(-code)}"
        if failed:
            r, st = failed[0]
            return f"{self._where(r)} failed: {st.get('error')}"
        if causes:
            rank, code = causes[0]
            return f"{self._where(rank)} exited with status {code}"
        bad = [(n, c) for n, c in enumerate(codes) if c not in (0, None)]
        if bad:
            why = _last_error(text)
            return (f"the torchrun of node {bad[0][0]} exited with status {bad[0][1]}"
                    f"{': ' + why if why else ''}")
        return "the workers finished without a result (see the messages above)"


_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(\w*(?:Error|Exception)): (.+)$", re.M)


def _last_error(text: str) -> str:
    """The last ``SomeError: message`` line of torchrun's output (e.g. its store's
    ``DistNetworkError: … EADDRINUSE``), at most 300 characters; "" when none."""
    found = _ERROR_LINE.findall(text)
    if not found:
        return ""
    kind, message = found[-1]
    return f"{kind}: {' '.join(message.split())}"[:300]


def _keep_log(text: str) -> str:
    """Write the workers' full output to :data:`FAILURE_LOG`; the note naming it."""
    if not text.strip():
        return ""
    try:
        Path(FAILURE_LOG).write_text(text)
    except OSError:
        return ""
    return f" (full output in {Path(FAILURE_LOG).resolve()})"


def check_devices(cfg: DDPConfig) -> None:
    """Before anything starts: a node's workers fit its GPUs (NCCL needs one each), and
    ``--decode gpu`` has a GPU JPEG decoder; one-line :class:`WorkloadError` otherwise."""
    if cfg.device == "cpu" and cfg.decode != "gpu":
        return
    import torch

    from tunelab.bench.ddp.worker import check_gpu_layout, select_runtime

    gpus = torch.cuda.device_count()
    if cfg.decode == "gpu":
        from tunelab.bench.ddp.gpudecode import gpu_decode_unavailable

        why = gpu_decode_unavailable()
        if why:
            raise WorkloadError(f"--decode gpu: {why}; use --decode on (Pillow in the loader "
                                "processes) or off")
    rt = select_runtime(cfg.device, cfg.backend, cfg.amp, 0, cuda_devices=gpus)
    if rt.device.startswith("cuda"):
        check_gpu_layout(cfg.workers_per_node, gpus, rt.backend)


def _check_host_memory(cfg: DDPConfig, index: DatasetIndex | None) -> None:
    """Refuse a run that would not fit this host's available memory
    (:mod:`tunelab.bench.ddp.memory`; ``index``: the dataset): on the CPU its workers and
    their loaders; on a GPU, whose model and activations live on the GPUs, the loaders."""
    from tunelab.bench.ddp.memory import check_loader_memory, check_memory
    from tunelab.sysinfo import mem_available

    if cfg.device != "cpu":
        import torch

        if cfg.device == "cuda" or torch.cuda.device_count() > 0:
            check_loader_memory(cfg, mem_available(), index)
            return
    check_memory(cfg, mem_available(), index=index)


def _dataset(cfg: DDPConfig) -> DatasetIndex | None:
    """The dataset of ``cfg``, indexed and checked against the run (None without one)."""
    from tunelab.bench.ddp.data import check_dataset

    return check_dataset(cfg, "volumes" if cfg.model == "unet3d" else "images")


def _storage(cfg: DDPConfig, index: DatasetIndex | None,
             stack: contextlib.ExitStack[Any]) -> dict[str, Any]:
    """Prepare the page cache for ``index``, apply the read limit (for the block); what was
    found and done, for the result."""
    from tunelab.bench.ddp.cache import prepare_cache

    data = cfg.data_spec
    if index is None:
        return {}
    out: dict[str, Any] = {"dataset": index.root, "layout": index.layout,
                           "samples": index.samples, "bytes": index.bytes,
                           "mean_sample_bytes": index.bytes / max(1, index.samples),
                           "notes": list(index.notes)}
    if data.kind == "files":
        prep = prepare_cache(cfg.cache, index.paths(), index.bytes)
        out["cache_actions"] = list(prep.actions)
        rate = cfg.read_limit_bps
        if rate is not None:
            from tunelab.bench.ddp.iolimit import read_limit

            out["read_limit"] = stack.enter_context(read_limit(rate, index.root))
            if cfg.cache != "cold":
                out["notes"].append(f"--read-limit throttles reads from the device; with "
                                    f"--cache {cfg.cache} pages already cached are not "
                                    "throttled")
    return out


def launch(cfg: DDPConfig) -> int:
    """Run the benchmark described by ``cfg``; print the table and the JSON line."""
    from tunelab.bench.ddp.report import fom_line, render_table

    check_devices(cfg)
    index = _dataset(cfg)
    _check_host_memory(cfg, index)
    with contextlib.ExitStack() as stack:
        storage = _storage(cfg, index, stack)
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="tunelab-ddp-"))
        slots = stack.enter_context(open_placement(cfg))
        run = _Run(cfg, slots, Path(tmp))
        reason = run.wait()
        if reason is not None:
            print(f"ddp: {reason}{_keep_log(run.text)}", file=sys.stderr, flush=True)
            return EXIT_FAILURE
        result = json.loads(Path(run.result_file).read_text())
    result["storage"] = storage
    if cfg.data_spec.kind == "files":
        from tunelab.bench.ddp.cache import measured_note
        from tunelab.sysinfo import mem_total

        share = result["summary"].get("device_share")
        note = measured_note(cfg.cache, share if isinstance(share, float) else None,
                             int(storage.get("bytes", 0)), mem_total())
        if note:
            storage.setdefault("notes", []).append(note)
    print(render_table(cfg, result), flush=True)
    summary = result["summary"]
    if not summary.get("samples") and summary.get("corrupt"):  # it measured nothing
        print(f"ddp: the timed steps received no sample: all {summary['corrupt']:,} samples "
              f"read were corrupt (first: {_first_corrupt(result)})", file=sys.stderr,
              flush=True)
        return EXIT_FAILURE
    print(fom_line(cfg, result), flush=True)
    return 0


def _first_corrupt(result: dict[str, Any]) -> str:
    """The first corrupt file a run named."""
    files = (result.get("data") or {}).get("corrupt_files") or []
    return str(files[0]) if files else "none named"
