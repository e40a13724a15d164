"""Where a worker's batches come from: ``synthetic``, ``memory``, ``memory:DIR``, ``files:DIR``.

A :class:`DataSource` hands out one local batch per step, on the worker's device, with the
accounting of how it was obtained (``info``: samples, bytes read, the kernel's counts for
the same reads, corrupt samples skipped; see :mod:`tunelab.bench.ddp.samples`).

* ``synthetic``: one random batch made once and served every step, as the synthetic modes
  of the Horovod and torchvision benchmarks do: the figures measure training and
  communication, not input (:mod:`tunelab.bench.ddp.synthetic`).
* ``memory``: decoded samples held in RAM (made up, or ``memory:DIR``: this worker's share of
  a dataset read and decoded once before training), batched every step through the same
  DataLoader path as files: infinitely fast storage, with the batching cost still paid
  (with ``--decode off`` a batch is a view of one blank sample, as files then give).
* ``files:DIR``: samples read from the dataset on every step through a
  ``torch.utils.data.DataLoader`` (``--loader-workers`` processes, ``--prefetch`` batches
  each, pinned memory on CUDA); one file per sample (JPEG folders, ``.npz`` volumes; a
  ``DistributedSampler`` deals them to the workers, reshuffled every epoch) or tar shards
  (each worker's loaders stream the shards the epoch's plan gives them). With ``--cache
  cold`` each worker drops the pages of the files it reads next before every epoch; that
  time is ``drop_s``, kept apart from the wait for data.
"""

from __future__ import annotations

import math
import os
import re
import signal
import time
import warnings
from typing import TYPE_CHECKING, Any, Protocol

from tunelab.bench.ddp.config import DDPConfig
from tunelab.bench.ddp.models import ModelSpec
from tunelab.bench.ddp.synthetic import SyntheticSource, memory_pool_size, random_samples
from tunelab.errors import WorkloadError
from tunelab.sysinfo import mem_available

if TYPE_CHECKING:
    import torch

    from tunelab.bench.ddp.dataset import DatasetIndex
    from tunelab.bench.ddp.gpudecode import DecodeAhead
    from tunelab.bench.ddp.samples import Batch, Decoder
    from tunelab.bench.ddp.sampling import EpochChain

__all__ = ["DataSource", "LoaderFailure", "LoaderSource", "check_dataset", "make_source"]

#: decoded samples a worker may hold for ``memory:DIR``, as a share of the memory available
MEMORY_FRACTION = 0.5
MAX_EPOCHS = 100_000
_DEAD = re.compile(r"DataLoader worker \(pids?\(?s?\)? ?([\d, ]+)\) "
                   r"(?:is killed by signal: ([^.]+)|exited unexpectedly)")


class LoaderFailure(RuntimeError):
    """A data-loader process died, or a corrupt sample under ``--on-corrupt fail``."""


class DataSource(Protocol):
    """One worker's supply of batches."""

    name: str
    #: seconds the last :meth:`next_batch` spent dropping the page cache (not waiting)
    drop_s: float

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """The next local batch on the worker's device, and its accounting."""
        ...

    def close(self) -> None:
        """Stop the loader processes (if any)."""
        ...

    def kill_loader(self) -> None:
        """Fault injection: SIGKILL the first loader process."""
        ...

    def translate(self, exc: Exception) -> Exception:
        """The data loader's "worker died" error (or a broken connection to a loader that
        died) as a :class:`LoaderFailure` naming the process; any other error unchanged."""
        ...

    def summary(self) -> dict[str, Any]:
        """Epochs begun, corrupt files named, what was done to the page cache."""
        ...


def _decoder(cfg: DDPConfig, unit: str) -> Decoder:
    from tunelab.bench.ddp.samples import Decoder

    return Decoder(unit, cfg.image_size, cfg.patch, cfg.decode == "on",
                   encoded=cfg.decode == "gpu")


