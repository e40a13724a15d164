"""The merge benchmark's settings, validated in one place for every entry point."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from tunelab.bench.faults import fault_fields
from tunelab.errors import WorkloadError

__all__ = [
    "BACKENDS",
    "DASK_SHUFFLES",
    "MPI_PMLS",
    "PHASES",
    "PROTOCOLS",
    "TRANSPORTS",
    "Fault",
    "MergeConfig",
    "check_memory",
    "local_workers",
    "memory_need",
    "memory_problem",
    "parse_fault",
]

#: Peak resident bytes of one worker per chunk row (left and right chunks, send and receive
#: columns of both sides, hash scratch, the merge), measured at 4 x 10^6 rows with pandas:
#: 183 (tcp), 116 (dask); rounded up.
BYTES_PER_ROW = 192
#: Resident bytes of one worker before any data (Python, numpy, pandas, the transport):
#: 125 MiB measured; rounded up.
WORKER_BASE_BYTES = 128 << 20

TRANSPORTS = ("mpi", "tcp", "dask", "ucxx")
BACKENDS = ("pandas", "cudf")
MPI_PMLS = ("ob1", "ucx")
PROTOCOLS = ("tcp", "ucxx")
DASK_SHUFFLES = ("tasks", "p2p")
VERIFY_MODES = ("auto", "full", "count")

#: The phases a worker goes through; a failure report names one of them.
PHASES = (
    "start",
    "connect",
    "generate",
    "barrier",
    "partition-left",
    "partition-right",
    "exchange-left",
    "exchange-right",
    "merge",
    "verify",
    "gather",
    "done",
)


@dataclass(frozen=True)
class Fault:
    """A fault to inject for tests: worker ``rank`` dies (``kill``), stops answering
    (``hang``), raises an exception (``raise``) or, in phase ``merge``, drops a merged row
    (``corrupt``) or flips one bit of a merged payload (``flip``) on entering ``phase`` of
    iteration ``iteration`` (counted from 0, warm-up iterations included)."""

    rank: int
    phase: str
    iteration: int = 0
    action: str = "kill"


def parse_fault(text: str | None) -> Fault | None:
    """Parse ``rank=1,phase=exchange-left,iteration=0,action=kill`` into a :class:`Fault`."""
    if not text:
        return None
    fields = fault_fields(text, {"rank", "phase", "iteration", "action"})
    try:
        fault = Fault(
            rank=int(fields["rank"]),
            phase=fields.get("phase", "exchange-left"),
            iteration=int(fields.get("iteration", "0")),
            action=fields.get("action", "kill"),
        )
    except (KeyError, ValueError) as exc:
        raise WorkloadError(f"--inject-fault: bad value in {text!r} ({exc})") from exc
    if fault.phase not in PHASES:
        raise WorkloadError(f"--inject-fault: unknown phase {fault.phase!r}; one of {PHASES}")
    if fault.action not in ("kill", "hang", "raise", "corrupt", "flip"):
        raise WorkloadError(f"--inject-fault: action must be kill, hang, raise, corrupt or flip, "
                            f"got {fault.action!r}")
    return fault


@dataclass(frozen=True)
class MergeConfig:
    """Everything one benchmark run needs; :meth:`validate` gives one-line errors."""

    workers: int = 2
    chunk_size: int = 100_000
    iterations: int = 5
    warmup: int = 1
    frac_match: float = 0.3
    seed: int = 42
    transport: str = "tcp"
    backend: str = "pandas"
    timeout: float = 60.0
    verify: str = "auto"
    verify_limit: int = 1_000_000
    # mpi
    mpi_pml: str = "ob1"
    mpirun: str = "mpirun"
    hostfile: str | None = None
    mpi_args: tuple[str, ...] = ()
    # tcp / ucxx
    host: str = "127.0.0.1"
    address_dir: str | None = None
    # dask
    protocol: str = "tcp"
    scheduler: str | None = None
    scheduler_file: str | None = None
    dask_shuffle: str = "tasks"
    records: str | None = None
    # testing
    fault: Fault | None = field(default=None)

    def validate(self) -> MergeConfig:
        """Return self, or raise :class:`WorkloadError` naming the bad option and value."""
        if self.workers < 2:
            raise WorkloadError(f"--workers must be at least 2 (an all-to-all needs peers), "
                                f"got {self.workers}")
        if self.chunk_size <= 0:
            raise WorkloadError(f"--chunk-size must be a positive number of rows, "
                                f"got {self.chunk_size}")
        if self.iterations < 1:
            raise WorkloadError(f"--iterations must be at least 1, got {self.iterations}")
        if self.warmup < 0:
            raise WorkloadError(f"--warmup must be 0 or more, got {self.warmup}")
        if not 0.0 <= self.frac_match <= 1.0:
            raise WorkloadError(f"--frac-match must lie in [0, 1], got {self.frac_match}")
        if self.seed < 0:
            raise WorkloadError(f"--seed must be 0 or more, got {self.seed}")
        if not 0 < self.timeout < math.inf:  # NaN fails it too
            raise WorkloadError(f"--timeout must be a positive finite number of seconds, "
                                f"got {self.timeout}")
        _choice("--transport", self.transport, TRANSPORTS)
        _choice("--backend", self.backend, BACKENDS)
        _choice("--mpi-pml", self.mpi_pml, MPI_PMLS)
        _choice("--protocol", self.protocol, PROTOCOLS)
        _choice("--dask-shuffle", self.dask_shuffle, DASK_SHUFFLES)
        _choice("--verify", self.verify, VERIFY_MODES)
        if self.fault is not None and not 0 <= self.fault.rank < self.workers:
            raise WorkloadError(f"--inject-fault: rank {self.fault.rank} is not a worker "
                                f"(0..{self.workers - 1})")
        return self

    @property
    def total_iterations(self) -> int:
        """Warm-up plus timed iterations."""
        return self.warmup + self.iterations

    @property
    def full_verify(self) -> bool:
        """Whether merged rows are compared with a single-process pandas merge."""
        if self.verify == "full":
            return True
        if self.verify == "count":
            return False
        return self.workers * self.chunk_size <= self.verify_limit

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (used to hand the configuration to worker processes)."""
        d = asdict(self)
        d["mpi_args"] = list(self.mpi_args)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MergeConfig:
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        d["mpi_args"] = tuple(d.get("mpi_args", ()))
        if d.get("fault"):
            d["fault"] = Fault(**d["fault"])
        return cls(**d)


