"""Pruning: stop a training run early when its intermediate figures cannot keep up.

A program reports intermediate figures as JSON lines on stdout while it runs::

    {"intermediate": {"step": 3, "val_pr_auc": 0.41}}

(``step`` or ``epoch``; the objective's figure of merit by name). :class:`IntermediateTail`
reads the lines a run has written so far; :class:`RunPruner` gives every run of a study an
Optuna trial, reports the run's figures to it and asks Optuna's pruner whether to stop —
the median pruner: a run whose best figure at a step is worse than the median of the earlier
runs at that step is stopped, after ``startup_runs`` complete runs and ``warmup_steps`` of its
own (steps count from 1, like epochs: with ``warmup_steps=1`` step 2 is the first that can
stop a run). The runner then kills the run and records it as ``pruned``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

__all__ = ["INTERMEDIATE_KEY", "IntermediateTail", "PruneTrial", "RunPruner"]

INTERMEDIATE_KEY = "intermediate"
_MAX_LINE = 1 << 16
_STEP_KEYS = ("step", "epoch")


def _parse(line: str, fom: str) -> tuple[int, float] | None:
    line = line.strip()
    if not line.startswith("{") or len(line) > _MAX_LINE:
        return None
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    inner = doc.get(INTERMEDIATE_KEY) if isinstance(doc, dict) else None
    if not isinstance(inner, dict):
        return None
    step = next((inner[k] for k in _STEP_KEYS if k in inner), None)
    value = inner.get(fom)
    if isinstance(step, bool) or not isinstance(step, int):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value):
        return None
    return step, float(value)


@dataclass
class IntermediateTail:
    """The (step, value) pairs a run's stdout file has gained since the last read."""

    path: Path
    fom: str
    _offset: int = 0
    _partial: bytes = field(default=b"", repr=False)

    def read(self) -> list[tuple[int, float]]:
        """New complete lines' intermediate figures (a half-written line waits)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return []
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()[-_MAX_LINE:]
        out = []
        for raw in lines:
            parsed = _parse(raw.decode(errors="replace"), self.fom)
            if parsed is not None:
                out.append(parsed)
        return out


@dataclass
class PruneTrial:
    """One run's trial: what it reported and whether it was stopped."""

    trial: Any
    steps: list[tuple[int, float]] = field(default_factory=list)
    pruned_at: int | None = None


class RunPruner:
    """Optuna's median pruner over the runs of one study (see the module docstring)."""

    def __init__(self, direction: str, *, startup_runs: int = 2, warmup_steps: int = 1) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self._study = optuna.create_study(
            direction=cast(Literal["minimize", "maximize"], direction),
            pruner=optuna.pruners.MedianPruner(n_startup_trials=startup_runs,
                                               n_warmup_steps=warmup_steps + 1))

    def begin(self) -> PruneTrial:
        """A trial for a run about to start."""
        return PruneTrial(self._study.ask())

    def report(self, run: PruneTrial, step: int, value: float) -> bool:
        """Report one intermediate figure; True when the run should stop now."""
        if run.pruned_at is not None:
            return True
        if any(s == step for s, _ in run.steps):  # Optuna keeps the first value of a step
            return False
        run.steps.append((step, value))
        run.trial.report(value, step)
        if run.trial.should_prune():
            run.pruned_at = step
            return True
        return False

    def end(self, run: PruneTrial, value: float | None) -> None:
        """Close the run's trial: pruned, completed with ``value``, or failed (None)."""
        state = self._optuna.trial.TrialState
        if run.pruned_at is not None:
            self._study.tell(run.trial, state=state.PRUNED)
        elif value is None or not math.isfinite(value):
            self._study.tell(run.trial, state=state.FAIL)
        else:
            self._study.tell(run.trial, value)
