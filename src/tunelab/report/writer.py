"""``tunelab report``: the plots of a study drawn beside the report, then one self-contained
HTML file (:func:`write_report`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tunelab.report.results import StudyResults
from tunelab.stats import BestResult, StatsError

if TYPE_CHECKING:
    from tunelab.crossstudy import StudyComparison
    from tunelab.report.html import ImageSource
    from tunelab.workload import Workload

__all__ = ["write_report"]


def write_report(results: StudyResults, path: str | Path, *,
                 cross: StudyComparison | None = None) -> Path:
    """Draw the plots beside ``path`` (``<stem>-speedup.png``, ``<stem>-runs.png``) and
    write the self-contained HTML report to ``path``; returns ``path``. ``cross`` (this
    study judged against another) adds a section."""
    from tunelab.errors import TunelabError
    from tunelab.report.html import write_html_report
    from tunelab.report.plots import (
        MAX_BARS,
        fom_by_point_chart,
        speedup_axis,
        speedup_bar_chart,
        speedup_bars,
    )
    from tunelab.report.table import table_rows

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TunelabError(f"cannot create {path.parent}: {exc.strerror}") from exc
    from tunelab.report.storage import storage_notes

    notes = list(results.notes) + [e.line for e in results.exclusions]
    notes += storage_notes(results.runs)  # a ddp study with an input pipeline: needed MB/s
    best_result: BestResult | None = None
    if len(results.runs):
        try:
            best_result = results.best_result()
        except StatsError as exc:
            notes.append(f"No best point: {exc}.")
    fom = results.objective.fom.removeprefix("fom.")
    images: list[ImageSource] = []
    if speedup_bars(results.comparisons):  # none: no point has a ratio (runs <= 0)
        chart = speedup_bar_chart(
            results.comparisons,
            path.with_name(f"{path.stem}-speedup.png"),
            f"{results.name}: speedup over the baseline",
            objective=results.objective,
        )
        images.append((chart, (
            f"How much better each point's {fom} is than the baseline's (1× = the same), "
            f"with its {results.confidence:.0%} confidence interval; the shaded band is the "
            f"±{results.noise_threshold:.0%} noise threshold, inside which no difference is "
            "claimed." + _cut_sentence(speedup_axis(speedup_bars(results.comparisons)[:MAX_BARS],
                                                    results.noise_threshold).cut))))
    if any(s.n for s in results.summaries):
        order = [row.point for row in table_rows(results.comparisons or results.summaries,
                                                  results.objective)]  # fmt: skip
        chart = fom_by_point_chart(
            results.runs,
            results.objective.fom,
            path.with_name(f"{path.stem}-runs.png"),
            order=order,
            baseline=results.baseline,
        )
        images.append((chart, (
            f"{fom} of every run, one row per point in the table's order: each dot is a run, "
            "the box spans the middle half of a point's runs and its line is the median.")))
    images.extend(_workload_plots(results, path, best_result))
    notes += _workload_notes(results)
    from tunelab.report.headroom import headroom_report

    lines, figure = headroom_report(results, best_result, path)  # every point beside its limit
    notes += lines
    images += [figure] if figure else []
    from tunelab.report.rates import byte_rates, rates_table

    rates = byte_rates(results)  # a workload with figures in B/s: them per point, in GB/s
    return write_html_report(
        path,
        title=f"tunelab: {results.name}",
        study_spec=results.spec_yaml or results.spec,
        study_file=results.study_file,
        cross=cross,
        sysinfo=results.sysinfo,
        summaries=results.summaries,
        comparisons=results.comparisons,
        best=best_result,
        images=images,
        runs=results.runs,
        objective=results.objective,
        notes=notes,
        tables=(rates_table(rates),) if rates is not None else (),
    )


def _workload_plots(
    results: StudyResults, path: Path, best_result: BestResult | None
) -> list[Path]:
    """The study's workload's own plots (e.g. pw.x wall time vs np), written beside ``path``."""
    from tunelab.report.scaling import scaling_plots
    from tunelab.report.storage import storage_plots

    cls = _measured_workload(results)
    if cls is None:
        return []
    figures = {"scaling": lambda: scaling_plots(results.runs, path.parent,
                                                fom=results.objective.fom),
               "storage": lambda: storage_plots(results.runs, path.parent)}
    paths = [p for name in cls.report_figures if name in figures for p in figures[name]()]
    return paths + cls.report_plots(
        results.runs, path.parent, objective=results.objective,
        best=best_result.best.point if best_result is not None else None,
        baseline=results.baseline,
    )


def _workload_notes(results: StudyResults) -> list[str]:
    """What the workload's figures rest on, in words: the scaling model's predictions
    outside the measured sizes (how far extrapolated, with their intervals) and why its
    curve stops."""
    from tunelab.report.scaling import scaling_notes

    cls = _measured_workload(results)
    if cls is None or "scaling" not in cls.report_figures:
        return []
    return scaling_notes(results.runs, results.objective.fom)


def _measured_workload(results: StudyResults) -> type[Workload] | None:
    """The class of the study's workload, when it is known here and some point has runs."""
    from tunelab.errors import WorkloadError
    from tunelab.workload import get_workload

    workload = results.spec.get("workload", {})
    name = workload.get("name") if isinstance(workload, dict) else None
    if not name or not any(s.n for s in results.summaries):
        return None
    try:
        return get_workload(str(name))
    except WorkloadError:
        return None


def _cut_sentence(cut: tuple[int, ...]) -> str:
    """The speedup figure's caption on the intervals it draws cut (none: nothing)."""
    if not cut:
        return ""
    which = "An interval" if len(cut) == 1 else f"{len(cut)} intervals"
    return (f" {which} far wider than the others (a point of few or scattered runs) "
            f"{'is' if len(cut) == 1 else 'are'} cut at the axis's edge, marked by an arrow, "
            f"with {'its' if len(cut) == 1 else 'their'} bounds written beside "
            f"{'it' if len(cut) == 1 else 'them'}, so that every other bar stays readable.")
