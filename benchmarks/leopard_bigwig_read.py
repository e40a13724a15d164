"""Reading a DNase bigWig region by region as Leopard's readers do: the stored-NaN check's
pass over each region first, then its values (how it was read before), against the values
first and the check only where one is not finite (``read_bigwig_region``), side by side in
one run on a synthetic genome (no gaps, as the synthetic tracks have none).

    python benchmarks/leopard_bigwig_read.py [--chroms 4] [--mbp 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from tunelab.leopard.data import load_manifest
from tunelab.leopard.genomefiles import (
    check_bigwig_values,
    open_bigwig,
    read_bigwig_region,
)
from tunelab.leopard.synthetic import SyntheticConfig, write_synthetic


def _check_first(bw: object, path: Path, chrom: str, start: int, end: int) -> np.ndarray:
    """The previous way: the check's pass, then the values."""
    if check_bigwig_values(bw, path, chrom, start, end):
        v = bw.values(chrom, start, end, numpy=True)  # type: ignore[attr-defined]
        return np.nan_to_num(v, nan=0.0).astype(np.float32, copy=False)
    return np.zeros(end - start, np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chroms", type=int, default=4)
    ap.add_argument("--mbp", type=float, default=8.0, help="Mbp a chromosome")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        genome = Path(tmp) / "genome"
        write_synthetic(genome, SyntheticConfig(n_chroms=a.chroms, chrom_length=int(a.mbp * 1e6),
                                                val_chroms=1, test_chroms=1))
        m = load_manifest(genome)
        bw = open_bigwig(m.dnase, "DNase")
        regions = [(c, s, min(s + 10_000_000, n)) for c, n in bw.chroms().items()
                   for s in range(0, n, 10_000_000)]
        bp = sum(e - s for _, s, e in regions)
        print(f"{bp / 1e6:.0f} Mbp in {len(regions)} regions, {os.cpu_count()} cores")
        for r in range(a.rounds):
            times = {}
            for name, fn in (("check first", _check_first), ("values first", read_bigwig_region)):
                t = time.perf_counter()
                got = [fn(bw, m.dnase, c, s, e) for c, s, e in regions]
                times[name] = time.perf_counter() - t
                assert sum(len(g) for g in got) == bp
            print(f"round {r}: check first {bp / 1e6 / times['check first']:.1f} Mbp/s, values "
                  f"first {bp / 1e6 / times['values first']:.1f} Mbp/s: "
                  f"{times['check first'] / times['values first']:.2f}x")
        bw.close()


if __name__ == "__main__":
    main()
