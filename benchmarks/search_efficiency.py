"""Search efficiency: the chance of ending within 5 % of the best, against the runs spent.

Every strategy runs to its end against a landscape through :func:`tunelab.replay.replay_strategy`
(each run answers with one recorded run of that point, drawn by the seed), once per seed, and
is scored on the point it recommends — the point ``tunelab best`` crowns from the same runs
(:func:`tunelab.stats.recommend`). Printed per landscape and strategy, at budgets of 10, 20
and 40 % of grid x 5 repeats: P, the share of seeds whose recommended point's *true* mean
(the mean of every recorded run of it) lies within 5 % of the best true mean, and the mean
runs used. ``grid x5`` is the reference (every point five times, its own runs); ``plain
Optuna TPE`` is Optuna used the plain way on the same recorded noise (ask/tell, one run per
trial, its best trial is the answer).

Landscapes: the recorded ones in benchmarks/landscapes/ (QE Si8: 9 points; the merge
benchmark's UCX options: 64 points) and the generated ones of ``search_landscapes.py``
(``synthetic``, ``interaction``, ``needle``, ``inert``). Strategies that start from a baseline
run three times: from the landscape's worst point, its median point and a random point (drawn
per seed).

    .venv/bin/python benchmarks/search_efficiency.py [--seeds 200] [--jobs 2]
        [--landscape NAME ...] [--fractions 0.1 0.2 0.4] [--only LABEL ...] [--ceiling]
        [--tpe-seeds N] [--seed-offset K]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import random
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from tunelab.replay import Landscape, load_landscape, replay_strategy
from tunelab.search import Budget, SearchSettings, make_run_strategy
from tunelab.space import Point
from tunelab.spec import ENV_AXIS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from search_landscapes import GENERATED, generated, is_kind  # noqa: E402

HERE = Path(__file__).resolve().parent
RECORDED = {"qe-si8": HERE / "landscapes" / "qe-si8.yaml",
            "merge-ucx": HERE / "landscapes" / "merge-ucx.yaml"}
LANDSCAPES = [*RECORDED, *GENERATED]
TOLERANCE = 0.05
FRACTIONS = (0.1, 0.2, 0.4)
BASELINES = ("worst", "median", "random")


def load(name: str) -> Landscape:
    """A landscape by name (recorded file or generated)."""
    if name in GENERATED or is_kind(name):
        return generated(name)
    path = RECORDED[name]
    if not path.exists():
        raise SystemExit(f"{path} is missing: record it (see benchmarks/landscapes/README.md)")
    return load_landscape(path)


# ------------------------------------------------------------------------------ strategies


@dataclass(frozen=True)
class Entry:
    """A row of the table: a strategy, and where its baseline is."""

    label: str
    settings: SearchSettings
    baseline: str = "study"  # study | worst | median | random
    repeats: int = 1
    budgeted: bool = True  # False: runs to its own end (grid x 5, the reference)
    plain_tpe: bool = False

    @property
    def name(self) -> str:
        """The label with the baseline, as ``--only`` and the table name it."""
        return self.label if self.baseline == "study" else f"{self.label}, {self.baseline}"


def entries() -> list[Entry]:
    """Every row: the reference, plain TPE, then each run strategy from each baseline."""
    s = SearchSettings
    rows = [Entry("grid x5 (reference)", s("grid"), repeats=5, budgeted=False),
            Entry("plain Optuna TPE", s("optuna"), plain_tpe=True)]
    for label, settings in (("auto", s("auto")), ("one-at-a-time", s("one-at-a-time")),
                            ("hierarchical", s("hierarchical"))):
        rows.extend(Entry(label, settings, baseline=b) for b in BASELINES)
    rows.extend([Entry("racing (grid)", s("racing", propose="grid", min_repeats=1),
                       baseline="median"),
                 Entry("racing (optuna tpe)", s("racing", propose="optuna", min_repeats=1),
                       baseline="median")])
    return rows


DEFAULT_ROWS = 11
"""Rows run unless ``--only`` names others (the racing rows are extra)."""

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


def baseline_of(landscape: Landscape, where: str, seed: int) -> Point | None:
    """The baseline a row starts from: the study's, or the worst, median or a random point
    (by true mean; random: drawn with ``seed``)."""
    if where == "study":
        return landscape.baseline
    means = landscape.means()
    sign = 1.0 if landscape.direction == "minimize" else -1.0
    ranked = sorted(means, key=lambda p: (sign * means[p], p.key))
    if where == "worst":
        return ranked[-1]
    if where == "median":
        return ranked[(len(ranked) - 1) // 2]
    return random.Random(seed).choice(sorted(means, key=lambda p: p.key))


def run_one(landscape: Landscape, entry: Entry, seed: int, budget: int
            ) -> tuple[bool, int, float]:
    """(recommended point within 5 % of the best, runs used, seconds) of one seed."""
    start = time.perf_counter()
    if entry.plain_tpe:
        chosen, runs = plain_tpe(landscape, seed, budget)
    else:
        strategy = make_run_strategy(
            replace(entry.settings, seed=seed), landscape.space, direction=landscape.direction,
            repeats=entry.repeats, baseline=baseline_of(landscape, entry.baseline, seed),
            env_sets=landscape.env_sets, noise_threshold=landscape.noise_threshold,
            budget=Budget(budget if entry.budgeted else None))
        result = replay_strategy(strategy, landscape, seed)
        chosen, runs = result.chosen, result.runs
    return landscape.within(chosen, TOLERANCE), runs, time.perf_counter() - start


_CACHE: dict[str, Landscape] = {}


def _landscape(name: str) -> Landscape:
    if name not in _CACHE:
        _CACHE[name] = load(name)
    return _CACHE[name]


def _task(args: tuple[str, Entry, int, int]) -> tuple[bool, int, float]:
    name, entry, seed, budget = args
    return run_one(_landscape(name), entry, seed, budget)


# ------------------------------------------------------------------------------ main


@dataclass
class Cell:
    """One strategy at one budget: P(within 5 %), mean runs, seconds per seed."""

    p_within: float
    runs: float
    seconds: float


SEED_OFFSET = 0
"""The first seed of every cell (``--seed-offset``): a rule tuned on seeds 0-N is checked on
others, so that it is not fitted to their noise."""


def evaluate(name: str, entry: Entry, seeds: int, budget: int, pool: Any) -> Cell:
    """``entry`` on landscape ``name`` at ``budget`` runs over ``seeds`` seeds (from
    :data:`SEED_OFFSET`)."""
    results = pool.map(_task, [(name, entry, seed, budget)
                               for seed in range(SEED_OFFSET, SEED_OFFSET + seeds)])
    return Cell(sum(r[0] for r in results) / seeds, statistics.fmean(r[1] for r in results),
                statistics.fmean(r[2] for r in results))


def header(name: str, landscape: Landscape, fractions: tuple[float, ...]) -> str:
    """The title and head of a landscape's Markdown table."""
    point, value = landscape.true_best()
    n = len(landscape.space.points())
    near = sum(landscape.within(p, TOLERANCE) for p in landscape.runs)
    budgets = ", ".join(f"{f:.0%} = {budget_of(f, n)}" for f in fractions)
    cols = " | ".join(f"P {f:.0%} | runs" for f in fractions)
    rule = "|".join("---:|---:" for _ in fractions)
    return (f"\n### {name}: {n} valid points, true best {point.label()} = {value:.4g} "
            f"({landscape.fom}, {landscape.direction}); {near} point(s) within 5 %; "
            f"budgets (runs) {budgets}; grid x 5 = {5 * n}\n\n"
            f"| strategy | {cols} | seeds | s/seed |\n|---|{rule}|---:|---:|")


