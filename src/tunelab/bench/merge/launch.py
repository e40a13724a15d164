"""Start the workers of one benchmark run and report the first one that fails.

* ``mpi``: ``mpirun -np N python -m tunelab.bench.merge …`` (Open MPI forwards the launching
  environment, so ``UCX_*`` variables reach every local rank; on several hosts add
  ``--hostfile`` and pass variables with ``--mpi-arg=-x --mpi-arg=UCX_TLS``).
* ``tcp`` / ``ucxx``: N local worker processes that find each other through a temporary
  address directory (on several hosts: start one worker per host by hand with ``--rank`` and a
  shared ``--address-dir``).
* ``dask``: the driver runs in this process (:mod:`~tunelab.bench.merge.dask`).

When a worker dies, the launcher ends the others and exits non-zero with a line naming the
worker, the phase and the iteration it was in (read from the workers' status files).

UCX's own words are read from the workers' output: a run UCX refused (``UCX  ERROR Invalid
value for RNDV_THRESH: 'banana'``, ``no usable transports/devices``) ends with that reason,
and a run in which UCX ignored what was asked (a variable it reports unused — misspelt,
unknown to this version, or for hardware not present — or a network device it reports not
available) exits 2 (:data:`EXIT_NOT_APPLIED`) naming it, although it finished: its figures
are of UCX's defaults, not of the setting asked for, and must not be ranked as that setting.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

from tunelab.bench.merge.comm import read_status
from tunelab.bench.merge.config import MergeConfig, check_memory, local_workers
from tunelab.bench.merge.worker import EXIT_FAILURE, EXIT_VERIFY
from tunelab.cluster.mpi import MPI_PACKAGE_HINT, mpirun_argv, mpirun_env, require_executable
from tunelab.errors import WorkloadError
from tunelab.sysinfo import mem_available

__all__ = ["EXIT_NOT_APPLIED", "launch", "mpi_command", "ucx_env_note",
           "uses_ucx", "worker_argv"]

#: Exit status of a run UCX refused, or one in which it ignored a ``UCX_*`` setting.
EXIT_NOT_APPLIED = 2

#: Needed for Open MPI's UCX PML on a machine without InfiniBand (see the docs).
UCX_PML_ENV = {"OMPI_MCA_pml_ucx_tls": "any", "OMPI_MCA_pml_ucx_devices": "any"}

_MPI_DEATH = re.compile(r"rank (\d+) with PID (\d+) on node (\S+) exited on signal (\d+)")
_WAITED = re.compile(r"timed out after \S+ s waiting for worker (\d+)")
_FAULT = re.compile(r"merge: worker \d+ failed in phase ")  # a worker's own exception
_UCX_UNUSED = re.compile(r"unused env variables?: (UCX_[\w,]+)")
_UCX_ERROR = re.compile(r"\bUCX\s+ERROR\s+(.+?)\s*$")
_UCX_NO_DEVICE = re.compile(r"\bUCX\s+WARN\s+(network device '[^']*' is not available.*?)\s*$")


class _Pump:
    """Forward a child's output line by line, remembering what the launcher reports on
    (UCX logs to stdout by default, Open MPI's notices go to stderr)."""

    def __init__(self, stream: IO[str], target: IO[str]) -> None:
        self.deaths: list[tuple[int, int]] = []
        self.unused: set[str] = set()
        self.ucx_errors: list[str] = []
        self.missing_devices: set[str] = set()
        self.waited_for: list[int] = []
        self.reported: list[str] = []
        self._stream = stream
        self._target = target
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        for line in self._stream:
            self._target.write(line)
            if _FAULT.match(line):
                self.reported.append(line.strip())
            m = _WAITED.search(line)
            if m:
                self.waited_for.append(int(m.group(1)))
            m = _MPI_DEATH.search(line)
            if m:
                self.deaths.append((int(m.group(1)), int(m.group(4))))
            m = _UCX_UNUSED.search(line)
            if m:
                self.unused.update(n for n in m.group(1).split(",") if n)
            m = _UCX_ERROR.search(line)
            if m and len(self.ucx_errors) < 8:
                self.ucx_errors.append(m.group(1))
            m = _UCX_NO_DEVICE.search(line)
            if m:
                self.missing_devices.add(m.group(1))
        self._target.flush()

    def join(self) -> None:
        self._thread.join(timeout=5)


def _ucx_verdict(pumps: list[_Pump], rc: int) -> int | None:
    """After the workers ended with ``rc``: print UCX's reason and return
    :data:`EXIT_NOT_APPLIED` when UCX refused the configuration (``rc`` non-zero and a
    ``UCX ERROR`` line) or ignored part of it; None when UCX has nothing to say."""
    unused = sorted(set().union(*(p.unused for p in pumps)))
    devices = sorted(set().union(*(p.missing_devices for p in pumps)))
    errors = [e for p in pumps for e in p.ucx_errors]
    if rc != 0 and errors:
        print(f"merge: error: UCX refused the configuration: {errors[0]}", file=sys.stderr)
        return EXIT_NOT_APPLIED
    ignored = []
    if unused:
        ignored.append(f"UCX did not use {', '.join(unused)} (misspelt, unknown to this UCX "
                       "version, or for a transport not present here)")
    ignored += [f"UCX: {d}" for d in devices]
    if rc != 0 or not ignored:
        return None
    print(f"merge: error: {'; '.join(ignored)}: the run measured UCX's defaults instead, "
          "so it is not reported as the setting asked for", file=sys.stderr)
    return EXIT_NOT_APPLIED


def uses_ucx(cfg: MergeConfig) -> bool:
    """Whether ``UCX_*`` variables affect this configuration."""
    return (cfg.transport == "ucxx" or (cfg.transport == "mpi" and cfg.mpi_pml == "ucx")
            or (cfg.transport == "dask" and cfg.protocol == "ucxx"))


def ucx_env_note(cfg: MergeConfig, environ: dict[str, str]) -> str | None:
    """A warning when ``UCX_*`` variables are set but the transport does not use UCX."""
    names = sorted(k for k in environ if k.startswith("UCX_"))
    if names and not uses_ucx(cfg):
        return (f"merge: note: {', '.join(names)} set, but this transport does not use UCX "
                "(use --transport mpi --mpi-pml ucx, ucxx, or dask --protocol ucxx); "
                "they have no effect")
    return None


def worker_argv(cfg: MergeConfig, status_dir: str, address_dir: str | None,
                rank: int | None) -> list[str]:
    """The command line of one worker process (the configuration travels as JSON)."""
    argv = [sys.executable, "-m", "tunelab.bench.merge",
            "--worker-config", json.dumps(cfg.to_dict()), "--status-dir", status_dir]
    if address_dir is not None:
        argv += ["--address-dir", address_dir]
    if rank is not None:
        argv += ["--rank", str(rank)]
    return argv


def mpi_command(cfg: MergeConfig, status_dir: str) -> tuple[list[str], dict[str, str]]:
    """``(argv, extra environment)`` of the ``mpirun`` line for ``cfg``."""
    require_executable(cfg.mpirun, MPI_PACKAGE_HINT)
    if importlib.util.find_spec("mpi4py") is None:
        raise WorkloadError("--transport mpi needs mpi4py; install it with "
                            "pip install 'tunelab[merge]'")
    extra = ["--mca", "pml", cfg.mpi_pml]
    if cfg.hostfile:
        extra += ["--hostfile", cfg.hostfile]
    extra += list(cfg.mpi_args)
    argv = mpirun_argv(cfg.workers, mpirun=cfg.mpirun, extra_args=extra)
    env = dict(mpirun_env(cfg.workers))
    env["OMPI_MCA_pml"] = cfg.mpi_pml
    if cfg.mpi_pml == "ucx":
        for key, value in UCX_PML_ENV.items():
            env[key] = os.environ.get(key, value)
    return argv + worker_argv(cfg, status_dir, None, None), env


def _where(status_dir: str, rank: int) -> str:
    status = read_status(status_dir, rank)
    if status is None:
        return "before it started"
    pid, phase, iteration = status
    where = f"in phase {phase}"
    if iteration >= 0:
        where += f" of iteration {iteration}"
    return f"(pid {pid}) {where}"


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _run_mpirun(cfg: MergeConfig, status_dir: str) -> int:
    argv, extra_env = mpi_command(cfg, status_dir)
    env = {**os.environ, **extra_env}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace")
    assert proc.stdout is not None and proc.stderr is not None
    pumps = [_Pump(proc.stdout, sys.stdout), _Pump(proc.stderr, sys.stderr)]
    rc = proc.wait()
    for p in pumps:
        p.join()
    deaths = [d for p in pumps for d in p.deaths]
    waited = [w for p in pumps for w in p.waited_for]
    if rc == 0:
        return _ucx_verdict(pumps, rc) or 0
    if deaths:
        rank, sig = deaths[0]
        print(f"merge: worker {rank} {_where(status_dir, rank)} died: killed by "
              f"{_signal_name(sig)}", file=sys.stderr)
        return EXIT_FAILURE
    if waited:
        print(f"merge: worker {waited[0]} {_where(status_dir, waited[0])} stopped answering: "
              "the other workers timed out waiting for it", file=sys.stderr)
        return EXIT_FAILURE
    if rc == EXIT_FAILURE and any(p.reported for p in pumps):
        return rc  # the failed worker named itself, its phase and the fault
    refused = _ucx_verdict(pumps, rc)
    if refused is not None:
        return refused
    if rc == EXIT_VERIFY:  # rank 0 said what was wrong
        return rc
    print(f"merge: mpirun exited with status {rc} (see the worker messages above)",
          file=sys.stderr)
    return rc


def _run_local(cfg: MergeConfig, status_dir: str, address_dir: str) -> int:
    if cfg.transport == "ucxx" and importlib.util.find_spec("ucxx") is None:
        raise WorkloadError("--transport ucxx needs the UCXX Python bindings; install them with "
                            "pip install 'tunelab[ucx]' (ucxx-cu12, distributed-ucxx-cu12)")
    procs = [subprocess.Popen(worker_argv(cfg, status_dir, address_dir, r),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              errors="replace")
             for r in range(cfg.workers)]
    pumps = [_Pump(s, t) for p in procs for s, t in ((p.stdout, sys.stdout),
                                                       (p.stderr, sys.stderr)) if s is not None]
    killed: set[int] = set()
    kill_at: float | None = None
    try:
        while True:
            polled = [p.poll() for p in procs]
            if all(c is not None for c in polled):
                break
            failed = [(r, c) for r, c in enumerate(polled) if c not in (None, 0)]
            if failed and kill_at is None:
                kill_at = time.monotonic() + cfg.timeout + 1.0
            if kill_at is not None and time.monotonic() > kill_at:
                for r, p in enumerate(procs):
                    if p.poll() is None:
                        killed.add(r)
                        p.kill()
            time.sleep(0.02)
    finally:
        for r, p in enumerate(procs):
            if p.poll() is None:
                killed.add(r)
                p.kill()
                p.wait()
    for pump in pumps:
        pump.join()
    codes: list[int] = [p.returncode for p in procs]
    if all(c == 0 for c in codes):
        return _ucx_verdict(pumps, 0) or 0
    if all(c in (0, EXIT_VERIFY) for c in codes):
        return EXIT_VERIFY
    # The root cause: a worker killed by a signal (not by us), else the first that failed.
    signalled = [(r, c) for r, c in enumerate(codes) if c < 0 and r not in killed]
    faults = [line for p in pumps for line in p.reported]
    if faults and not signalled:  # a worker's exception, not the peers that lost it
        print(faults[0], file=sys.stderr)
        return EXIT_FAILURE
    failed = [(r, c) for r, c in enumerate(codes) if c > 0]
    rank, code = (signalled or failed or [(r, c) for r, c in enumerate(codes) if c != 0])[0]
    waited = [w for p in pumps for w in p.waited_for]
    if not signalled and not waited and (refused := _ucx_verdict(pumps, 1)) is not None:
        return refused
    if not signalled and waited:
        print(f"merge: worker {waited[0]} {_where(status_dir, waited[0])} stopped answering: "
              "the other workers timed out waiting for it", file=sys.stderr)
    elif code < 0:
        print(f"merge: worker {rank} {_where(status_dir, rank)} died: killed by "
              f"{_signal_name(-code)}", file=sys.stderr)
    else:
        print(f"merge: worker {rank} {_where(status_dir, rank)} failed with exit status "
              f"{code} (see its message above)", file=sys.stderr)
    return EXIT_FAILURE


def launch(cfg: MergeConfig) -> int:
    """Run the benchmark described by ``cfg``; the exit status of the run."""
    check_memory(cfg, local_workers(cfg), mem_available())
    note = ucx_env_note(cfg, dict(os.environ))
    if note:
        print(note, file=sys.stderr)
    if cfg.transport == "dask":
        from tunelab.bench.merge.dask import run_dask

        return run_dask(cfg)
    with tempfile.TemporaryDirectory(prefix="tunelab-merge-") as tmp:
        status_dir = str(Path(tmp) / "status")
        os.mkdir(status_dir)
        if cfg.transport == "mpi":
            return _run_mpirun(cfg, status_dir)
        address_dir = cfg.address_dir or str(Path(tmp) / "addr")
        return _run_local(cfg, status_dir, address_dir)