def check_dataset(cfg: DDPConfig, spec_unit: str) -> DatasetIndex | None:
    """Index ``cfg``'s dataset and check it fits the run (model, one global batch, the
    memory for ``memory:DIR``); one-line errors. None for sources without a dataset."""
    from tunelab.bench.ddp.dataset import index_dataset, shard_plan

    data = cfg.data_spec
    if not data.path:
        return None
    index = index_dataset(data.path)
    where = f"--data {data}"
    if index.unit != spec_unit:
        raise WorkloadError(f"{where} holds {index.unit} ({index.layout}); --model {cfg.model} "
                            f"trains on {spec_unit}")
    if data.kind == "memory" and index.layout == "tar-shards":
        raise WorkloadError(f"{where}: memory: decodes one file per sample; read tar shards "
                            "with files:")
    if index.layout == "tar-shards":
        _, steps = shard_plan(index, 0, cfg.seed, cfg.workers, cfg.loader_workers,
                              cfg.local_batch)
        if steps < 1:
            raise WorkloadError(
                f"{where}: {index.samples} samples in {len(index.entries)} shard(s) do not give "
                f"every worker one batch of {cfg.local_batch} (a global batch of "
                f"{cfg.batch_size}, each loader batching its own shards); make more samples "
                "or smaller shards, or use fewer workers or loaders")
    elif index.samples < cfg.batch_size:
        raise WorkloadError(f"{where} holds {index.samples} samples, fewer than one global "
                            f"batch of {cfg.batch_size} (--batch-size)")
    if data.kind == "memory":
        per_sample = 4 * math.prod(_decoder(cfg, index.unit).shape())
        need = per_sample * (index.samples // cfg.workers) * cfg.workers
        avail = mem_available()
        if need > MEMORY_FRACTION * avail:
            raise WorkloadError(f"{where}: the decoded samples need about {need / 1e9:.1f} GB, "
                                f"more than {MEMORY_FRACTION:.0%} of the {avail / 1e9:.1f} GB "
                                "available; use files: or fewer samples")
    return index


class LoaderSource:
    """Batches through a DataLoader: ``memory`` pools, or ``files:`` datasets."""

    def __init__(self, cfg: DDPConfig, spec: ModelSpec, device: torch.device, rank: int,
                 world: int, status_dir: str | None, index: DatasetIndex | None) -> None:
        import torch
        from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

        from tunelab.bench.ddp import samples as S
        from tunelab.bench.ddp.handover import pack
        from tunelab.bench.ddp.sampling import Cycle, EpochChain

        self.name = cfg.data_spec.kind
        self.drop_s = 0.0
        self._cfg = cfg
        self._rank = rank
        self._device = device
        self._status_dir = status_dir
        self._index = index
        self._epoch = -1
        self._left = 0
        self._corrupt_files: list[str] = []
        self._cold = self.name == "files" and cfg.cache == "cold"
        self._dropped = 0
        self._pin = device.type == "cuda"
        self._plans: dict[int, list[list[int]]] = {}
        self._epoch_steps: dict[int, int] = {}
        self._it: Any = None
        self._chain: EpochChain | None = None
        self._ahead: DecodeAhead | None = None
        gen = torch.Generator().manual_seed(cfg.seed + rank)
        unit = "volumes" if spec.task == "segment3d" else "images"
        decoder = _decoder(cfg, unit) if index is not None else None
        self._sampler: Any = None
        dataset: Any
        sampler: Any = None
        if index is None:  # made-up samples in RAM
            blank = cfg.decode == "off"  # files would give blanks: so does memory
            x, y = random_samples(spec, 1 if blank else memory_pool_size(cfg.local_batch), gen)
            dataset = S.MemorySamples(x, y, blank)
            sampler = BatchSampler(Cycle(len(dataset), cfg.seed + rank), cfg.local_batch,
                                   drop_last=True)
        elif self.name == "memory":
            assert decoder is not None
            dataset = self._decode_share(index, decoder, world)
            sampler = BatchSampler(Cycle(len(dataset), cfg.seed + rank), cfg.local_batch,
                                   drop_last=True)
        elif index.layout == "tar-shards":
            assert decoder is not None
            decoder_ready(decoder)
            self._plan_epochs(index, world)
            import multiprocessing as mp

            self._shared_epoch = mp.Value("i", 0)
            dataset = S.ShardStream(index, decoder, cfg.local_batch, self._plans,
                                    self._shared_epoch, cfg.on_corrupt == "fail")
        else:
            assert decoder is not None
            decoder_ready(decoder)
            dataset = S.FileSamples(index, decoder, cfg.on_corrupt == "fail")
            self._sampler = DistributedSampler(dataset, num_replicas=world, rank=rank,
                                               shuffle=True, seed=cfg.seed, drop_last=True)
            if self._cold:  # pages are dropped between epochs: one iterator per epoch
                sampler = BatchSampler(self._sampler, cfg.local_batch, drop_last=True)
            else:  # one iterator for all epochs: the prefetch runs across an epoch's end
                self._chain = EpochChain(self._sampler, cfg.local_batch)
                sampler = self._chain
        loaders = cfg.loader_workers
        kwargs: dict[str, Any] = {}
        if loaders:
            kwargs = {"prefetch_factor": cfg.prefetch, "persistent_workers": True,
                      "worker_init_fn": self._worker_init}
        kwargs.update(collate_fn=pack, num_workers=loaders, pin_memory=self._pin,
                      generator=gen)
        with warnings.catch_warnings():  # more loaders than cores is the study's own choice
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            if sampler is not None:  # map-style: the sampler deals whole batches of indices
                self._loader = DataLoader(dataset, batch_sampler=sampler, **kwargs)
            else:  # an iterable dataset yields whole batches
                self._loader = DataLoader(dataset, batch_size=None, **kwargs)

    # ------------------------------------------------------------------ set-up

    def _worker_init(self, loader: int) -> None:
        if self._status_dir:
            from tunelab.bench.ddp.samples import loader_pid_file

            with open(loader_pid_file(self._status_dir, self._rank, loader), "w") as f:
                f.write(str(os.getpid()))

    def _plan_epochs(self, index: DatasetIndex, world: int) -> None:
        from tunelab.bench.ddp.dataset import shard_plan

        cfg = self._cfg
        need = cfg.warmup_max_steps + cfg.steps
        for epoch in range(MAX_EPOCHS):
            plan, steps = shard_plan(index, epoch, cfg.seed, world, cfg.loader_workers,
                                     cfg.local_batch)
            if steps < 1:
                raise WorkloadError(f"--data {cfg.data}: epoch {epoch} gives a worker no batch")
            self._plans[epoch] = plan[self._rank]
            self._epoch_steps[epoch] = steps
            need -= steps
            if need <= 0:
                return

    def _decode_share(self, index: DatasetIndex, decoder: Decoder, world: int) -> Any:
        """This worker's share of the dataset, decoded into RAM (``memory:DIR``)."""
        import torch

        from tunelab.bench.ddp import samples as S

        decoder_ready(decoder)
        files = S.FileSamples(index, decoder, self._cfg.on_corrupt == "fail")
        mine = list(range(self._rank, len(files) - len(files) % world, world))
        xs, ys = [], []
        for a in range(0, len(mine), 64):
            b = files.__getitems__(mine[a:a + 64])
            self._check(b.info)
            xs.append(b.x)
            ys.append(b.y)
        x, y = torch.cat(xs), torch.cat(ys)
        if len(x) < self._cfg.local_batch:
            raise WorkloadError(f"--data {self._cfg.data}: {len(x)} readable samples per "
                                f"worker, fewer than one local batch of {self._cfg.local_batch}")
        return S.MemorySamples(x, y)

    # ------------------------------------------------------------------ epochs

    def _files_of_epoch(self, epoch: int) -> list[str]:
        assert self._index is not None
        if self._plans:
            return [self._index.path(self._index.entries[i])
                    for loader in self._plans[epoch] for i in loader]
        self._sampler.set_epoch(epoch)
        take = self._epoch_steps[epoch] * self._cfg.local_batch
        return [self._index.path(self._index.entries[i]) for i in list(self._sampler)[:take]]

    def _new_epoch(self) -> float:
        """Begin the next epoch; the seconds spent dropping its files' pages (cold cache)."""
        from tunelab.bench.ddp.cache import drop_file_pages

        self._epoch += 1
        epoch = self._epoch
        if self._index is None or self.name == "memory":
            self._epoch_steps[epoch] = 1 << 62  # a memory pool cycles for ever
        elif self._chain is not None:  # the chain deals every epoch's batches in turn
            self._epoch_steps[epoch] = self._chain.steps
            self._left = self._chain.steps
            if self._it is None:
                self._it = iter(self._loader)
            return 0.0
        elif self._sampler is not None:
            self._epoch_steps[epoch] = len(self._sampler) // self._cfg.local_batch
            self._sampler.set_epoch(epoch)
        elif epoch not in self._plans:
            raise WorkloadError(f"--data {self._cfg.data}: no plan for epoch {epoch}")
        else:
            self._shared_epoch.value = epoch
        drop = 0.0
        if self._cold:
            t = time.perf_counter()
            self._dropped += drop_file_pages(self._files_of_epoch(epoch))
            drop = time.perf_counter() - t
        self._left = self._epoch_steps[epoch]
        with warnings.catch_warnings():  # more loaders than cores is the study's own choice
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            self._it = iter(self._loader)
        return drop

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """The next batch on the device (a new epoch begins when this one is used up)."""
        import torch

        from tunelab.bench.ddp.handover import to_device

        if self._cfg.decode == "gpu":  # decoded on the GPU by a thread, ahead of the step
            if self._ahead is None:
                from tunelab.bench.ddp.gpudecode import DecodeAhead

                self._ahead = DecodeAhead(self._fetch, self._cfg.image_size, self._device,
                                          self._cfg.seed + self._rank,
                                          self._cfg.warmup_max_steps + self._cfg.steps,
                                          fail_on_corrupt=self._cfg.on_corrupt == "fail",
                                          check=self._check)
            t = time.perf_counter()
            x, y, info, drop = self._ahead.next()
            # the drop ran in the thread: it held this wait up by at most the wait itself
            self.drop_s = min(drop, time.perf_counter() - t)
            return x, y, info
        batch, self.drop_s = self._fetch()
        x, y = batch.x, batch.y
        if self._device.type == "cuda":
            x, y = to_device(x, self._device), to_device(y, self._device)
            torch.cuda.current_stream(self._device).synchronize()
        return x, y, batch.info

    def _fetch(self) -> tuple[Batch, float]:
        """The next batch from the loaders, unpacked, and the seconds spent dropping the page
        cache for the epoch it begins (0 for the other batches)."""
        from tunelab.bench.ddp.handover import unpack

        drop = self._new_epoch() if self._left <= 0 else 0.0
        try:
            batch = next(self._it)
        except StopIteration:
            bad = f" (corrupt: {'; '.join(self._corrupt_files)})" if self._corrupt_files else ""
            raise LoaderFailure(f"the data loader of worker {self._rank} ran out of batches "
                                f"in epoch {self._epoch} after "
                                f"{self._epoch_steps[self._epoch] - self._left} of "
                                f"{self._epoch_steps[self._epoch]}{bad}") from None
        except (RuntimeError, OSError, EOFError) as exc:
            raise self.translate(exc) from None
        self._left -= 1
        self._check(batch.info)
        return unpack(batch), drop

    def _check(self, info: dict[str, Any]) -> None:
        for name in info.get("corrupt_files", ()):
            if len(self._corrupt_files) < 5:
                self._corrupt_files.append(name)
        if info.get("fatal"):
            raise LoaderFailure(f"{info['fatal']} (--on-corrupt fail)")

    def _loader_of(self, pid: int) -> int | None:
        if not self._status_dir:
            return None
        from tunelab.bench.ddp.samples import loader_pid_file

        for w in range(self._cfg.loader_workers):
            try:
                with open(loader_pid_file(self._status_dir, self._rank, w)) as f:
                    if int(f.read().strip()) == pid:
                        return w
            except (OSError, ValueError):
                continue
        return None

    def translate(self, exc: Exception) -> Exception:
        """The data loader's "worker died" error (or a broken connection to a loader that
        died: the file descriptors of a batch come over a socket from the loader) as a
        :class:`LoaderFailure` naming the process, its index, pid and signal; any other
        error unchanged."""
        from tunelab.bench.ddp.samples import signal_text

        procs = getattr(self._it, "_workers", None) or []
        m = _DEAD.search(str(exc))
        if m:
            pid = int(m.group(1).split(",")[0])
            code = next((p.exitcode for p in procs if p.pid == pid), None)
        else:  # a broken connection: a loader may be dying still; give it 2 s to be seen
            deadline = time.monotonic() + 2.0
            while not (dead := [p for p in procs if p.exitcode is not None]):
                if time.monotonic() > deadline:
                    return exc
                time.sleep(0.05)
            pid, code = dead[0].pid, dead[0].exitcode
        if m and m.group(2):
            how = f"killed by {signal_text(m.group(2).strip())}"
        elif code is not None and code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with status {code}" if code is not None else "exited"
        w = self._loader_of(pid)
        who = f"data-loader process {w}" if w is not None else "a data-loader process"
        return LoaderFailure(f"{who} of worker {self._rank} (pid {pid}) died: {how}")

    # ------------------------------------------------------------------ end

    def close(self) -> None:
        """Stop the decoding thread (--decode gpu) and the loader processes."""
        if self._ahead is not None:
            self._ahead.close()
        it, self._it = self._it, None
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    def kill_loader(self) -> None:
        """SIGKILL loader process 0 of this worker (its pid from the status directory)."""
        from tunelab.bench.ddp.samples import loader_pid_file

        if not self._status_dir or not self._cfg.loader_workers:
            return
        with open(loader_pid_file(self._status_dir, self._rank, 0)) as f:
            os.kill(int(f.read().strip()), signal.SIGKILL)

    def summary(self) -> dict[str, Any]:
        """Epochs begun, corrupt files named, the page-cache handling of this worker."""
        cache = "n/a"
        if self.name == "files":
            cache = self._cfg.cache
        return {"epochs": self._epoch + 1, "corrupt_files": self._corrupt_files,
                "cache": cache, "dropped_files": self._dropped}


def decoder_ready(decoder: Decoder) -> None:
    """Import the decoders once in this process, before loader processes fork, so the
    first batches' reads are not mixed with module imports."""
    if decoder.unit == "images" and decoder.decode:
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (16, 16)).save(buf, "JPEG")
        decoder(buf.getvalue(), 0)  # the whole path once: Pillow's plugins, torchvision
    elif decoder.unit == "volumes" and decoder.decode:
        import io

        import numpy as np

        buf = io.BytesIO()
        np.savez(buf, x=np.zeros((1, 1, 1, 1), np.float32), y=np.zeros((1, 1, 1, 1), np.uint8))
        decoder(buf.getvalue(), 0)


def make_source(cfg: DDPConfig, spec: ModelSpec, device: torch.device, rank: int, world: int,
                status_dir: str | None = None) -> DataSource:
    """The data source ``cfg.data`` names, for this worker."""
    kind = cfg.data_spec.kind
    if kind == "synthetic":
        return SyntheticSource(spec, cfg.local_batch, device, cfg.seed + rank)
    unit = "volumes" if spec.task == "segment3d" else "images"
    index = check_dataset(cfg, unit) if cfg.data_spec.path else None
    return LoaderSource(cfg, spec, device, rank, world, status_dir, index)
