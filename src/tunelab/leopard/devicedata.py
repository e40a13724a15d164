"""Training and evaluation batches cut and encoded where the model runs, from the seeded plan.

The numpy path (:func:`tunelab.leopard.data.build_inputs` in a loader thread) cuts every batch
on the host and copies float32 inputs, 20-24 bytes a base, to the device: on a GPU one core
building batches capped training at ~7,500 windows/s. :class:`DeviceWindows` holds a split's
*compact* arrays instead (sequence codes 1 byte, DNase 4, label 1, the average track 4 bytes a
base) as torch tensors, and cuts windows, one-hot encodes them, scales the DNase channels and
keeps the labels (the loss masks label -1) with torch operations on the tensors' device.

Where the arrays live (:func:`choose_placement`):

* ``device`` — in the GPU's memory when they fit in a fraction of what is free (the model, its
  activations and cuDNN's workspace need the rest); every step is then device work only;
* ``pinned`` — in pinned (page-locked) host memory otherwise: a loader thread gathers each
  batch's compact windows (6-10 bytes a base) into pinned buffers, a side CUDA stream copies
  them one step ahead, and the device encodes them;
* ``host`` — on a CPU, where they already are (the trainer keeps the numpy path there; the
  same code runs on CPU tensors in the tests).

The windows are the numpy path's: the plan (window ids and DNase scales) is drawn by the same
seeded numpy generator, uploaded once per epoch; only cutting and encoding move.
``tests/leopard/test_devicedata.py`` checks equality batch by batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tunelab.leopard.prefetch import prefetch

if TYPE_CHECKING:
    import torch

    from tunelab.leopard.windows import WindowSource

__all__ = ["FIT_FRACTION", "DeviceWindows", "Placement", "bytes_needed", "choose_placement"]

#: the data may take this fraction of the device's free memory
FIT_FRACTION = 0.6
_GiB = float(1 << 30)

Compact = tuple["torch.Tensor", "torch.Tensor", "torch.Tensor", "torch.Tensor | None"]


@dataclass(frozen=True)
class Placement:
    """Where a split's arrays are held (``device``, ``pinned`` or ``host``), and why."""

    where: str
    why: str


def bytes_needed(src: WindowSource, in_channels: int) -> int:
    """Bytes of a split's compact arrays: 6 a base (10 with the average track)."""
    return src.bases() * (10 if in_channels == 6 else 6)


def choose_placement(device_type: str, need: int, room: float | None) -> Placement:
    """``device`` when ``need`` bytes fit in the ``room`` the device has for data (a fraction
    of its free memory, see :data:`FIT_FRACTION`), else ``pinned``; ``host`` on a CPU."""
    if device_type != "cuda":
        return Placement("host", "in host memory")
    if room is not None and need <= room:
        return Placement("device", f"{need / _GiB:.2f} GiB on the GPU")
    left = "unknown" if room is None else f"{room / _GiB:.1f} GiB"
    return Placement("pinned", f"{need / _GiB:.2f} GiB in pinned host memory (room on the GPU: "
                               f"{left}), copied by a side stream")


