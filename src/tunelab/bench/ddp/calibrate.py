"""``tunelab bench ddp calibrate``: time real training steps of one accelerator (the device at
hand: CUDA when there is one, else the CPU) and write the median as a profile entry, so
``--compute emulate:MODEL/NAME/bBATCH`` emulates this device with a measured figure.

One process, no communication: the step is what one accelerator does, built by
:func:`tunelab.bench.ddp.step.training_step` exactly as a benchmark worker builds it (model
preparation and memory format, autocast dtype, gradient scaler, optimizer, the input
normalised on the device), fed the synthetic source's batch. The entry records the precision
and memory format it measured; its source names the machine, the date, torch and the input.
"""

from __future__ import annotations

import datetime
import platform
import re
import statistics
import time
from pathlib import Path

from tunelab.bench.ddp.config import MAX_BATCH, MODELS
from tunelab.bench.ddp.profiles import Profile, write_profile
from tunelab.errors import WorkloadError
from tunelab.sysinfo import cpu_model

__all__ = ["calibrate_device"]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_.-]+", "-", text.lower()).strip("-") or "device"


def calibrate_device(*, model: str, batch: int, steps: int = 5, warmup: int = 2,
                     image_size: int = 224, patch: int = 128, device: str = "auto",
                     amp: str = "auto", name: str | None = None,
                     output: Path | None = None) -> tuple[Profile, Path]:
    """Measure; write the entry; return it and the table's path."""
    import torch

    from tunelab.bench.ddp.models import build_model
    from tunelab.bench.ddp.step import training_step
    from tunelab.bench.ddp.synthetic import SyntheticSource
    from tunelab.bench.ddp.worker import select_runtime

    if model not in MODELS:
        raise WorkloadError(f"--model: unknown value {model!r}; choose one of "
                            f"{', '.join(MODELS)}")
    if not 1 <= batch <= MAX_BATCH or not 1 <= steps <= 1000 or not 0 <= warmup <= 1000:
        raise WorkloadError(f"--batch must lie in 1..{MAX_BATCH}, --steps in 1..1000, "
                            "--warmup in 0..1000")
    rt = select_runtime(device, "auto", amp, 0, cuda_devices=torch.cuda.device_count())
    dev = torch.device(rt.device)
    net, spec = build_model(model, image_size=image_size, patch=patch, device=dev)
    step = training_step(net, spec, dev, rt.amp, ddp=False)
    x, y, _ = SyntheticSource(spec, batch, dev, 0).next_batch()
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        step(x, y)  # synchronises the device at its start and end
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    if dev.type == "cuda":
        hw = torch.cuda.get_device_name(dev)
        default = _slug(hw)
    else:
        hw = f"{cpu_model()}, {torch.get_num_threads()} threads"
        default = "cpu"
    shape = "x".join(map(str, spec.sample_shape))
    profile = Profile(
        model=model, accelerator=_slug(name) if name else default,
        precision=step.setup.precision, batch=batch, memory_format=step.setup.memory_format,
        step_s=round(statistics.median(times), 6), kind="measured",
        source=(f"tunelab bench ddp calibrate on {platform.node()} ({hw}), "
                f"{datetime.date.today().isoformat()}, torch {torch.__version__}, input {shape}"),
        note=f"the benchmark's step ({step.setup.precision}, {step.setup.memory_format}, "
             f"{step.setup.optimizer}); median of {steps} steps after {warmup} warm-up; "
             f"spread {min(times):.4f}-{max(times):.4f} s")
    return profile, write_profile(profile, output)
