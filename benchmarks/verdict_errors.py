"""How often tunelab's verdicts are wrong, and how often they find a real change: simulation.

Seeded trials through the real ``tunelab.stats`` functions:

1. A/A: two samples of the same distribution, ``compare`` — false verdicts per comparison
   (normal 5 %, lognormal sigma 0.2, 2 % noise with 10 % of runs 2x slower; n = 3, 5, 10).
2. Family-wise: 20 points equal to the baseline (n = 5, 5 % noise), ``compare_to_baseline``
   with and without the Benjamini–Hochberg step — share of studies with at least one false
   verdict, and false verdicts per study.
3. Drift between rounds: the machine slows 3 % per round and the baseline ran in twice as many
   rounds as the point; false verdicts with the rounds (paired) and without (unpaired).
4. Power: a real 5 % change found, at 5 % noise (n = 3, 5, 10) and at 2 % noise with 2x
   outliers (n = 5, 10), and the power hint's repeats for it.

    .venv/bin/python benchmarks/verdict_errors.py [--trials 1000]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd

from tunelab.stats import Verdict, compare, compare_to_baseline, repeats_needed

CALLS = (Verdict.BETTER, Verdict.WORSE)


def noise(kind: str, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Run times around 10 s."""
    if kind == "normal 5%":
        return 10.0 * (1.0 + rng.normal(0.0, 0.05, shape))
    if kind == "lognormal 0.2":
        return 10.0 * np.exp(rng.normal(0.0, 0.2, shape))
    outlier = rng.random(shape) < 0.1
    return 10.0 * (1.0 + rng.normal(0.0, 0.02, shape)) * np.where(outlier, 2.0, 1.0)


def rate(pairs: list[tuple[np.ndarray, np.ndarray]], rounds: bool = False) -> float:
    """Share of (a, b) pairs that ``compare`` calls better or worse."""
    hits = 0
    for i, (a, b) in enumerate(pairs):
        r = (np.arange(a.size), np.arange(b.size)) if rounds else None
        hits += compare(a, b, "minimize", n_resamples=999, seed=i, rounds=r).verdict in CALLS
    return hits / len(pairs)


def runs_table(samples: dict[str, np.ndarray]) -> pd.DataFrame:
    """A runs table in the store's layout (point = {"p": name}, repeat = round)."""
    rows = []
    for name, values in samples.items():
        for r, v in enumerate(values):
            rows.append({"point": json.dumps({"p": name}), "status": "ok", "repeat": r,
                         "fom.wall_s": float(v)})
    return pd.DataFrame(rows)


def main() -> None:
    """Print every figure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--family-trials", type=int, default=300)
    args = parser.parse_args()
    t = args.trials
    print(f"1. A/A false verdicts per comparison ({t} trials each)")
    for kind in ("normal 5%", "lognormal 0.2", "2% + 2x outliers"):
        cells = []
        for n in (3, 5, 10):
            rng = np.random.default_rng(n)
            pairs = [(noise(kind, rng, (n,)), noise(kind, rng, (n,))) for _ in range(t)]
            cells.append(f"n={n}: {rate(pairs):.3f}")
        print(f"   {kind:18s} " + "  ".join(cells))

    ft = args.family_trials
    print(f"\n2. 20 points equal to the baseline, n = 5, 5 % noise ({ft} studies)")
    for fdr in (False, True):
        rng = np.random.default_rng(42)
        any_call, calls = 0, 0
        for _ in range(ft):
            samples = {f"p{i}": noise("normal 5%", rng, (5,)) for i in range(21)}
            out = compare_to_baseline(runs_table(samples), "wall_s", "minimize",
                                      json.dumps({"p": "p0"}), n_resamples=199, fdr=fdr)
            k = sum(pc.comparison.verdict in CALLS for pc in out if not pc.is_baseline)
            any_call += k > 0
            calls += k
        label = "with Benjamini–Hochberg" if fdr else "without adjustment  "
        print(f"   {label}: {any_call / ft:.3f} of studies call a point different "
              f"({calls / ft:.2f} false calls per study)")

    print(f"\n3. Drift 3 %/round, baseline in 2n rounds, point in n ({t} trials each)")
    for n in (3, 5, 10):
        rng = np.random.default_rng(100 + n)
        drift = 1.0 + 0.03 * np.arange(2 * n)
        pairs = [(noise("normal 5%", rng, (2 * n,)) * drift, noise("normal 5%", rng, (n,))
                  * drift[:n]) for _ in range(t)]
        print(f"   n={n}: paired {rate(pairs, rounds=True):.3f}   unpaired {rate(pairs):.3f}")

    print(f"\n4. Power: a real 5 % change ({t} trials each)")
    for kind, ns in (("normal 5%", (3, 5, 10)), ("2% + 2x outliers", (5, 10))):
        cells = []
        for n in ns:
            rng = np.random.default_rng(200 + n)
            pairs = [(noise(kind, rng, (n,)), noise(kind, rng, (n,)) / 1.05) for _ in range(t)]
            cells.append(f"n={n}: {rate(pairs):.2f}")
        print(f"   {kind:18s} " + "  ".join(cells))
    print(f"   power hint: 5 % change at 5 % noise needs {repeats_needed(0.05, 0.05)} repeats "
          f"per point (unpaired), {repeats_needed(0.05, 0.05, paired=True)} paired at 5 % "
          "per-round noise")


if __name__ == "__main__":
    main()
