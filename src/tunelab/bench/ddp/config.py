"""The DDP benchmark's settings, validated in one place for every entry point.

Every count and size a user gives is bounded here, before anything is allocated.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from tunelab.bench.ddp.profiles import Profile

if TYPE_CHECKING:
    from tunelab.bench.ddp.fabric import Fabric
from tunelab.bench.faults import fault_fields
from tunelab.errors import WorkloadError

__all__ = [
    "CACHE_MODES",
    "DATA_SOURCES",
    "MODELS",
    "PLACEMENTS",
    "Compute",
    "DDPConfig",
    "DataSpec",
    "Fault",
    "parse_compute",
    "parse_data",
    "parse_fault",
    "parse_rate",
]

MODELS = ("resnet18", "resnet50", "leopard", "unet3d")
PLACEMENTS = ("local", "vnodes")
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")
AMP_MODES = ("auto", "on", "off")
#: Where a worker's batches come from: one batch made once, samples held in RAM (made up,
#: or read and decoded once from a dataset), or samples read from a dataset on disk.
DATA_SOURCES = ("synthetic", "memory", "memory:DIR", "files:DIR")
#: How the page cache is treated for ``files:``: dropped before every epoch, filled before
#: the run, or left as found.
CACHE_MODES = ("cold", "warm", "keep")
ON_CORRUPT = ("skip", "fail")
#: ``gpu``: nvJPEG on the worker's CUDA device (torchvision.io.decode_jpeg), loaders read bytes
DECODE = ("on", "off", "gpu")
MAX_LOADER_WORKERS = 64
MAX_PREFETCH = 64
MIN_RATE = 1e3
MAX_RATE = 1e13
_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*([kKMGT]i?)?B(?:/s)?\s*$")
_UNITS = {None: 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2.0 ** 10,
          "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40, "KI": 2.0 ** 10}

MAX_WORKERS = 1024
MAX_NODES = 256
MAX_BATCH = 1 << 16
MAX_STEPS = 100_000
MAX_EMULATED_S = 3600.0
MAX_IMAGE = 1024
MAX_WINDOW = 1 << 20
MAX_LINK_GBIT = 1000.0


@dataclass(frozen=True)
class Compute:
    """How a step's forward and backward pass happen: ``real`` computes them; ``emulate``
    waits ``seconds`` instead (an emulated accelerator) and still all-reduces real gradient
    buffers of the model's size."""

    emulated: bool = False
    seconds: float = 0.0
    profile: Profile | None = None

    def __str__(self) -> str:
        if self.profile is not None:
            return f"emulate:{self.profile.name}"
        return f"emulate:{self.seconds:g}" if self.emulated else "real"


def parse_compute(text: str) -> Compute:
    """``real``, ``emulate:SECONDS`` (0 < SECONDS <= 3600) or ``emulate:PROFILE``
    (``MODEL/ACCELERATOR/bBATCH[/PRECISION]`` from :mod:`tunelab.bench.ddp.profiles`)."""
    text = text.strip()
    if text == "real":
        return Compute()
    kind, sep, value = text.partition(":")
    if kind != "emulate" or not sep:
        raise WorkloadError(f"--compute: expected 'real', 'emulate:SECONDS' or "
                            f"'emulate:MODEL/ACCELERATOR/bBATCH', got {text!r}")
    if "/" in value:
        from tunelab.bench.ddp.profiles import find_profile

        profile = find_profile(value)
        return Compute(True, profile.step_s, profile)
    try:
        seconds = float(value)
    except ValueError:
        raise WorkloadError(f"--compute: {value!r} is not a number of seconds") from None
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_EMULATED_S):
        raise WorkloadError(f"--compute: emulated seconds must lie in (0, {MAX_EMULATED_S:g}], "
                            f"got {value}")
    return Compute(True, seconds)


@dataclass(frozen=True)
class DataSpec:
    """A parsed ``--data``: ``kind`` is synthetic, memory or files; ``path`` the dataset
    directory (``files:``, and ``memory:DIR``, which decodes that dataset into RAM once)."""

    kind: str
    path: str = ""

    def __str__(self) -> str:
        return f"{self.kind}:{self.path}" if self.path else self.kind