class DeviceWindows:
    """One split's compact arrays as torch tensors, and batches cut from them by torch ops.

    Window ids are those of :class:`~tunelab.leopard.trainsetup.WindowSource`: global starts
    in a genome, row indices of ``.npz`` arrays (held flat, so row ``i`` starts at
    ``i * window``). Inputs come out ``(n, C, window)`` float32 and labels ``(n, window)``
    int8 on ``device``, equal to the numpy path's.
    """

    def __init__(self, src: WindowSource, device: torch.device, placement: Placement,
                 in_channels: int) -> None:
        import torch

        self.window, self.in_channels, self.device = src.window, in_channels, device
        self.placement = placement
        if src.arrays is not None:
            b = src.arrays.batch
            arrays = [b.seq, b.dnase, b.label, b.dnase_avg]
            self._id_scale = src.window  # row i starts at i * window in the flat arrays
        else:
            assert src.cs is not None
            cs = src.cs
            arrays = [cs.seq, cs.dnase, cs.label, cs.dnase_avg]
            self._id_scale = 1
        if in_channels != 6:
            arrays[3] = None
        where = placement.where
        home = device if where == "device" else torch.device("cpu")

        def hold(a: np.ndarray | None) -> torch.Tensor | None:
            if a is None:
                return None
            t = torch.from_numpy(np.ascontiguousarray(a).reshape(-1))
            if where == "device":
                return t.to(device)
            return t.pin_memory() if where == "pinned" and device.type == "cuda" else t

        seq, dnase, label, avg = (hold(a) for a in arrays)
        assert seq is not None and dnase is not None and label is not None
        self._arrays: Compact = (seq, dnase, label, avg)
        self._home = home
        self._offsets = torch.arange(self.window, device=home)
        self._codes = torch.arange(4, dtype=torch.uint8, device=device)
        self._stream = (torch.cuda.Stream(device) if where == "pinned" and device.type == "cuda"
                        else None)

    # ------------------------------------------------------------------ cutting, encoding

    def starts(self, ids: np.ndarray) -> np.ndarray:
        """Flat start positions of the windows ``ids``."""
        return np.asarray(ids, dtype=np.int64) * self._id_scale

    def cut(self, starts: torch.Tensor) -> Compact:
        """Compact windows ``(seq, dnase, label, avg)``, each ``(n, window)``, beginning at
        ``starts`` (on the arrays' own device)."""
        idx = starts[:, None] + self._offsets
        return tuple(None if a is None else a[idx]  # type: ignore[return-value]
                     for a in self._arrays)

    def encode(self, seq: torch.Tensor, dnase: torch.Tensor, avg: torch.Tensor | None,
               scales: torch.Tensor | None) -> torch.Tensor:
        """Model input ``(n, C, window)`` float32, as :func:`~tunelab.leopard.data.build_inputs`
        makes it: one-hot A C G T (N: zeros), DNase, DNase minus the average (6 channels),
        DNase channels times ``scales`` (n,) float32."""
        import torch

        n, length = seq.shape
        x = torch.empty((n, self.in_channels, length), dtype=torch.float32, device=seq.device)
        torch.eq(seq[:, None, :], self._codes.to(seq.device)[None, :, None], out=x[:, :4])
        x[:, 4] = dnase
        if avg is not None:
            torch.sub(dnase, avg, out=x[:, 5])
        if scales is not None:
            x[:, 4:] *= scales[:, None, None]
        return x

    # ------------------------------------------------------------------ batches

    def batches(self, plan: np.ndarray, scales: np.ndarray | None, steps: int, gb: int,
                rank: int = 0, world: int = 1) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(inputs, labels)`` of this worker's share (``[rank::world]``) of each of
        ``steps`` global batches of ``gb`` windows of ``plan`` (ids), with DNase ``scales``."""
        ids = np.asarray(plan[:steps * gb]).reshape(steps, gb)[:, rank::world]
        sc = (None if scales is None else
              np.asarray(scales[:steps * gb], np.float32).reshape(steps, gb)[:, rank::world])
        return self._stream_batches(self.starts(ids), sc, None)

    def eval_batches(self, ids: np.ndarray, batch: int
                     ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(inputs, labels)`` of ``ids`` in batches of exactly ``batch`` windows: the last
        one is padded with copies of the first window labelled -1 (ignored by every metric),
        so a captured or compiled forward pass always sees one shape."""
        if len(ids) == 0:
            return iter(())
        k = -(-len(ids) // batch)
        starts = np.full(k * batch, self.starts(ids[:1])[0], dtype=np.int64)
        starts[:len(ids)] = self.starts(ids)
        real = np.zeros(k * batch, dtype=bool)
        real[:len(ids)] = True
        return self._stream_batches(starts.reshape(k, batch), None, real.reshape(k, batch))

    def _stream_batches(self, starts: np.ndarray, scales: np.ndarray | None,
                        real: np.ndarray | None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        import torch

        dev = self.device
        if self.placement.where == "pinned":
            compact = _ahead_to(prefetch(self._host_cut(starts), depth=2,
                                         name="leopard-pinned"), dev, self._stream)
        else:
            st = torch.from_numpy(starts).to(self._home)
            compact = (self.cut(st[s]) for s in range(len(starts)))
        sc = None if scales is None else torch.from_numpy(scales).to(dev)
        keep = None if real is None or real.all() else torch.from_numpy(real).to(dev)
        for s, (seq, dnase, label, avg) in enumerate(compact):
            x = self.encode(seq, dnase, avg, None if sc is None else sc[s])
            if keep is not None:
                label = torch.where(keep[s][:, None], label, -1).to(torch.int8)
            yield x, label

    def _host_cut(self, starts: np.ndarray) -> Iterator[Compact]:
        """Compact windows gathered on the host into pinned buffers (a loader thread)."""
        import torch

        pin = self.device.type == "cuda"
        for row in starts:
            idx = (torch.from_numpy(row)[:, None] + self._offsets).reshape(-1)
            out: list[torch.Tensor | None] = []
            for a in self._arrays:
                if a is None:
                    out.append(None)
                    continue
                buf = torch.empty(idx.numel(), dtype=a.dtype, pin_memory=pin)
                torch.index_select(a, 0, idx, out=buf)
                out.append(buf.view(len(row), self.window))
            yield tuple(out)  # type: ignore[misc]


def _ahead_to(items: Iterator[Compact], device: torch.device,
              stream: torch.cuda.Stream | None) -> Iterator[Compact]:
    """``items`` copied to ``device``, each copy issued one item ahead on ``stream`` (a
    side CUDA stream) so that it overlaps the current step; without a stream, in turn."""
    import torch

    def send(item: Compact) -> tuple[Compact, torch.cuda.Event | None]:
        if stream is None:
            return tuple(None if t is None else t.to(device)  # type: ignore[return-value]
                         for t in item), None
        with torch.cuda.stream(stream):
            moved = tuple(None if t is None else t.to(device, non_blocking=True)
                          for t in item)
            event = torch.cuda.Event()
            event.record(stream)
        return moved, event  # type: ignore[return-value]

    pending: tuple[Compact, torch.cuda.Event | None] | None = None
    for item in items:
        nxt = send(item)
        if pending is not None:
            yield _ready(*pending)
        pending = nxt
    if pending is not None:
        yield _ready(*pending)


def _ready(item: Compact, event: torch.cuda.Event | None) -> Compact:
    """Make the current stream wait for ``item``'s copy, and keep its memory alive for it."""
    import torch

    if event is not None:
        cur = torch.cuda.current_stream()
        cur.wait_event(event)
        for t in item:
            if t is not None:
                t.record_stream(cur)
    return item
