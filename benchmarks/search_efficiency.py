"""Search efficiency on recorded landscapes: runs spent against the chance of ending near the best.

Every strategy runs to its end against a landscape through :func:`tunelab.replay.replay_strategy`
(each run answers with one recorded run of that point, drawn by the seed), once per seed.
Printed per landscape and strategy: the mean runs used, their ratio to grid x 5 repeats, and
P(within 5 %): the share of seeds whose chosen point's *true* value — its median over every
recorded run — lies within 5 % of the best true value. Plain Optuna TPE (one run per trial,
invalid points told as failed, repeated points run again, the best trial chosen) gets the same
budget of runs as the strategies.

Landscapes: the recorded ones shipped in benchmarks/landscapes/ (QE Si8: 9 points; the merge
benchmark's UCX options: 64 points) and a synthetic 4-parameter valley (324 valid points,
5 % lognormal noise, 20 recorded runs per point). The budget is 20 % of grid x 5 runs. For
spaces under 50 points (QE Si8) a sweep also prints the fewest runs at which each strategy
reaches grid x 5's own probability (``--sweep``).

    .venv/bin/python benchmarks/search_efficiency.py [--seeds 200] [--jobs 2]
        [--landscape qe-si8 --landscape merge-ucx --landscape synthetic] [--gp-seeds 40]
        [--model-seeds 200] [--only LABEL] [--ceiling] [--sweep]

``--ceiling`` adds what the landscape's noise allows (see :func:`ceiling`). Strategies running
an Optuna sampler cost its own time per proposal (TPE ~0.04 s per ask at ~300 trials on a
loaded 2-core machine: ~15 s per seed on the synthetic landscape), so ``--model-seeds`` runs
them on fewer seeds; the table's ``seeds`` column says how many.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from tunelab.expr import Expression
from tunelab.replay import Landscape, load_landscape, replay_strategy
from tunelab.search import Budget, SearchSettings, make_run_strategy
from tunelab.space import Point, Space
from tunelab.spec import ENV_AXIS, ConstraintSpec

HERE = Path(__file__).resolve().parent
RECORDED = {"qe-si8": HERE / "landscapes" / "qe-si8.yaml",
            "merge-ucx": HERE / "landscapes" / "merge-ucx.yaml"}
TOLERANCE = 0.05
SMALL_SPACE = 50


# ------------------------------------------------------------------------------ landscapes


def synthetic_landscape(seed: int = 2026) -> Landscape:
    """A 4-parameter valley: ranks x threads x pools x block (324 valid points), 5 % noise.

    Time = (compute + communication) x cache factor: compute shrinks with cores (threads a
    little less efficient than ranks), all-to-all communication grows with ranks per pool,
    pools cost a little each, and the block size has a cache optimum that moves with threads.
    Three points lie within 5 % of the best, five within 10 %.
    """
    axes: list[tuple[str, tuple[Any, ...]]] = [
        ("ranks", (1, 2, 4, 8, 16, 32, 64)), ("threads", (1, 2, 4, 8)),
        ("pools", (1, 2, 4, 8)), ("block", (16, 32, 64, 128, 256, 512))]
    rules = ["ranks * threads <= 64", "ranks % pools == 0", "ranks * threads >= 8"]
    space = Space(axes, None, [ConstraintSpec(Expression.parse(r)) for r in rules])

    def time_of(p: Point) -> float:
        r, t, k, b = (int(p[n]) for n in ("ranks", "threads", "pools", "block"))
        compute = 400 / (r * t) * (1 + 0.06 * (t - 1))
        comm = 0.6 * math.log2(r / k + 1) * math.sqrt(r / k) + 0.3 * k
        cache = 1 + 0.12 * (math.log2(b) - math.log2(64 if t < 4 else 128)) ** 2
        return (compute + comm) * cache

    rng = np.random.default_rng(seed)
    runs = {p: tuple(float(v) for v in time_of(p) * np.exp(rng.normal(0, 0.05, 20)))
            for p in space.points()}
    baseline = Point({"ranks": 8, "threads": 1, "pools": 1, "block": 64})
    return Landscape("synthetic", "time_s", "minimize", runs, space, baseline=baseline,
                     repeats=5)


def load(name: str) -> Landscape:
    """A landscape by name (recorded file or the synthetic one)."""
    if name == "synthetic":
        return synthetic_landscape()
    path = RECORDED[name]
    if not path.exists():
        raise SystemExit(f"{path} is missing: record it (see benchmarks/landscapes/README.md)")
    return load_landscape(path)


# ------------------------------------------------------------------------------ strategies


@dataclass(frozen=True)
class Entry:
    """A strategy as the table shows it: how to build it for a budget of runs."""

    label: str
    settings: SearchSettings
    repeats: int = 1
    budgeted: bool = True  # False: runs to its own end (grid x 5, the reference)
    plain_tpe: bool = False
    worst_baseline: bool = False  # a control: the study's baseline moved to the worst point


def entries(budget: int) -> list[Entry]:
    """Every strategy compared, for a budget of ``budget`` runs."""
    s = SearchSettings
    return [
        Entry("grid x5 (reference)", s("grid"), repeats=5, budgeted=False),
        Entry("grid x1", s("grid"), repeats=1),
        Entry("random x1", s("random", samples=budget), repeats=1),
        Entry("random x3", s("random", samples=max(budget // 3, 1)), repeats=3),
        Entry("optuna tpe x1", s("optuna", samples=budget), repeats=1),
        Entry("optuna tpe x3", s("optuna", samples=max(budget // 3, 1)), repeats=3),
        Entry("optuna cmaes x1", s("optuna", samples=budget, sampler="cmaes"), repeats=1),
        Entry("optuna gp x1", s("optuna", samples=budget, sampler="gp"), repeats=1),
        Entry("racing (grid)", s("racing", propose="grid", min_repeats=1)),
        Entry("racing (optuna tpe)", s("racing", propose="optuna", min_repeats=1)),
        Entry("one-at-a-time", s("one-at-a-time")),
        Entry("hierarchical", s("hierarchical")),
        Entry("one-at-a-time, baseline at the worst point", s("one-at-a-time"),
              worst_baseline=True),
        Entry("hierarchical, baseline at the worst point", s("hierarchical"),
              worst_baseline=True),
        Entry("plain Optuna TPE", s("optuna"), plain_tpe=True),
    ]


COMPACT_FAILED = 500
"""Failed trials after which :func:`plain_tpe` moves its finished trials to a fresh study."""


def plain_tpe(landscape: Landscape, seed: int, budget: int) -> tuple[Point | None, int]:
    """Optuna TPE used the plain way: one categorical per parameter (and per environment
    variable of the env sets), one run per trial, invalid points told as failed (no run),
    repeated points run again; the best trial is the answer. It gives up after
    ``100 * budget`` asks (on a constrained space TPE keeps proposing invalid points).

    TPE samples from the finished trials only, but Optuna scans every stored trial on each
    ask, failed ones included, which makes a stuck search quadratic (minutes per seed on the
    synthetic landscape). So every :data:`COMPACT_FAILED` failed trials the finished ones
    move, in order, to a fresh study sharing the same sampler (and its random state): the
    proposals are the same as in one study, only cheaper.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space, env_sets = landscape.space, landscape.env_sets or {}
    variables = sorted({v for s in env_sets.values() for v in s})
    by_items = {tuple(sorted(s.items())): name for name, s in env_sets.items()}
    direction: Any = landscape.direction
    sampler = optuna.samplers.TPESampler(seed=seed)
    study = optuna.create_study(direction=direction, sampler=sampler)
    runs, asks, failed, tried = 0, 0, 0, {}
    finished: list[Point] = []  # the point of each finished trial, in trial order
    while runs < budget and asks < 100 * budget:
        asks += 1
        if failed >= COMPACT_FAILED:
            kept = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            study = optuna.create_study(direction=direction, sampler=sampler)
            study.add_trials(kept)
            failed = 0
        trial = study.ask()
        values: dict[str, Any] = {}
        for axis in space.axes:
            if axis.name == ENV_AXIS and env_sets:
                items = []
                for var in variables:
                    choices = sorted({s.get(var, "-") for s in env_sets.values()})
                    value = trial.suggest_categorical(f"env:{var}", choices)
                    if value != "-":
                        items.append((var, value))
                values[ENV_AXIS] = by_items.get(tuple(sorted(items)), "")
            else:
                values[axis.name] = trial.suggest_categorical(axis.name, list(axis.values))
        point = Point(values)
        if not space.contains(point):
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            failed += 1
            continue
        repeat = tried.get(point, 0)
        tried[point] = repeat + 1
        value = landscape.draw(point, repeat, seed)
        runs += 1
        if value is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            failed += 1
        else:
            study.tell(trial, value)
            finished.append(point)
    try:
        best = study.best_trial
    except ValueError:
        return None, runs
    kept = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return finished[kept.index(best)], runs