def parse_data(text: str) -> DataSpec:
    """``synthetic``, ``memory``, ``memory:DIR`` or ``files:DIR``."""
    kind, sep, path = text.strip().partition(":")
    if kind in ("synthetic", "memory") and not sep:
        return DataSpec(kind)
    if kind in ("memory", "files") and sep and path.strip():
        return DataSpec(kind, path.strip())
    if kind == "files":
        raise WorkloadError("--data files: needs the dataset directory: files:DIR")
    raise WorkloadError(f"--data: unknown value {text!r}; choose one of "
                        f"{', '.join(DATA_SOURCES)}")


def parse_rate(text: str) -> float:
    """Bytes per second of ``200MB/s``, ``1.5 GB/s``, ``100MiB/s``, ``500kB/s`` (decimal
    MB = 10^6 B, binary MiB = 2^20 B)."""
    m = _RATE.match(text)
    if not m:
        raise WorkloadError(f"--read-limit: expected a rate such as 200MB/s or 100MiB/s, "
                            f"got {text!r}")
    rate = float(m.group(1)) * _UNITS[m.group(2)]
    if not MIN_RATE <= rate <= MAX_RATE:
        raise WorkloadError(f"--read-limit must lie in 1kB/s..10TB/s, got {text!r}")
    return rate


@dataclass(frozen=True)
class Fault:
    """A fault injected for tests: worker ``rank`` kills itself before timed step ``step``
    (``action=kill``) or kills its first data-loader process then (``action=kill-loader``),
    or node ``node`` is never started (``action=absent``: the rendezvous cannot complete)."""

    action: str
    rank: int = -1
    step: int = 0
    node: int = -1


def parse_fault(text: str | None) -> Fault | None:
    """``rank=1,step=2,action=kill`` or ``node=1,action=absent``."""
    if not text:
        return None
    fields = fault_fields(text, {"rank", "step", "node", "action"})
    action = fields.get("action", "kill")
    if action not in ("kill", "kill-loader", "absent"):
        raise WorkloadError(f"--inject-fault: action must be kill, kill-loader or absent, "
                            f"got {action!r}")
    try:
        return Fault(action=action, rank=int(fields.get("rank", "-1")),
                     step=int(fields.get("step", "0")), node=int(fields.get("node", "-1")))
    except ValueError as exc:
        raise WorkloadError(f"--inject-fault: bad number in {text!r} ({exc})") from None


