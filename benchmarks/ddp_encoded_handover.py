"""How long the training process takes to receive a ``--decode gpu`` batch from its loader
processes: the files' bytes as a list of tensors (one shared-memory storage, one file
descriptor over a socket, per file: how batches crossed before) against one buffer with the
files' ends (:class:`tunelab.bench.ddp.samples.Encoded`), measured side by side in one run.

    python benchmarks/ddp_encoded_handover.py [--files 256] [--kb 115] [--rounds 2]

Each round times 6 batches of each kind once the loaders have filled their queues, so the
figure is the trainer's side of the handover (the loaders' reading is not in it)."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
from torch.utils.data import DataLoader

from tunelab.bench.ddp.samples import Encoded


class _Files:
    """Map-style: batches of ``n`` made-up files of about ``size`` bytes each."""

    def __init__(self, size: int, packed: bool) -> None:
        self.blob = os.urandom(2 * size)
        self.size = size
        self.packed = packed

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> Any:
        return self.__getitems__([i])

    def __getitems__(self, indices: list[int]) -> Any:
        xs = [torch.frombuffer(bytearray(self.blob[i % 997:i % 997 + self.size - i % 4999]),
                               dtype=torch.uint8) for i in indices]
        if not self.packed:
            return xs
        return Encoded.join(xs)


def _per_batch(n: int, size: int, packed: bool, batches: int = 6) -> float:
    plan = [list(range(k * n, (k + 1) * n)) for k in range(batches + 1)]
    loader = DataLoader(_Files(size, packed), batch_sampler=plan, collate_fn=lambda b: b,
                        num_workers=2, prefetch_factor=batches)
    it = iter(loader)
    next(it)
    time.sleep(3.0)  # the loaders fill their queues
    t = time.perf_counter()
    for _ in range(batches):
        next(it)
    return (time.perf_counter() - t) / batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=256, help="files a batch (256)")
    ap.add_argument("--kb", type=float, default=115.0, help="kB a file (115: ImageNet's mean)")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    size = int(a.kb * 1000)
    print(f"{a.files} files of ~{a.kb:.0f} kB a batch, 2 loader processes, "
          f"{os.cpu_count()} cores, torch {torch.__version__}")
    for r in range(a.rounds):
        listed = _per_batch(a.files, size, packed=False)
        one = _per_batch(a.files, size, packed=True)
        print(f"round {r}: a list of {a.files} tensors {listed * 1e3:,.1f} ms a batch; one "
              f"buffer {one * 1e3:,.1f} ms a batch; {listed / one:,.1f}x faster")


if __name__ == "__main__":
    main()
