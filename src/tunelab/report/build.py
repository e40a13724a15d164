"""All of a study's report in one call: statistics, plots and the HTML file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunelab.errors import TunelabError
from tunelab.stats import (
    DEFAULT_RESAMPLES,
    BestResult,
    PointComparison,
    PointSummary,
    StatsError,
    best,
    compare_to_baseline,
    summarize,
)

if TYPE_CHECKING:
    import pandas as pd

    from tunelab.workloads.base import Objective

__all__ = ["ReportFiles", "write_study_report"]


@dataclass(frozen=True)
class ReportFiles:
    """What :func:`write_study_report` computed and wrote."""

    html: Path
    images: tuple[Path, ...]
    summaries: tuple[PointSummary, ...]
    comparisons: tuple[PointComparison, ...]
    best: BestResult | None
    notes: tuple[str, ...]


def write_study_report(
    out_dir: str | Path,
    runs: pd.DataFrame,
    objective: Objective,
    baseline_key: str | None = None,
    *,
    title: str = "tunelab report",
    study_spec: Mapping[str, Any] | None = None,
    sysinfo: Mapping[str, Any] | None = None,
    noise_threshold: float = 0.02,
    confidence: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> ReportFiles:
    """Summarise, compare with the baseline, pick the best, draw both plots and write
    ``out_dir/report.html`` (plots as ``out_dir/speedup.png`` and ``out_dir/fom_by_point.png``).

    Statistics that cannot be computed (no successful run, a baseline without successful
    runs) become notes in the report rather than errors; an unknown figure of merit or an
    unwritable directory raises :class:`~tunelab.errors.TunelabError`.
    """
    from tunelab.report.html import write_html_report
    from tunelab.report.plots import fom_by_point_chart, speedup_bar_chart

    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TunelabError(f"cannot create report directory {out}: {exc.strerror}") from exc
    fom, direction = objective.fom, objective.direction
    options: dict[str, Any] = {
        "noise_threshold": noise_threshold,
        "confidence": confidence,
        "n_resamples": n_resamples,
        "seed": seed,
    }
    summaries = summarize(runs, fom)
    notes: list[str] = []
    comparisons: list[PointComparison] = []
    if baseline_key is not None:
        try:
            comparisons = compare_to_baseline(runs, fom, direction, baseline_key, **options)
        except StatsError as exc:
            notes.append(f"No comparison with the baseline: {exc}.")
    result: BestResult | None = None
    if len(runs):
        try:
            result = best(runs, fom, direction, **options)
        except StatsError as exc:
            notes.append(f"No best point: {exc}.")
    images = []
    if comparisons:
        images.append(
            speedup_bar_chart(
                comparisons,
                out / "speedup.png",
                objective=objective,
                title=f"{title}: speedup over the baseline",
            )  # fmt: skip
        )
    if len(runs):
        order = [pc.point for pc in comparisons] or None
        images.append(
            fom_by_point_chart(
                runs, fom, out / "fom_by_point.png", order=order, baseline=baseline_key
            )
        )
    html = write_html_report(
        out / "report.html",
        title=title,
        study_spec=study_spec,
        sysinfo=sysinfo,
        summaries=summaries,
        comparisons=comparisons,
        best=result,
        images=images,
        runs=runs,
        objective=objective,
        notes=notes,
    )
    return ReportFiles(
        html, tuple(images), tuple(summaries), tuple(comparisons), result, tuple(notes)
    )