@dataclass(frozen=True)
class DDPConfig:
    """Everything one benchmark run needs; :meth:`validate` gives one-line errors.

    ``batch_size`` is the *global* batch: each of the ``workers`` processes trains on
    ``batch_size / workers`` samples per step. ``nodes`` x ``workers / nodes`` is the layout.
    """

    model: str = "resnet50"
    image_size: int = 224
    window: int = 2048
    batch_size: int = 64
    workers: int = 1
    nodes: int = 1
    steps: int = 10
    warmup: int = 2
    #: the most untimed steps (None: :func:`tunelab.bench.ddp.warmup.max_warmup`)
    max_warmup: int | None = None
    compute: str = "real"
    data: str = "synthetic"
    loader_workers: int = 2
    prefetch: int = 2
    cache: str = "cold"
    read_limit: str | None = None
    decode: str = "on"
    on_corrupt: str = "skip"
    patch: int = 128
    device: str = "auto"
    backend: str = "auto"
    amp: str = "auto"
    threads: int | None = None
    bucket_mb: float = 25.0
    allreduce: str = "auto"
    fabric: str = "auto"
    placement: str = "local"
    link_gbit: float = 0.0
    timeout: float = 120.0
    rendezvous_timeout: float = 180.0
    port: int = 0
    seed: int = 0
    fault: Fault | None = field(default=None)

    def validate(self) -> DDPConfig:
        """Return self, or raise :class:`WorkloadError` naming the bad option and value."""
        _choice("--model", self.model, MODELS)
        _choice("--placement", self.placement, PLACEMENTS)
        _choice("--device", self.device, DEVICES)
        _choice("--backend", self.backend, BACKENDS)
        _choice("--amp", self.amp, AMP_MODES)
        data = parse_data(self.data)
        _choice("--cache", self.cache, CACHE_MODES)
        _choice("--decode", self.decode, DECODE)
        _choice("--on-corrupt", self.on_corrupt, ON_CORRUPT)
        from tunelab.bench.ddp.fabric import ALLREDUCE_MODES

        _choice("--allreduce", self.allreduce, ALLREDUCE_MODES)
        _bounded("--loader-workers", self.loader_workers, 0, MAX_LOADER_WORKERS)
        _bounded("--prefetch", self.prefetch, 1, MAX_PREFETCH)
        _bounded("--patch", self.patch, 64, 512)
        if self.patch % 32:
            raise WorkloadError(f"--patch must be a multiple of 32 (the 3-D U-Net halves it 5 "
                                f"times), got {self.patch}")
        if self.read_limit is not None:
            parse_rate(self.read_limit)
            if data.kind != "files":
                raise WorkloadError("--read-limit applies to --data files:DIR (a limit on "
                                    "reads from the block device that holds the dataset)")
        if self.model == "leopard" and data.kind != "synthetic" and data.path:
            raise WorkloadError(f"--data {self.data}: datasets hold images or volumes; the "
                                "leopard model reads its own data (tunelab leopard train)")
        _bounded("--workers", self.workers, 1, MAX_WORKERS)
        _bounded("--nodes", self.nodes, 1, MAX_NODES)
        _bounded("--batch-size", self.batch_size, 1, MAX_BATCH)
        _bounded("--steps", self.steps, 1, MAX_STEPS)
        _bounded("--warmup", self.warmup, 0, MAX_STEPS)
        if self.max_warmup is not None:
            _bounded("--max-warmup", self.max_warmup, 0, MAX_STEPS)
        _bounded("--image-size", self.image_size, 32, MAX_IMAGE)
        _bounded("--window", self.window, 32, MAX_WINDOW)
        _bounded("--port", self.port, 0, 65535)
        if self.threads is not None:
            _bounded("--threads", self.threads, 1, 1024)
        if self.workers % self.nodes:
            raise WorkloadError(f"--nodes {self.nodes} does not divide --workers {self.workers}: "
                                "every node runs the same number of workers")
        if self.batch_size % self.workers:
            raise WorkloadError(f"--workers {self.workers} does not divide the global "
                                f"--batch-size {self.batch_size}: each worker trains on an equal "
                                f"share (try --batch-size "
                                f"{max(1, self.batch_size // self.workers) * self.workers})")
        if self.model == "leopard" and self.window % 32:
            raise WorkloadError(f"--window must be a multiple of 32 (the U-Net halves it 5 "
                                f"times), got {self.window}")
        compute = parse_compute(self.compute)
        if compute.profile is not None:
            p = compute.profile
            if p.model != self.model:
                raise WorkloadError(f"--compute emulate:{p.name} emulates {p.model}, but "
                                    f"--model is {self.model}")
            if p.batch != self.local_batch:
                raise WorkloadError(f"--compute emulate:{p.name} is a step of {p.batch} samples "
                                    f"per accelerator, but each worker trains on "
                                    f"{self.local_batch} (--batch-size {self.batch_size} / "
                                    f"--workers {self.workers}); use --batch-size "
                                    f"{p.batch * self.workers}")
        if self.allreduce == "emulate" and not compute.emulated:
            raise WorkloadError("--allreduce emulate needs --compute emulate:…: real compute "
                                "all-reduces real gradients (--allreduce real, or off)")
        if self.allreduce_mode == "emulate":
            self.fabric_spec  # noqa: B018  (an unknown name is refused here)
        elif self.fabric != "auto":
            raise WorkloadError(f"--fabric {self.fabric} applies to --allreduce emulate (the "
                                f"all-reduce here is {self.allreduce_mode})")
        if self.decode == "gpu":
            if self.device == "cpu":
                raise WorkloadError("--decode gpu needs --device cuda (nvJPEG on the GPU)")
            if data.kind != "files" or self.model == "unet3d":
                raise WorkloadError("--decode gpu decodes JPEG images read from files: use "
                                    "--data files:DIR with a ResNet model")
        for name, value, high in (("--bucket-mb", self.bucket_mb, 4096.0),
                                  ("--timeout", self.timeout, 86400.0),
                                  ("--rendezvous-timeout", self.rendezvous_timeout, 86400.0)):
            if not (math.isfinite(value) and 0 < value <= high):
                raise WorkloadError(f"{name} must lie in (0, {high:g}], got {value}")
        if not (math.isfinite(self.link_gbit) and 0 <= self.link_gbit <= MAX_LINK_GBIT):
            raise WorkloadError(f"--link-gbit must lie in [0, {MAX_LINK_GBIT:g}] "
                                f"(0 = no limit), got {self.link_gbit}")
        if self.link_gbit and self.placement != "vnodes":
            raise WorkloadError("--link-gbit needs --placement vnodes (a link limit applies "
                                "between virtual nodes)")
        if self.backend == "nccl" and self.device == "cpu":
            raise WorkloadError("--backend nccl needs --device cuda (gloo is the CPU backend)")
        f = self.fault
        if f is not None:
            if f.action in ("kill", "kill-loader") and not 0 <= f.rank < self.workers:
                raise WorkloadError(f"--inject-fault: rank {f.rank} is not a worker "
                                    f"(0..{self.workers - 1})")
            if f.action == "absent" and not 0 < f.node < self.nodes:
                raise WorkloadError(f"--inject-fault: node {f.node} must lie in 1..{self.nodes - 1}"
                                    " (node 0 hosts the rendezvous)")
            if f.action == "kill-loader" and (data.kind == "synthetic" or not self.loader_workers):
                raise WorkloadError("--inject-fault action=kill-loader needs data-loader "
                                    "processes (--data memory or files, --loader-workers >= 1)")
        return self

    @property
    def workers_per_node(self) -> int:
        """Workers on each node."""
        return self.workers // self.nodes

    @property
    def read_ahead(self) -> int:
        """Batches a worker's loader processes may hold read before they are asked for
        (``--prefetch`` per loader process; none without loader processes or data)."""
        return 0 if self.data_spec.kind == "synthetic" else self.prefetch * self.loader_workers

    @property
    def warmup_steps(self) -> int:
        """Untimed steps: ``--warmup``, at least :attr:`read_ahead`, so that the timed steps
        do not begin on batches the loaders read during the start-up (on storage too slow
        for the accelerators, 6 timed steps after 2 warm-up ones with 4 loaders x prefetch 2
        measured the read-ahead: AU 99.7 % and 425 MB/s on a disk throttled to 150 MB/s)."""
        return max(self.warmup, self.read_ahead)

    @property
    def warmup_max_steps(self) -> int:
        """The most untimed steps: after :attr:`warmup_steps` the warm-up goes on until the
        loaders' read-ahead has drained or keeps pace (:mod:`tunelab.bench.ddp.warmup`), at
        most this many: ``--max-warmup`` (never below :attr:`warmup_steps`; equal to it, a
        fixed warm-up), by default :func:`tunelab.bench.ddp.warmup.max_warmup`."""
        from tunelab.bench.ddp.warmup import max_warmup

        if self.max_warmup is not None:
            return max(self.warmup_steps, self.max_warmup)
        return max_warmup(self.warmup_steps, self.read_ahead)

    @property
    def local_batch(self) -> int:
        """Samples per worker and step."""
        return self.batch_size // self.workers

    @property
    def data_spec(self) -> DataSpec:
        """The parsed ``data`` option."""
        return parse_data(self.data)

    @property
    def read_limit_bps(self) -> float | None:
        """``read_limit`` in bytes per second (None: no limit)."""
        return parse_rate(self.read_limit) if self.read_limit else None

    @property
    def compute_mode(self) -> Compute:
        """The parsed ``compute`` option."""
        return parse_compute(self.compute)

    @property
    def allreduce_mode(self) -> str:
        """``emulate``, ``real`` or ``off`` (``auto``: emulate under emulated compute)."""
        if self.allreduce != "auto":
            return self.allreduce
        return "emulate" if self.compute_mode.emulated else "real"

    @property
    def fabric_spec(self) -> Fabric:
        """The fabric ``--allreduce emulate`` models: ``--fabric``, else the profile's
        accelerator's, else :data:`~tunelab.bench.ddp.fabric.DEFAULT_FABRIC`'s."""
        from tunelab.bench.ddp.fabric import DEFAULT_FABRIC, find_fabric, load_fabrics

        name = self.fabric
        if name == "auto":
            profile = self.compute_mode.profile
            fabrics = load_fabrics()
            name = profile.accelerator if profile and profile.accelerator in fabrics \
                else DEFAULT_FABRIC
            return find_fabric(name, fabrics)
        return find_fabric(name)

    def node_of(self, rank: int) -> int:
        """The node hosting global ``rank`` (ranks are numbered node by node)."""
        return rank // self.workers_per_node

    def ranks_of(self, node: int) -> range:
        """The global ranks on ``node``."""
        w = self.workers_per_node
        return range(node * w, (node + 1) * w)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (hands the configuration to worker processes)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DDPConfig:
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        if d.get("fault"):
            d["fault"] = Fault(**d["fault"])
        return cls(**d)


def _choice(option: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise WorkloadError(f"{option}: unknown value {value!r}; choose one of {', '.join(valid)}")


def _bounded(option: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise WorkloadError(f"{option} must lie in {low}..{high}, got {value}")
