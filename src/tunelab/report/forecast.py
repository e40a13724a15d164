"""What ``tunelab forecast`` shows: the scaling model's throughput at layouts a study did not
(or did) measure, each with its prediction interval and how far it is extrapolated, or why it
cannot be predicted (:func:`tunelab.scaling.forecast`), as a :class:`View`."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from tunelab.report.output import SCHEMA_VERSION, Cell, Column, Lines, TextTable, View
from tunelab.scaling import Forecast, fit_step_model, forecast, observations, validate

__all__ = ["forecast_view"]

_FIELDS = ("workers", "nodes", "measured", "throughput", "low", "high", "factor", "note",
           "cannot")


def forecast_view(study: str, runs: pd.DataFrame, layouts: Sequence[tuple[int, int]], *,
                  confidence: float = 0.95) -> View:
    """The model fitted on ``runs`` (the study ``study``'s), and its forecast at each
    (workers, nodes) of ``layouts``: throughput [low, high] at ``confidence`` beside what was
    measured there, with the forecast's note; or its reason when it cannot predict one.
    Raises :class:`~tunelab.stats.StatsError` when no model can be fitted on the runs."""
    obs = observations(runs)
    model = fit_step_model(obs)
    validation = validate(obs)
    measured = {(o.workers, o.nodes): o.throughput for o in obs}
    records = []
    rows: list[dict[str, Cell]] = []
    for workers, nodes in layouts:
        f = forecast(obs, workers, nodes, model=model, validation=validation,
                     confidence=confidence)
        seen = measured.get((workers, nodes))
        records.append(_record(f, seen))
        rows.append({"workers": str(workers), "nodes": str(nodes),
                     "measured": "" if seen is None else f"{seen:,.1f}",
                     "forecast": _value(f), "note": f.cannot or f.note})
    layouts_fitted = ", ".join(f"{n}x{k}" for n, k in model.fitted_on)
    title = (f"scaling model of study {study!r}: throughput (samples/s), fitted on "
             f"{len(model.fitted_on)} measured layouts (workers x nodes: {layouts_fitted}), "
             f"mean residual {model.residual_pct:.1f}%; {confidence:.0%} intervals")
    columns = (Column("workers", "workers", "right"), Column("nodes", "nodes", "right"),
               Column("measured", "measured", "right", drop=2),
               Column("forecast", "forecast", "right"), Column("note", "note", wrap=True))
    checks = (f"held-out check of the largest size: missed by up to "
              f"{validation.extrapolation.max_error:.0%}" if validation.extrapolation
              else f"no held-out check of the largest size: {validation.why_not}")
    document = {"schema": "tunelab.forecast", "version": SCHEMA_VERSION, "study": study,
                "fom": "throughput", "confidence": confidence,
                "model": {"fitted_on": [list(p) for p in model.fitted_on],
                          "residual_pct": model.residual_pct,
                          "residual_df": model.residual_df},
                "check": checks, "forecasts": records}
    return View((TextTable(title, columns, tuple(rows)), Lines((checks,))), document,
                tuple(records), _FIELDS)


def _value(f: Forecast) -> str:
    if f.throughput is None:
        return "cannot"
    if f.low is None or f.high is None:
        return f"{f.throughput:,.1f}"
    return f"{f.throughput:,.1f} [{f.low:,.1f}, {f.high:,.1f}]"


def _record(f: Forecast, measured: float | None) -> dict[str, object]:
    return {"workers": f.workers, "nodes": f.nodes, "measured": measured,
            "throughput": f.throughput, "low": f.low, "high": f.high,
            "factor": f.factor if math.isfinite(f.factor) else None,
            "note": f.note or None, "cannot": f.cannot or None}