def budget_of(fraction: float, points: int) -> int:
    """Runs at ``fraction`` of grid x 5."""
    return max(1, round(fraction * 5 * points))


CEILING_REPEATS = (1, 2, 5, 20)
"""Runs per point of the bootstrap ceiling (``--ceiling``)."""


ORACLE_TOPS = (2, 3)
"""The oracle rows of the ceiling: told the *k* truly best points, 40 % of grid x 5 on them."""


def ceiling(landscape: Landscape, draws: int = 1000, seed: int = 0
            ) -> list[tuple[str, int, float]]:
    """What the landscape's noise allows: (allocation, runs, P) when every point is measured
    *n* times (draws from its recorded runs, as replay makes them) and the best mean of
    logs is picked — no strategy without prior knowledge knows more at that cost; then an
    oracle's (:data:`ORACLE_TOPS`): 40 % of grid x 5's runs spent on the truly best few points
    only, which no strategy can know — an upper bound for that budget."""
    rng = np.random.default_rng(seed)
    sign = 1.0 if landscape.direction == "minimize" else -1.0
    points = [p for p in landscape.runs if any(v is not None for v in landscape.runs[p])]
    losses = [np.array([sign * math.log(v) if v is not None else np.nan
                        for v in landscape.runs[p]]) for p in points]
    within = np.array([landscape.within(p, TOLERANCE) for p in points])
    out = []
    for n in CEILING_REPEATS:
        by_mean = np.full((len(points), draws), np.inf)
        for row, loss in enumerate(losses):
            values = loss[rng.integers(0, len(loss), (draws, n))]
            ok = ~np.isnan(values).all(axis=1)
            by_mean[row, ok] = np.nanmean(values[ok], axis=1)
        out.append((f"every point x{n}", n * len(points),
                    float(within[by_mean.argmin(axis=0)].mean())))
    # an oracle told which points are the best few, spending 40 % of grid x 5 on them alone
    means = landscape.means()
    ranked = sorted(range(len(points)), key=lambda i: sign * means[points[i]])
    for k in ORACLE_TOPS:
        n = 2 * len(points) // k
        top = np.full((k, draws), np.inf)
        for row, i in enumerate(ranked[:k]):
            values = losses[i][rng.integers(0, len(losses[i]), (draws, n))]
            ok = ~np.isnan(values).all(axis=1)
            top[row, ok] = np.nanmean(values[ok], axis=1)
        picked = np.asarray(ranked[:k])[top.argmin(axis=0)]
        out.append((f"told the {k} best points, x{n} each", n * k, float(within[picked].mean())))
    return out


