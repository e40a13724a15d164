"""GPU energy of a run through NVML (``nvidia-ml-py``), where the GPU reports it.

:func:`open_meter` returns an :class:`EnergyMeter` for a CUDA device, or None — without the
``pynvml`` module, without an NVIDIA driver, on the CPU — never an error: energy is a figure
a GPU may add, not one a run needs. A meter reads the device's cumulative energy counter
(``nvmlDeviceGetTotalEnergyConsumption``, millijoules, Volta and later) at :meth:`start` and
:meth:`stop`; where the counter is not supported it samples the power draw
(``nvmlDeviceGetPowerUsage``, milliwatts) every :data:`SAMPLE_S` in a thread and integrates.
The figures of merit are joules over the timed steps, joules per sample and mean watts.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["SAMPLE_S", "Energy", "EnergyMeter", "integrate", "open_meter"]

#: seconds between power samples where the energy counter is not supported
SAMPLE_S = 0.05


@dataclass(frozen=True)
class Energy:
    """Joules used over ``seconds`` (``method``: ``counter`` or ``sampled``)."""

    joules: float
    seconds: float
    method: str

    @property
    def watts(self) -> float:
        """Mean power."""
        return self.joules / self.seconds if self.seconds > 0 else 0.0


class EnergyMeter:
    """Energy of one GPU between :meth:`start` and :meth:`stop` (see the module)."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle
        self._counter = self._read_counter() is not None
        self._t0 = 0.0
        self._e0 = 0.0
        self._samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read_counter(self) -> float | None:
        try:
            return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)) / 1e3
        except Exception:  # NVMLError_NotSupported and kin
            return None

    def _power(self) -> float | None:
        try:
            return float(self._nvml.nvmlDeviceGetPowerUsage(self._handle)) / 1e3
        except Exception:
            return None

    def readable(self) -> bool:
        """The GPU reports its energy counter or its power draw."""
        return self._counter or self._power() is not None

    def _sample(self) -> None:
        while not self._stop.is_set():
            w = self._power()
            if w is not None:
                self._samples.append((time.perf_counter(), w))
            self._stop.wait(SAMPLE_S)

    def start(self) -> None:
        """Begin measuring."""
        self._t0 = time.perf_counter()
        if self._counter:
            self._e0 = self._read_counter() or 0.0
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def stop(self) -> Energy | None:
        """Stop; the energy since :meth:`start` (None when the GPU told nothing)."""
        t1 = time.perf_counter()
        if self._counter:
            e1 = self._read_counter()
            return None if e1 is None else Energy(e1 - self._e0, t1 - self._t0, "counter")
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)
        return integrate(self._samples, self._t0, t1)


def integrate(samples: list[tuple[float, float]], t0: float, t1: float) -> Energy | None:
    """Joules from (time, watts) samples over [t0, t1]: each sample's power held until the
    next (the first from t0, the last to t1); None without samples."""
    if not samples or t1 <= t0:
        return None
    joules = 0.0
    for k, (t, w) in enumerate(samples):
        start = t0 if k == 0 else t
        end = samples[k + 1][0] if k + 1 < len(samples) else t1
        joules += w * max(0.0, min(end, t1) - max(start, t0))
    return Energy(joules, t1 - t0, "sampled")


def open_meter(device_index: int) -> EnergyMeter | None:
    """A meter for CUDA device ``device_index`` (NVML's numbering follows
    ``CUDA_VISIBLE_DEVICES`` only through the device's PCI bus id, which is used), or None
    where NVML is not there."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            import torch

            props: Any = torch.cuda.get_device_properties(device_index)
            bus = (f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:"
                   f"{props.pci_device_id:02x}.0")
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
        except Exception:
            handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        meter = EnergyMeter(pynvml, handle)
    except Exception:  # no driver, no device: energy is absent, never a failure
        return None
    return meter if meter.readable() else None