def run_one(landscape: Landscape, entry: Entry, seed: int, budget: int
            ) -> tuple[bool, int, float]:
    """(chosen point within 5 % of the best, runs used, seconds) of one seed."""
    start = time.perf_counter()
    if entry.plain_tpe:
        chosen, runs = plain_tpe(landscape, seed, budget)
    else:
        settings = replace(entry.settings, seed=seed)
        baseline = landscape.baseline
        if entry.worst_baseline:
            medians = landscape.medians()
            sign = 1.0 if landscape.direction == "minimize" else -1.0
            baseline = max(medians, key=lambda p: (sign * medians[p], p.key))
        strategy = make_run_strategy(
            settings, landscape.space, direction=landscape.direction, repeats=entry.repeats,
            baseline=baseline, env_sets=landscape.env_sets,
            noise_threshold=landscape.noise_threshold,
            budget=Budget(budget if entry.budgeted else None))
        result = replay_strategy(strategy, landscape, seed)
        chosen, runs = result.chosen, result.runs
    return landscape.within(chosen, TOLERANCE), runs, time.perf_counter() - start


_CACHE: dict[str, Landscape] = {}


def _task(args: tuple[str, Entry, int, int]) -> tuple[bool, int, float]:
    name, entry, seed, budget = args
    if name not in _CACHE:
        _CACHE[name] = load(name)
    return run_one(_CACHE[name], entry, seed, budget)