KIND_ROWS = ("grid x5 (reference)", "plain Optuna TPE", "auto, worst", "auto, median",
             "auto, random")
"""Rows of the small-space kind's table (``--kind``) unless ``--only`` names others."""


KIND_TITLES = {
    "kind": "the small-space kind: {n} landscapes drawn apart (6-12 points, CV 5-8 %)",
    "ikind": "the interaction kind: {n} landscapes drawn apart (48-200 points; 2 or 3 "
             "parameters 20-35 % faster only together, every single change worse; CV 5-8 %)",
    "nkind": "the needle kind: {n} landscapes drawn apart (48-160 points, a shallow bowl and one "
             "point drawn at random 12-20 % faster; CV 5-8 %)"}
"""Each kind's table title (``--kind-of``: the prefix of its members' names)."""


def kind_table(count: int, rows: list[Entry], seeds: int, fractions: tuple[float, ...],
               pool: Any, prefix: str = "kind") -> None:
    """P of ``rows`` on ``count`` landscapes of one kind drawn apart
    (``search_landscapes.KINDS[prefix]``): one line per landscape, then the mean of each
    column — a rule judged on the kind, not fitted to one example. The small-space kind
    also gets the oracle's column."""
    names = [f"{prefix}{k}" for k in range(count)]
    oracle = prefix == "kind"
    cols = [(e, f) for e in rows for f in ((None,) if not e.budgeted else fractions)]
    heads = " | ".join(e.name if f is None else f"{e.name} {f:.0%}" for e, f in cols)
    title = KIND_TITLES[prefix].format(n=count)
    told = ("; the oracle is told the 3 truly best points and spends 40 % of grid x 5 on them "
            "alone (no strategy can know them: an upper bound at that budget)") if oracle else ""
    print(f"\n### {title}, baseline per row, {seeds} seeds per cell, P{told}\n\n"
          f"| landscape | points | within 5 % | {heads} |{' oracle 40% |' if oracle else ''}\n"
          f"|---|---:|---:|{'---:|' * (len(cols) + oracle)}", flush=True)
    table = []
    for name in names:
        landscape = _landscape(name)
        n = len(landscape.space.points())
        near = sum(landscape.within(p, TOLERANCE) for p in landscape.runs)
        ps = [evaluate(name, e, seeds, 5 * n if f is None else budget_of(f, n), pool).p_within
              for e, f in cols]
        if oracle:
            ps.append(next(p for label, _, p in ceiling(landscape)
                           if label.startswith("told the 3")))
        table.append(ps)
        print(f"| {name} | {n} | {near} | {' | '.join(f'{p:.2f}' for p in ps)} |", flush=True)
    means = np.mean(np.array(table), axis=0)
    print(f"| mean | | | {' | '.join(f'{p:.3f}' for p in means)} |", flush=True)


