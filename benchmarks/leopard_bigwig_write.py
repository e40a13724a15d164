"""Writing a prediction track as genome-wide prediction does (``BigWigWriter``: values
rounded to 4 digits, summarised and deflated block by block by writer threads): its blocks
deflated by zlib at level 1 (how it was written before) against ISA-L at level 2 (now), side
by side in each round, with 1 and 2 writer threads.

    python benchmarks/leopard_bigwig_write.py [--mbp 32] [--rounds 3]

The values are probabilities as a trained Leopard model gives them: mostly near 0 (a
logistic of a normal with mean -4, sd 2), rounded to 4 digits as the track stores them.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyBigWig

from tunelab.leopard import bigwig
from tunelab.leopard.bigwig import BigWigWriter


class _Zlib:
    """zlib in place of ISA-L, at zlib's level 1 whatever level is asked."""

    @staticmethod
    def compress(data: bytes, level: int) -> bytes:
        return zlib.compress(data, 1)


@contextmanager
def _deflater(name: str) -> Iterator[None]:
    real = bigwig.isal_zlib
    if name == "zlib 1":
        bigwig.isal_zlib = _Zlib  # type: ignore[assignment]
    try:
        yield
    finally:
        bigwig.isal_zlib = real


def _write(path: Path, values: np.ndarray, threads: int) -> float:
    t = time.perf_counter()
    w = BigWigWriter(path, [("chr1", len(values))], digits=4, threads=threads)
    for a in range(0, len(values), 4_000_000):  # sections of 4 Mbp, as on a CPU
        w.add("chr1", a, values[a:a + 4_000_000])
    w.close()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mbp", type=float, default=32.0)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    n = int(a.mbp * 1e6)
    rng = np.random.default_rng(0)
    values = (1 / (1 + np.exp(-rng.normal(-4, 2, n)))).astype(np.float32)
    print(f"{n / 1e6:.0f} Mbp of probabilities, {os.cpu_count()} cores")
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for threads in (1, 2):
            ratios = []
            for r in range(a.rounds):
                rate: dict[str, Any] = {}
                order = ("zlib 1", "isal 2") if r % 2 == 0 else ("isal 2", "zlib 1")
                for name in order:  # neither always goes first
                    path = Path(tmp) / f"{name.replace(' ', '')}.bw"
                    with _deflater(name):
                        rate[name] = n / 1e6 / _write(path, values, threads)
                    sizes[name] = path.stat().st_size
                    bw = pyBigWig.open(str(path))
                    got = bw.values("chr1", 0, n, numpy=True)
                    bw.close()
                    assert np.array_equal(got, np.round(values.astype(np.float64), 4)
                                          .astype(np.float32))
                ratios.append(rate["isal 2"] / rate["zlib 1"])
                print(f"{threads} thread(s), round {r}: zlib level 1 {rate['zlib 1']:.1f} "
                      f"Mbp/s, ISA-L level 2 {rate['isal 2']:.1f} Mbp/s: "
                      f"{ratios[-1]:.2f}x")
            print(f"{threads} thread(s): median {float(np.median(ratios)):.2f}x")
    print(f"file sizes: zlib level 1 {sizes['zlib 1'] / 2**20:.1f} MiB, ISA-L level 2 "
          f"{sizes['isal 2'] / 2**20:.1f} MiB ({sizes['isal 2'] / sizes['zlib 1']:.3f}x); "
          "both read back equal by pyBigWig")


if __name__ == "__main__":
    main()