# ------------------------------------------------------------------------------ main


@dataclass
class Row:
    """One line of a table."""

    label: str
    runs: float
    ratio: float
    p_within: float
    seeds: int
    seconds: float


def _model_based(entry: Entry) -> bool:
    """Whether the strategy runs an Optuna sampler (the slow ones to replay)."""
    s = entry.settings
    return entry.plain_tpe or s.strategy == "optuna" or (
        s.strategy == "racing" and s.propose == "optuna")


def evaluate(name: str, chosen: list[Entry], seeds: int, model_seeds: int, gp_seeds: int,
             budget: int, pool: Any, show: bool = False) -> list[Row]:
    """Rows for ``chosen`` strategies on landscape ``name`` at ``budget`` runs (printed as
    they come with ``show``)."""
    landscape = _CACHE.setdefault(name, load(name))
    grid5 = 5 * len(landscape.space.points())
    rows = []
    for entry in chosen:
        n = seeds
        if _model_based(entry):
            n = min(n, model_seeds)
            if entry.settings.sampler == "gp" and not entry.plain_tpe:
                n = min(n, gp_seeds)
        if n == 0:
            continue
        results = pool.map(_task, [(name, entry, seed, budget) for seed in range(n)])
        hits = [r[0] for r in results]
        runs = [r[1] for r in results]
        mean_runs = statistics.fmean(runs)
        rows.append(Row(entry.label, mean_runs, mean_runs / grid5, sum(hits) / n, n,
                        statistics.fmean(r[2] for r in results)))
        if show:
            print_row(rows[-1])
    return rows