def _choice(option: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise WorkloadError(f"{option}: unknown value {value!r}; choose one of {', '.join(valid)}")


def local_workers(cfg: MergeConfig) -> int:
    """How many of ``cfg``'s workers a launch starts on this host (at least one of them
    where others run elsewhere: a hostfile, an existing Dask cluster)."""
    elsewhere = cfg.hostfile or cfg.scheduler or cfg.scheduler_file
    return 1 if elsewhere else cfg.workers


def memory_need(cfg: MergeConfig, local_workers: int) -> int:
    """Bytes the ``local_workers`` workers of ``cfg`` that run on this host will hold at
    their peak (:data:`BYTES_PER_ROW` per chunk row plus :data:`WORKER_BASE_BYTES` each)."""
    return local_workers * (WORKER_BASE_BYTES + BYTES_PER_ROW * cfg.chunk_size)


def memory_problem(cfg: MergeConfig, local_workers: int, available: int, *,
                   chunk: str = "--chunk-size", workers: str = "--workers") -> str | None:
    """Why the ``local_workers`` workers of ``cfg`` on this host cannot fit in ``available``
    bytes (the kernel's MemAvailable), naming the size and count as ``chunk`` and
    ``workers`` (the command line's options, or a study's parameters); None if they fit."""
    need = memory_need(cfg, local_workers)
    if need <= available:
        return None
    return (f"{chunk} {cfg.chunk_size} with {local_workers} worker(s) on this host needs "
            f"about {need / 2**30:.1f} GiB of memory ({WORKER_BASE_BYTES >> 20} MiB + "
            f"{BYTES_PER_ROW} bytes per row per worker); {available / 2**30:.1f} GiB is "
            f"available (MemAvailable): use a smaller {chunk} or fewer {workers} per host")


def check_memory(cfg: MergeConfig, local_workers: int, available: int) -> None:
    """Refuse, before anything is allocated, a run whose workers on this host would need
    more than ``available`` bytes (the kernel's MemAvailable): a one-line error instead of
    a MemoryError traceback per worker, or an OOM kill of the machine."""
    problem = memory_problem(cfg, local_workers, available)
    if problem is not None:
        raise WorkloadError(problem)
