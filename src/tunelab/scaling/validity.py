"""How far the step-time model can be trusted: checks that hold sizes out of the fit, the
prediction interval of a forecast, and an explicit refusal where it cannot predict.

* :func:`holdout` fits without some worker counts and compares its predictions with what
  was measured there (and the scale-out/scale-up ratios).
* :func:`validate` makes the two checks that matter: the **largest** worker count held out
  (fitted on the smaller ones only: the extrapolation error, at the factor largest /
  second largest), and each interior worker count held out in turn (interpolation).
* :func:`forecast` predicts the throughput at (workers, nodes) with a prediction interval:
  the fit's relative residual sd times ``sqrt(1 + leverage)`` (the weighted least-squares
  leverage of the target among the fitted points) on the fit's spare degrees of freedom;
  beyond the measured sizes the interval is at least as wide as the extrapolation check's
  largest error, at a layout not measured between them as the interpolation checks'
  largest; a fit with no degree of freedom to spare gives no interval (one held-out
  error is no estimate of the spread). The note says how far a point is extrapolated,
  beyond the largest measured size or below the smallest. Beyond the measured sizes it
  *refuses* ("cannot predict …", naming why) when no extrapolation check could be made, or
  when the check missed the held-out size by more than :data:`TOLERANCE`; past
  :data:`MAX_FACTOR` × the largest measured size it says that no check reached that far,
  and refuses when the fit also has no degree of freedom for an interval (a number with
  neither a check nor an interval behind it: fitted on 1–4 workers, it said 778 images/s
  for 16 workers that ran at 1,215).
  It refuses a layout on several nodes when every fitted point was on one node (the link
  between nodes was never measured), and any other worker count when only one was
  measured. It never returns NaN.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

from tunelab.scaling.model import Observation, StepModel, features, fit_step_model
from tunelab.stats import StatsError

__all__ = ["MAX_FACTOR", "TOLERANCE", "Forecast", "Holdout", "Prediction", "Validation",
           "forecast", "holdout", "validate"]

MAX_FACTOR = 2.0
"""A forecast beyond this multiple of the largest measured worker count (or node count)
carries a warning: no held-out check reaches that far."""

TOLERANCE = 0.15
"""Extrapolation is refused when the held-out check of the largest size missed by more."""


@dataclass(frozen=True)
class Prediction:
    """Model against measurement at one measured (workers, nodes) point."""

    workers: int
    nodes: int
    predicted: float
    measured: float
    held_out: bool

    @property
    def error(self) -> float:
        """(predicted − measured) / measured."""
        return self.predicted / self.measured - 1.0


@dataclass(frozen=True)
class Holdout:
    """A fit without the worker counts ``held`` and how it predicts every measured point.

    ``factor`` is the largest held-out worker count over the largest fitted one (> 1: the
    check extrapolates); ``ratios`` compares scale-out/scale-up throughput ratios at the
    held-out worker counts measured in several layouts (workers, ref nodes, nodes,
    measured, predicted)."""

    held: tuple[int, ...]
    model: StepModel
    points: tuple[Prediction, ...]
    factor: float
    ratios: tuple[tuple[int, int, int, float, float], ...] = ()

    @property
    def errors(self) -> list[float]:
        """Relative errors on the held-out points."""
        return [p.error for p in self.points if p.held_out]

    @property
    def max_error(self) -> float:
        """Largest absolute relative error on a held-out point."""
        return max(abs(e) for e in self.errors)

    @property
    def mean_error(self) -> float:
        """Mean absolute relative error on the held-out points."""
        return float(np.mean([abs(e) for e in self.errors]))


def holdout(obs: Sequence[Observation], held: Iterable[int], *,
            shared_cores: float | None = None) -> Holdout:
    """Fit without the worker counts ``held``; predict every measured point. Raises
    :class:`StatsError` when nothing is held out or too little is left to fit."""
    held = tuple(sorted(set(held)))
    fitted = [o for o in obs if o.workers not in held]
    if not held or not fitted or len(fitted) == len(obs):
        counts = ", ".join(str(n) for n in sorted({o.workers for o in obs})) or "none"
        raise StatsError(f"cannot hold out {', '.join(map(str, held)) or 'nothing'} "
                         f"worker(s): a held-out check needs measured worker counts to hold "
                         f"out and others to fit (measured: {counts})")
    model = fit_step_model(obs, exclude=[(o.workers, o.nodes) for o in obs
                                         if o.workers in held], shared_cores=shared_cores)
    points = tuple(Prediction(o.workers, o.nodes, model.throughput(o.workers, o.nodes),
                              o.throughput, o.workers in held) for o in obs)
    by = {(o.workers, o.nodes): o for o in obs}
    ratios = []
    for n in held:
        layouts = sorted(k for (m, k) in by if m == n)
        for k in layouts[1:]:
            ratios.append((n, layouts[0], k, by[(n, k)].throughput / by[(n, layouts[0])].throughput,
                           model.throughput(n, k) / model.throughput(n, layouts[0])))
    factor = max(held) / max(o.workers for o in fitted)
    return Holdout(held, model, points, factor, tuple(ratios))


@dataclass(frozen=True)
class Validation:
    """The model's checks: ``extrapolation`` holds out the largest worker count (None, with
    ``why_not``, when it cannot be made), ``interpolation`` each interior one in turn."""

    extrapolation: Holdout | None
    interpolation: tuple[Holdout, ...]
    why_not: str = ""


def validate(obs: Sequence[Observation], *, shared_cores: float | None = None) -> Validation:
    """The extrapolation and interpolation checks of the model on ``obs`` (module
    docstring)."""
    counts = sorted({o.workers for o in obs})
    if len(counts) < 3:
        return Validation(None, (), f"only {len(counts)} worker count(s) measured "
                          f"({', '.join(map(str, counts))}): a check of the largest needs "
                          "at least two others to fit on")
    try:
        extrapolation: Holdout | None = holdout(obs, [counts[-1]], shared_cores=shared_cores)
        why = ""
    except StatsError as exc:
        extrapolation, why = None, f"the check of the largest size could not be fitted: {exc}"
    inner = []
    for n in counts[1:-1]:
        try:
            inner.append(holdout(obs, [n], shared_cores=shared_cores))
        except StatsError:
            continue
    return Validation(extrapolation, tuple(inner), why)


@dataclass(frozen=True)
class Forecast:
    """The model's throughput at (workers, nodes) with its prediction interval, or why it
    cannot say. ``factor`` is how far beyond the measured sizes the point lies (the larger
    of workers and nodes over the largest measured; <= 1 inside, or below the smallest).
    ``throughput`` and the interval are None exactly when ``cannot`` gives the reason;
    ``low``/``high`` are also None, with a note, when the fit has no degree of freedom to
    spare. ``note`` says when the point is extrapolated (how far beyond or below the
    measured sizes, and the held-out check's error), and warns (beyond :data:`MAX_FACTOR`,
    a wide interval)."""

    workers: int
    nodes: int
    factor: float
    throughput: float | None
    low: float | None
    high: float | None
    cannot: str = ""
    note: str = ""


def _leverage(model: StepModel, obs: Sequence[Observation], workers: int, nodes: int) -> float:
    """Weighted least-squares leverage of (workers, nodes) among the fitted points, over the
    terms the fit kept (NaN when the design is degenerate)."""
    active = [model.overhead_s > 0, math.isfinite(model.host_bw), math.isfinite(model.link_bw)]
    fitted = set(model.fitted_on)
    rows = [np.array(features(o.workers, o.nodes, o.grad_bytes, model.shared_cores))[active]
            / o.step_s for o in obs if (o.workers, o.nodes) in fitted]
    if not rows or not any(active):
        return 0.0
    x = np.array(rows)
    target = np.array(features(workers, nodes, model.grad_bytes, model.shared_cores))[active]
    target = target / model.step_s(workers, nodes)
    return float(target @ np.linalg.pinv(x.T @ x) @ target)


def forecast(obs: Sequence[Observation], workers: int, nodes: int = 1, *,
             model: StepModel | None = None, validation: Validation | None = None,
             confidence: float = 0.95, shared_cores: float | None = None) -> Forecast:
    """The throughput at (``workers``, ``nodes``) with its prediction interval at
    ``confidence``, or the reason it cannot be predicted (module docstring). ``model``
    defaults to the fit on every observation, ``validation`` to :func:`validate`."""
    most_workers = max((o.workers for o in obs), default=0)
    most_nodes = max((o.nodes for o in obs), default=0)
    if workers < 1 or nodes < 1 or nodes > workers:
        return Forecast(workers, nodes, math.inf, None, None, None,
                        f"cannot predict {workers} workers on {nodes} node(s): a layout needs "
                        "at least 1 worker on each of at least 1 node")
    if not obs:
        return Forecast(workers, nodes, math.inf, None, None, None, "cannot predict: no "
                        "measured point")
    factor = max(workers / most_workers, nodes / most_nodes)
    try:
        model = model or fit_step_model(obs, shared_cores=shared_cores)
    except StatsError as exc:
        return Forecast(workers, nodes, factor, None, None, None, f"cannot predict: {exc}")
    where = f"{workers} workers on {nodes} node(s)"
    if nodes > 1 and not any(k > 1 for _, k in model.fitted_on):
        return Forecast(workers, nodes, factor, None, None, None,
                        f"cannot predict {where}: every measured point is on one node, so "
                        "the link between nodes was never measured (the model would count "
                        "it free); measure a layout on 2 or more nodes")
    counts = sorted({o.workers for o in obs})
    if workers not in counts and len(counts) < 2:
        return Forecast(workers, nodes, factor, None, None, None,
                        f"cannot predict {where}: only {counts[0]} workers measured, so the "
                        "model has no other worker count to scale from")
    floor = 0.0
    notes = []
    if factor > 1:
        validation = validation or validate(obs, shared_cores=shared_cores)
        check = validation.extrapolation
        if check is None:
            return Forecast(workers, nodes, factor, None, None, None,
                            f"cannot predict {where}, beyond the measured sizes: "
                            f"{validation.why_not}")
        if check.max_error > TOLERANCE:
            return Forecast(workers, nodes, factor, None, None, None,
                            f"cannot predict {where}, beyond the measured sizes: fitted "
                            f"without the {max(check.held)}-worker points, the model missed "
                            f"them by up to {check.max_error:.0%} (more than "
                            f"{TOLERANCE:.0%}), so it does not extrapolate on these runs")
        floor = math.log1p(check.max_error)
        notes.append(f"extrapolated {factor:.1f}x beyond the largest measured size "
                     f"({most_workers} workers, {most_nodes} node(s)); fitted without the "
                     f"{max(check.held)}-worker points it missed them by up to "
                     f"{check.max_error:.0%}")
        if factor > MAX_FACTOR:
            if model.residual_df <= 0 or not math.isfinite(model.residual_sd):
                return Forecast(workers, nodes, factor, None, None, None,
                                f"cannot predict {where}, {factor:.1f}x beyond the largest "
                                f"measured size: no check reached further than "
                                f"{MAX_FACTOR:g}x and the fit has no degree of freedom to "
                                "spare for an interval; measure a larger size")
            notes.append(f"no check reached further than {MAX_FACTOR:g}x")
    elif workers < counts[0]:
        notes.append(f"extrapolated below the smallest measured size ({counts[0]} workers): "
                     "no check held it out")
    elif all((o.workers, o.nodes) != (workers, nodes) for o in obs):
        validation = validation or validate(obs, shared_cores=shared_cores)
        if validation.interpolation:
            worst = max(validation.interpolation, key=lambda h: h.max_error)
            floor = math.log1p(worst.max_error)
            notes.append(f"between the measured sizes: fitted without the "
                         f"{worst.held[0]}-worker points it missed them by up to "
                         f"{worst.max_error:.0%}")
    value = float(model.throughput(workers, nodes))
    if model.residual_df <= 0 or not math.isfinite(model.residual_sd):
        # a held-out check's one error is no estimate of the spread: no interval at all
        return Forecast(workers, nodes, factor, value, None, None, note="; ".join(
            [*notes, "no interval: the fit has no degree of freedom to spare"]))
    crit = float(special.stdtrit(model.residual_df, 0.5 + confidence / 2))
    h = _leverage(model, obs, workers, nodes)
    half = max(crit * model.residual_sd * math.sqrt(1 + max(h, 0.0)), floor)
    if math.expm1(half) > TOLERANCE:
        notes.append(f"uncertain: the {confidence:.0%} interval reaches ±{math.expm1(half):.0%}")
    return Forecast(workers, nodes, factor, value, value * math.exp(-half),
                    value * math.exp(half), note="; ".join(notes))