def print_row(r: Row) -> None:
    """One Markdown line."""
    print(f"| {r.label} | {r.runs:.1f} | {r.ratio:.2f} | {r.p_within:.2f} | {r.seeds} | "
          f"{r.seconds:.3f} |", flush=True)


def print_header(name: str, landscape: Landscape, budget: int) -> None:
    """The title and head of a landscape's Markdown table."""
    point, value = landscape.true_best()
    n = len(landscape.space.points())
    near = sum(landscape.within(p, TOLERANCE) for p in landscape.runs)
    print(f"\n### {name}: {n} valid points, true best {point.label()} = {value:.4g} "
          f"({landscape.fom}, {landscape.direction}); {near} point(s) within 5 %; "
          f"budget {budget} runs = 20 % of grid x 5 ({5 * n})\n")
    print("| strategy | runs (mean) | runs / grid x5 | P(within 5 %) | seeds | s/seed |")
    print("|---|---:|---:|---:|---:|---:|", flush=True)


CEILING_REPEATS = (1, 5, 20, 100)
"""Runs per point of the oracle-free bootstrap ceiling (``--ceiling``)."""


def ceiling(landscape: Landscape, budget: int, draws: int = 1000, seed: int = 0
            ) -> list[tuple[str, int, float, float]]:
    """What the landscape's noise allows: (allocation, runs, P by best mean, P by best median).

    Each of ``draws`` trials draws runs of a point from its recorded runs (with replacement,
    as replay does; failed runs left out) and picks the point whose draws have the best mean
    log value (what the strategies compare) or the best median. Rows: every point with *n*
    runs (no strategy can know more than every point measured *n* times; as *n* grows this is
    the noise ceiling), then an oracle that spends ``budget`` runs on the true top *k* points
    only (knowledge no strategy has: an upper bound at that budget).
    """
    rng = np.random.default_rng(seed)
    sign = 1.0 if landscape.direction == "minimize" else -1.0
    points = [p for p in landscape.runs
              if any(v is not None for v in landscape.runs[p])]
    losses = [np.array([sign * math.log(v) if v is not None else np.nan
                        for v in landscape.runs[p]]) for p in points]
    within = np.array([landscape.within(p, TOLERANCE) for p in points])
    medians = landscape.medians()

    def chance(indices: list[int], n: int) -> tuple[float, float]:
        by_mean = np.full((len(indices), draws), np.inf)
        by_median = np.full((len(indices), draws), np.inf)
        for row, i in enumerate(indices):
            values = losses[i][rng.integers(0, len(losses[i]), (draws, n))]
            ok = ~np.isnan(values).all(axis=1)
            by_mean[row, ok] = np.nanmean(values[ok], axis=1)
            by_median[row, ok] = np.nanmedian(values[ok], axis=1)
        hits = within[np.asarray(indices)]
        return (float(hits[by_mean.argmin(axis=0)].mean()),
                float(hits[by_median.argmin(axis=0)].mean()))

    everyone = list(range(len(points)))
    out = [(f"every point x{n}", n * len(points), *chance(everyone, n))
           for n in CEILING_REPEATS]
    ranked = sorted(everyone, key=lambda i: sign * medians[points[i]])
    for k in (2, 5):
        if k < len(points) and budget // k >= 1:
            out.append((f"oracle: {budget} runs on the true top {k}", budget // k * k,
                        *chance(ranked[:k], budget // k)))
    return out


SWEEP_FRACTIONS = (0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.8, 1.0)
"""Budgets tried by the sweep, as fractions of grid x 5."""


def sweep(name: str, labels: list[str], seeds: int, model_seeds: int, pool: Any,
          target: float) -> list[tuple[str, float | None, float]]:
    """For each strategy: the fewest runs (mean over seeds) at which P(within 5 %) reaches
    ``target``, trying the budgets of :data:`SWEEP_FRACTIONS`."""
    landscape = _CACHE.setdefault(name, load(name))
    grid5 = 5 * len(landscape.space.points())
    out: list[tuple[str, float | None, float]] = []
    for label in labels:
        found: tuple[float | None, float] = (None, math.nan)
        for fraction in SWEEP_FRACTIONS:
            budget = max(1, round(fraction * grid5))
            entry = next(e for e in entries(budget) if e.label == label)
            row = evaluate(name, [entry], seeds, model_seeds, model_seeds, budget, pool)[0]
            if row.p_within >= target:
                found = (row.runs, row.p_within)
                break
        out.append((label, *found))
    return out


def main(argv: list[str] | None = None) -> None:
    """Print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--model-seeds", type=int, default=200,
                        help="seeds for strategies running an Optuna sampler (slow)")
    parser.add_argument("--gp-seeds", type=int, default=40,
                        help="seeds for the GP sampler (slowest: torch per trial; 0: skip it "
                             "on spaces over 100 points)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--landscape", action="append", choices=[*RECORDED, "synthetic"])
    parser.add_argument("--only", action="append", help="strategy labels to run")
    parser.add_argument("--fraction", type=float, default=0.2,
                        help="budget as a fraction of grid x 5 runs")
    parser.add_argument("--ceiling", action="store_true",
                        help="also print what the landscape's noise allows (bootstrap)")
    parser.add_argument("--sweep", action="store_true",
                        help="small spaces: fewest runs reaching grid x 5's probability")
    args = parser.parse_args(argv)
    names = args.landscape or [*RECORDED, "synthetic"]
    print(f"search efficiency: {args.seeds} seeds per strategy ({args.model_seeds} with an "
          f"Optuna sampler, {args.gp_seeds} with GP; GP not run over 100 points), "
          f"budget {args.fraction:.0%} of grid x 5, P(true value within {TOLERANCE:.0%} of "
          "the best)", flush=True)
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for name in names:
            landscape = _CACHE.setdefault(name, load(name))
            budget = max(1, round(args.fraction * 5 * len(landscape.space.points())))
            chosen = [e for e in entries(budget) if not args.only or e.label in args.only]
            print_header(name, landscape, budget)
            gp = args.gp_seeds if len(landscape.space.points()) <= 100 else 0
            rows = evaluate(name, chosen, args.seeds, args.model_seeds, gp, budget, pool,
                            show=True)
            if args.ceiling:
                print(f"\nceiling ({name}): P(pick within 5 %) by bootstrap of the recorded "
                      "runs, 1000 draws\n")
                print("| allocation | runs | P (best mean) | P (best median) |")
                print("|---|---:|---:|---:|")
                for label, runs, by_mean, by_median in ceiling(landscape, budget):
                    print(f"| {label} | {runs} | {by_mean:.2f} | {by_median:.2f} |",
                          flush=True)
            if args.sweep and len(landscape.space.points()) < SMALL_SPACE:
                target = rows[0].p_within if rows and "reference" in rows[0].label else 0.0
                labels = [e.label for e in chosen[1:]
                          if e.settings.sampler != "gp" and e.label != "grid x1"]
                print(f"\nfewest runs reaching grid x 5's P = {target:.2f} ({name}):\n")
                print("| strategy | runs | P(within 5 %) | runs / grid x5 |")
                print("|---|---:|---:|---:|")
                grid5 = 5 * len(landscape.space.points())
                for label, runs, p in sweep(name, labels, args.seeds, args.model_seeds, pool,
                                            target):
                    if runs is None:
                        print(f"| {label} | not reached by {grid5} | – | – |", flush=True)
                    else:
                        print(f"| {label} | {runs:.1f} | {p:.2f} | {runs / grid5:.2f} |",
                              flush=True)


if __name__ == "__main__":
    main()