def main(argv: list[str] | None = None) -> None:
    """Print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--seed-offset", type=int, default=0, metavar="K",
                        help="seeds K to K+SEEDS-1 (default 0): validate on seeds not tuned on")
    parser.add_argument("--tpe-seeds", type=int, help="seeds for plain Optuna TPE (slow on "
                        "constrained spaces: it keeps proposing invalid points; default: --seeds)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--landscape", action="append", metavar="NAME",
                        help=f"{', '.join(LANDSCAPES)}, or kindK, ikindK, nkindK (member K of "
                        "--kind's spaces)")
    parser.add_argument("--fractions", type=float, nargs="+", default=list(FRACTIONS),
                        help="budgets as fractions of grid x 5 runs")
    parser.add_argument("--only", action="append", help="rows to run, by name "
                        "(e.g. 'auto, worst'; default: all but the racing rows)")
    parser.add_argument("--ceiling", action="store_true",
                        help="also print what the landscape's noise allows (bootstrap)")
    parser.add_argument("--kind", type=int, metavar="N",
                        help="instead: the rows on N small landscapes of one kind drawn apart "
                        "(one line each, then the means)")
    parser.add_argument("--kind-of", choices=("small", "interaction", "needle"),
                        default="small", help="--kind's landscapes: small spaces (kindK, the "
                        "default), interactions (ikindK) or needles (nkindK)")
    args = parser.parse_args(argv)
    for name in args.landscape or []:
        if name not in LANDSCAPES and not is_kind(name):
            parser.error(f"unknown landscape {name!r}; valid: {', '.join(LANDSCAPES)}, "
                         "kindK, ikindK, nkindK")
    fractions = tuple(args.fractions)
    global SEED_OFFSET
    SEED_OFFSET = args.seed_offset
    default = [e for e in entries() if e.name in KIND_ROWS] if args.kind \
        else entries()[:DEFAULT_ROWS]
    rows = [e for e in entries() if e.name in args.only] if args.only else default
    started = time.perf_counter()
    print(f"search efficiency: {args.seeds} seeds per cell (from {SEED_OFFSET}), budgets "
          f"{', '.join(f'{f:.0%}' for f in fractions)} of grid x 5; P = share of seeds whose "
          f"recommended point's true mean is within {TOLERANCE:.0%} of the best", flush=True)
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        if args.kind:
            prefix = {"small": "kind", "interaction": "ikind", "needle": "nkind"}[args.kind_of]
            kind_table(args.kind, rows, args.seeds, fractions, pool, prefix)
        for name in args.landscape or ([] if args.kind else LANDSCAPES):
            landscape = _landscape(name)
            n = len(landscape.space.points())
            print(header(name, landscape, fractions), flush=True)
            for entry in rows:
                seeds = args.tpe_seeds or args.seeds if entry.plain_tpe else args.seeds
                if not entry.budgeted:  # the reference: its own runs, the same in every column
                    cells = [evaluate(name, entry, seeds, 5 * n, pool)] * len(fractions)
                else:
                    cells = [evaluate(name, entry, seeds, budget_of(f, n), pool)
                             for f in fractions]
                cols = " | ".join(f"{c.p_within:.2f} | {c.runs:.1f}" for c in cells)
                seconds = statistics.fmean(c.seconds for c in cells)
                print(f"| {entry.name} | {cols} | {seeds} | {seconds:.3f} |", flush=True)
            if args.ceiling:
                print(f"\nceiling ({name}): best mean when every point is measured alike, "
                      "1000 bootstrap draws\n\n| allocation | runs | P |\n|---|---:|---:|")
                for label, runs, p in ceiling(landscape):
                    print(f"| {label} | {runs} | {p:.2f} |", flush=True)
    print(f"\nwall time {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
