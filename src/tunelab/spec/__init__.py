"""Study files: YAML in, a validated :class:`StudySpec` out, with line-precise errors.

``load_study(path)`` reads the YAML with line numbers kept, validates its structure with
pydantic, then checks every parameter, derived value, constraint, environment set, the
baseline and the objective. Every problem is one :class:`~tunelab.errors.StudyError` of the
form ``study.yaml:12: parameter 'npool': 'step' must be a positive integer, got 0``.

Import from here; the modules behind it, lowest first: :mod:`~tunelab.spec.lines` (line
numbers for the errors), :mod:`~tunelab.spec.values` (parameters, environment sets,
durations, constraints), :mod:`~tunelab.spec.sections` (the file's raw structure, one
pydantic model per section), :mod:`~tunelab.spec.study` (:class:`StudySpec`,
:func:`load_study`).
"""

from __future__ import annotations

from tunelab.spec.sections import StrategyName as StrategyName
from tunelab.spec.sections import name_problem as name_problem
from tunelab.spec.study import StudySpec, load_study
from tunelab.spec.values import ENV_AXIS as ENV_AXIS
from tunelab.spec.values import ConstraintSpec, ParameterSpec, parse_duration
from tunelab.spec.values import Scalar as Scalar
from tunelab.spec.values import value_text as value_text

__all__ = [
    "ConstraintSpec",
    "ParameterSpec",
    "StudySpec",
    "load_study",
    "parse_duration",
]
