"""Scaling plots, the seed article's three: throughput vs workers with the ideal line (and
the fitted model's prediction beyond the measured sizes), parallel efficiency, and scale-up
vs scale-out bars at equal workers.

:func:`scaling_plot_data` is the pure data step (tested without drawing);
:func:`scaling_plots` draws the PNGs with matplotlib's Agg backend. Any study whose runs
carry a worker count (parameter or FOM ``workers``) can use them: a workload asks for them
with ``report_figures = ("scaling", …)`` (the ``ddp`` workload does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from tunelab.report.figures import (
    by_layout,
    figure_titles,
    layout_label,
    legend_below,
    plain_numbers,
    pyplot,
    short_label,
    worker_axis,
)
from tunelab.scaling import (
    Forecast,
    LayoutGap,
    ScalingPoint,
    StepModel,
    fit_step_model,
    forecast,
    layout_gaps,
    observations,
    scaling_table,
    validate,
)
from tunelab.stats import StatsError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ScalingPlotData", "cores_lines", "gap_lines", "scaling_notes",
           "scaling_plot_data", "scaling_plots", "throughput_title"]


class ScalingPlotData(NamedTuple):
    """What the three plots show. ``model`` is None when no model could be fitted (a
    series without ``step_s``/``compute_s``/``grad_bytes``, or too few points);
    ``predicted`` then is empty, else it holds (series, nodes, workers, throughput) for the
    measured worker counts and, where the model's checks allow it
    (:func:`tunelab.scaling.forecast`), up to ``predict_to``; ``forecasts`` the same points'
    :class:`~tunelab.scaling.Forecast` (interval, extrapolation note); ``note`` says why the
    curve stops (or why there is none)."""

    fom: str
    points: tuple[ScalingPoint, ...]
    gaps: tuple[LayoutGap, ...]
    model: StepModel | None
    predicted: tuple[tuple[str, int, int, float], ...]
    note: str = ""
    forecasts: tuple[tuple[str, Forecast], ...] = ()


def scaling_plot_data(runs: pd.DataFrame, fom: str = "throughput", *,
                      predict_to: int = 32) -> ScalingPlotData:
    """Speedup table, layout gaps and (for a single series) the fitted model's curve per
    layout from 1 worker to ``predict_to`` (powers of two)."""
    points = tuple(scaling_table(runs, fom, "maximize"))
    gaps = tuple(layout_gaps(runs, fom, "maximize"))
    model: StepModel | None = None
    predicted: list[tuple[str, int, int, float]] = []
    forecasts: list[tuple[str, Forecast]] = []
    note = ""
    series = sorted({p.series for p in points})
    if len(series) == 1 and fom == "throughput":
        try:
            model = fit_step_model(observations(runs))
        except StatsError as exc:
            note = f"no model: {exc}"
    elif len(series) > 1:
        note = "no model: several series"
    if model is not None:
        obs = observations(runs)
        validation = validate(obs)
        measured = max(p.workers for p in points)
        sizes = sorted({1 << i for i in range(int(math.log2(max(predict_to, measured))) + 1)})
        for k in sorted({p.nodes for p in points}):
            for n in sizes:
                if n % k != 0 or n < k:
                    continue
                f = forecast(obs, n, k, model=model, validation=validation)
                if f.throughput is None:
                    note = note or f.cannot
                    break
                predicted.append((series[0], k, n, f.throughput))
                forecasts.append((series[0], f))
    return ScalingPlotData(fom, points, gaps, model, tuple(predicted), note, tuple(forecasts))


def gap_lines(gaps: Sequence[LayoutGap]) -> list[str]:
    """The seed's question in words, one line per worker count measured in several layouts:
    scale-out (more nodes) against scale-up (the fewest) at equal workers, the ratio of
    means with its interval, how much slower (or faster) scale-out is, and the verdict."""
    out = []
    for g in gaps:
        who = f"{g.series}, " if g.series else ""
        interval = ("" if math.isnan(g.ci_low) else f" [{g.ci_low:.3f}, {g.ci_high:.3f}]")
        pct = (1.0 - g.ratio) * 100
        how = f"{pct:.1f}% slower" if pct >= 0 else f"{-pct:.1f}% faster"
        out.append(f"Scale-out vs scale-up, {who}{g.workers} workers: {g.nodes} nodes vs "
                   f"{g.ref_nodes}: {g.ratio:.3f}x{interval} ({how}), {g.verdict} "
                   f"(n {g.n} and {g.n_ref})")
    if any(g.adjusted for g in gaps):
        out.append(f"Scale-out vs scale-up: the {len(gaps)} comparisons judged together by "
                   "Holm, each interval at the level Holm held its p to (it excludes 1 "
                   "exactly when the verdict is faster or slower)")
    return out


def cores_lines(runs: pd.DataFrame, fom: str = "throughput", direction: str = "maximize",
                ) -> tuple[list[str], list[dict[str, object]]]:
    """The points whose threads outnumbered the cores others left them
    (:func:`tunelab.scaling.cores.short_of_cores`, at the noise watch's
    :data:`~tunelab.noise.CONTENDED_SHARE`) and the speedups above the ideal resting on one,
    in words, and as JSON records; none where no run was short of cores."""
    from tunelab.noise import CONTENDED_SHARE
    from tunelab.scaling.cores import short_of_cores, superlinear

    try:
        short = short_of_cores(runs, fom, contended=CONTENDED_SHARE)
    except (StatsError, ValueError):  # no worker count, or one that is not a number
        return [], []
    if not short:
        return [], []
    lines = []
    for s in short:
        who = f"{s.series}, " if s.series else ""
        why = (f"; the {s.worker_threads:g} threads of a worker wait for each other at every "
               "operator when a core is taken" if s.worker_threads > 1 else "")
        lines.append(
            f"Short of cores: {who}{s.workers} worker(s) on {s.nodes} node(s): {s.short} of "
            f"{s.n} runs ran {s.threads:g} threads with {s.free:.1f} of {s.cpus:g} cores free "
            f"(others took {s.others_share:.0%}){why}: speedups of or against this point "
            "measure the load as much as the scaling")
    try:
        points = scaling_table(runs, fom, direction)
    except (StatsError, ValueError):
        points = []
    above: set[tuple[str, int, int]] = set()  # points of a speedup above the ideal
    for p, base in superlinear(points, short):
        who = f"{p.series}, " if p.series else ""
        lines.append(
            f"Not superlinear: {who}{p.workers} workers on {p.nodes} node(s): its mean "
            f"{p.mean:.4g} is {p.speedup:.2f}x the mean of {base.workers} worker(s), above the "
            f"ideal {p.ideal:g}x, "
            "and runs of it or of the baseline were short of cores (above); measure on quiet "
            "cores ('tunelab run --wait-quiet', '--rerun-disturbed')")
        above |= {(p.series, p.workers, p.nodes), (base.series, base.workers, base.nodes)}
    records: list[dict[str, object]] = [
        {**s.__dict__, "above_ideal": (s.series, s.workers, s.nodes) in above} for s in short]
    return lines, records


def scaling_notes(runs: pd.DataFrame, fom: str = "throughput") -> list[str]:
    """What the model's curve in the throughput plot rests on, for the HTML report: per
    layout, the predictions outside the measured sizes with their intervals and notes
    (how far extrapolated, a missing interval), and why the curve stops; none without a
    worker-count axis."""
    lines = [f"{line}." for line in cores_lines(runs, fom)[0]]
    try:
        data = scaling_plot_data(runs, fom)
    except StatsError:
        return lines
    lines.extend(f"{line}." for line in gap_lines(data.gaps))
    if data.model is not None:
        m = data.model
        lines.append(f"Scaling model (the dashed curves): fitted on {len(m.fitted_on)} "
                     f"measured layouts, mean residual {m.residual_pct:.1f}%.")
    measured = {(p.workers, p.nodes) for p in data.points}
    for k in sorted({f.nodes for _, f in data.forecasts}):
        outside = [f for _, f in data.forecasts if f.nodes == k
                   and (f.workers, f.nodes) not in measured and f.note]
        if outside:
            said = "; ".join(f"{f.workers} workers {_value(f)} ({f.note})" for f in outside)
            lines.append(f"Scaling model, {k} node(s), not measured: {said}.")
    if data.note:
        lines.append(f"Scaling model curve stops: {data.note}.")
    return lines


def _value(f: Forecast) -> str:
    if f.low is None or f.high is None:
        return f"{f.throughput:.4g}/s"
    return f"{f.throughput:.4g}/s [{f.low:.4g}, {f.high:.4g}]"


def scaling_plots(runs: pd.DataFrame, out_dir: str | Path, *, fom: str = "throughput",
                  prefix: str = "scaling") -> list[Path]:
    """Write ``<prefix>-throughput.png``, ``<prefix>-efficiency.png`` and, when a worker
    count was measured in several layouts, ``<prefix>-layouts.png``; their paths. No
    worker-count axis or no successful run: no plot."""
    try:
        data = scaling_plot_data(runs, fom)
    except StatsError:
        return []
    if not data.points:
        return []
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [_throughput_plot(data, out / f"{prefix}-throughput.png"),
             _efficiency_plot(data, out / f"{prefix}-efficiency.png")]
    if data.gaps:
        paths.append(_gap_plot(data.gaps, out / f"{prefix}-layouts.png"))
    return paths


def throughput_title(data: ScalingPlotData) -> str:
    """The throughput plot's title: it names the prediction band only when one is drawn (a
    fit with no degree of freedom to spare has none; the notes say so per point)."""
    if data.model is None:
        return "Throughput vs workers"
    if any(f.low is not None and f.high is not None for _, f in data.forecasts):
        return "Throughput vs workers (dashed: fitted model, band: its 95% prediction interval)"
    return "Throughput vs workers (dashed: fitted model; no prediction interval, see the notes)"


def _throughput_plot(data: ScalingPlotData, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5), layout="constrained")
    try:
        colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for i, ((series, k), pts) in enumerate(by_layout(data.points).items()):
            c = colours[i % len(colours)]
            x = [p.workers for p in pts]
            y = [p.mean for p in pts]
            err = [[0.0 if math.isnan(p.mean_low) else p.mean - p.mean_low for p in pts],
                   [0.0 if math.isnan(p.mean_high) else p.mean_high - p.mean for p in pts]]
            ax.errorbar(x, y, yerr=err, fmt="o-", color=c, capsize=3,
                        label=f"{layout_label(series, k)} measured")
            model = [(n, v) for s, kk, n, v in data.predicted if s == series and kk == k]
            if model:
                ax.plot([n for n, _ in model], [v for _, v in model], "--", color=c, alpha=0.7,
                        label=f"{layout_label(series, k)} model")
            band = [(f.workers, f.low, f.high) for s, f in data.forecasts
                    if s == series and f.nodes == k and f.low is not None and f.high is not None]
            if band:
                ax.fill_between([n for n, _, _ in band], [lo for _, lo, _ in band],
                                [hi for _, _, hi in band], color=c, alpha=0.12, linewidth=0)
        ideal_pts = [p for p in data.points if p.workers == min(q.workers for q in data.points)]
        if ideal_pts:
            b = ideal_pts[0]
            top = max([p.workers for p in data.points] + [n for _, _, n, _ in data.predicted])
            xs = [b.workers, top]
            ax.plot(xs, [b.mean * x / b.workers for x in xs], ":", color="black",
                    label="ideal (linear)")
        worker_axis(ax)
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(plain_numbers())
        ax.set_ylabel(f"{data.fom} (samples/s), mean and 95% t interval")
        figure_titles(fig, ax, throughput_title(data), "workers")
        ax.grid(alpha=0.3, which="both")
        legend_below(fig, ax)
        fig.savefig(path, format="png", dpi=110)
    finally:
        plt.close(fig)
    return path


def _efficiency_plot(data: ScalingPlotData, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5), layout="constrained")
    try:
        for (series, k), pts in by_layout(data.points).items():
            x = [p.workers for p in pts]
            y = [100 * p.efficiency for p in pts]
            low = [100 * (p.efficiency - p.efficiency_low) if p.n > 1 else 0.0 for p in pts]
            high = [100 * (p.efficiency_high - p.efficiency) if p.n > 1 else 0.0 for p in pts]
            low = [0.0 if math.isnan(v) else v for v in low]
            high = [0.0 if math.isnan(v) else v for v in high]
            ax.errorbar(x, y, yerr=[low, high], fmt="o-", capsize=3, label=layout_label(series, k))
        ax.axhline(100, color="black", linestyle=":", label="ideal")
        worker_axis(ax)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("parallel efficiency, % (95% CI)")
        figure_titles(fig, ax, "Efficiency vs workers (speedup / workers)", "workers")
        ax.grid(alpha=0.3)
        legend_below(fig, ax)
        fig.savefig(path, format="png", dpi=110)
    finally:
        plt.close(fig)
    return path


def _gap_plot(gaps: Sequence[LayoutGap], path: Path) -> Path:
    plt = pyplot()
    row = 0.8 if any(g.series for g in gaps) else 0.4  # the series: three lines more
    fig, ax = plt.subplots(figsize=(7.5, 1.8 + row * len(gaps)), layout="constrained")
    try:
        labels = [f"{g.workers} workers: {g.nodes} nodes vs {g.ref_nodes}"
                  + (f"\n{short_label(g.series, lines=3, keep_end=True)}" if g.series else "")
                  for g in gaps][::-1]
        ratio = [g.ratio for g in gaps][::-1]
        low = [0.0 if math.isnan(g.ci_low) else g.ratio - g.ci_low for g in gaps][::-1]
        high = [0.0 if math.isnan(g.ci_high) else g.ci_high - g.ratio for g in gaps][::-1]
        colour = {"better": "#2e7d32", "worse": "#c62828"}
        colours = [colour.get(g.verdict.value, "#9e9e9e") for g in gaps][::-1]
        y = list(range(len(gaps)))
        ax.barh(y, [r - 1 for r in ratio], left=1, color=colours, edgecolor="#424242")
        ax.errorbar(ratio, y, xerr=[low, high], fmt="none", ecolor="black", capsize=3)
        ax.axvline(1, color="black", linewidth=1)
        ax.set_yticks(y, labels)
        interval = "CI at the level Holm held each p to" if any(g.adjusted for g in gaps) \
            else "95% CI"
        figure_titles(fig, ax, "Scale-up vs scale-out at equal workers",
                      f"scale-out / scale-up throughput, {interval}\n(< 1: more nodes is "
                      "slower; grey: indistinguishable)")
        ax.grid(axis="x", alpha=0.3)
        fig.savefig(path, format="png", dpi=110)
    finally:
        plt.close(fig)
    return path
