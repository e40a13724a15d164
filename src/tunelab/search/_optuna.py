"""Model-based search with Optuna (TPE, Gaussian process or CMA-ES), through ask-and-tell.

The sampler sees the space through :class:`~tunelab.search._encoding.SpaceEncoding`
(ordered positions for numeric axes, one dimension per environment variable). Its joint
proposal for a trial is moved to a valid point not proposed before — when it proposes a
point proposed already, a free neighbour one step away or else a free point, drawn at
random; when it proposes an invalid combination, the nearest free one
(:meth:`~tunelab.search._encoding.SpaceEncoding.nearest`) — and that point
is what the trial records — so every ask yields a new valid point (no rejection loop, no
"exhausted" before every valid point was proposed) and the model learns from the points that
really ran. A point told without having been proposed (the baseline raced by another
strategy) is added to the study as a finished trial. With the same seed and results the
proposals repeat, which is what lets an interrupted study resume.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

from tunelab.errors import StudyError
from tunelab.search._encoding import SpaceEncoding
from tunelab.search.base import Strategy
from tunelab.space import Point, Space

if TYPE_CHECKING:
    import optuna

__all__ = ["SAMPLERS", "OptunaSearch"]

SAMPLERS = ("tpe", "gp", "cmaes")


def _base_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True)
    if name == "gp":
        try:
            import torch  # noqa: F401 - optuna's GPSampler needs it
        except ImportError:
            raise StudyError("search sampler 'gp' needs torch: pip install 'tunelab[leopard]'"
                             ) from None
        return optuna.samplers.GPSampler(seed=seed)
    if name == "cmaes":
        try:
            import cmaes  # noqa: F401 - optuna's CmaEsSampler needs it
        except ImportError:
            raise StudyError("search sampler 'cmaes' needs the cmaes package: "
                             "pip install cmaes") from None
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    raise StudyError(f"unknown search sampler {name!r}; valid: {', '.join(SAMPLERS)}")


def _valid_sampler(base: optuna.samplers.BaseSampler, encoding: SpaceEncoding) -> Any:
    """``base``'s joint proposal, moved to a valid point not yet proposed
    (:meth:`SpaceEncoding.nearest`; in the base's random start, any proposal that is not a
    free point goes to a free point drawn at random)."""
    import optuna
    from optuna.distributions import BaseDistribution
    from optuna.study import Study
    from optuna.trial import FrozenTrial, TrialState

    distributions = _distributions(encoding)

    class ValidPointSampler(optuna.samplers.BaseSampler):
        def __init__(self) -> None:
            self._chosen: dict[int, dict[str, Any]] = {}
            self.proposed: dict[int, Point] = {}

        def infer_relative_search_space(self, study: Study, trial: FrozenTrial
                                        ) -> dict[str, BaseDistribution]:
            return {}

        def sample_relative(self, study: Study, trial: FrozenTrial,
                            search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
            return {}

        def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                               param_distribution: BaseDistribution) -> Any:
            chosen = self._chosen.get(trial.number)
            if chosen is None:
                space = base.infer_relative_search_space(study, trial)
                raw = dict(base.sample_relative(study, trial, space)) if space else {}
                for name, dist in distributions.items():
                    if name not in raw:
                        raw[name] = base.sample_independent(study, trial, name, dist)
                done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                exploring = len(done) < getattr(base, "_n_startup_trials", 0)
                point = encoding.nearest(raw, spill_at_random=exploring)
                if point is None:  # every valid point was proposed: the caller checks first
                    raise RuntimeError("no valid point left to propose")
                self.proposed[trial.number] = point
                chosen = self._chosen[trial.number] = encoding.params(point)
            return chosen[param_name]

        def before_trial(self, study: Study, trial: FrozenTrial) -> None:
            base.before_trial(study, trial)

        def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState,
                        values: Sequence[float] | None) -> None:
            self._chosen.pop(trial.number, None)
            base.after_trial(study, trial, state, values)

        def reseed_rng(self) -> None:
            base.reseed_rng()

    return ValidPointSampler()


def _distributions(encoding: SpaceEncoding) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution, IntDistribution

    out: dict[str, Any] = {}
    for d in encoding.dimensions:
        if d.numeric:
            out[d.name] = IntDistribution(0, max(len(d.choices) - 1, 0))
        else:
            out[d.name] = CategoricalDistribution(list(d.choices))
    return out


class OptunaSearch(Strategy):
    """Up to ``trials`` distinct valid points proposed by an Optuna sampler."""

    name = "optuna"
    adaptive = True

    def __init__(self, space: Space, *, trials: int, direction: str, seed: int = 0,
                 first: Point | None = None, sampler: str = "tpe",
                 env_sets: dict[str, dict[str, str]] | None = None) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self._encoding = SpaceEncoding(space, env_sets, seed)
        self._distributions = _distributions(self._encoding)
        self._trials = min(trials, len(self._encoding.points))
        self._sampler = _valid_sampler(_base_sampler(sampler, seed), self._encoding)
        self._study = optuna.create_study(
            direction=cast(Literal["minimize", "maximize"], direction), sampler=self._sampler)
        self._pending: dict[Point, Any] = {}
        self._seen: dict[Point, float | None] = {}
        self._first = first if first is not None and self._encoding.index(first) is not None \
            else None

    def ask(self, n: int) -> list[Point]:
        out: list[Point] = []
        while len(out) < n and not self.done:
            first, self._first = self._first, None
            if first is not None:
                if first in self._seen:
                    continue
                self._encoding.taken[self._encoding.index(first)] = True
                self._study.enqueue_trial(self._encoding.params(first))
            trial = self._study.ask()
            for name, dist in self._distributions.items():
                if hasattr(dist, "choices"):
                    trial.suggest_categorical(name, dist.choices)
                else:
                    trial.suggest_int(name, dist.low, dist.high)
            point = first if first is not None else self._sampler.proposed.pop(trial.number)
            self._pending[point] = trial
            out.append(point)
        return out

    def tell(self, point: Point, value: float | None) -> None:
        trial = self._pending.pop(point, None)
        fail = self._optuna.trial.TrialState.FAIL
        if trial is None:  # measured by someone else (e.g. a raced baseline): record it
            index = self._encoding.index(point)
            if index is None or point in self._seen:
                return
            self._encoding.taken[index] = True
            extra: dict[str, Any] = {"state": fail} if value is None else {"value": value}
            self._study.add_trial(self._optuna.trial.create_trial(
                params=self._encoding.params(point), distributions=self._distributions, **extra))
        elif value is None:
            self._study.tell(trial, state=fail)
        else:
            self._study.tell(trial, value)
        self._seen[point] = value

    @property
    def done(self) -> bool:
        if len(self._seen) + len(self._pending) >= self._trials:
            return True
        return self._first is None and bool(self._encoding.taken.all())
