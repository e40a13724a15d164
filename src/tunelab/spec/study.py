"""A validated study, :class:`StudySpec`, and :func:`load_study`, which builds one from a file.

``load_study(path)`` reads the YAML with line numbers kept (:mod:`tunelab.safeyaml`),
validates its structure (:mod:`tunelab.spec.sections`), then checks every parameter, derived
value, constraint, environment set, the baseline and the objective
(:mod:`tunelab.spec.values`); each problem is one line-precise
:class:`~tunelab.errors.StudyError`.
"""

from __future__ import annotations

import hashlib
import json
import keyword
import math
import os
import stat
import unicodedata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from tunelab.errors import StudyError
from tunelab.expr import Expression, ExpressionError
from tunelab.limits import LIMITS
from tunelab.safeyaml import load_yaml
from tunelab.spec.lines import StudyLines, shorten
from tunelab.spec.sections import StrategyName, StudyFile, name_problem, pydantic_error
from tunelab.spec.values import (
    ENV_AXIS,
    ConstraintSpec,
    ParameterSpec,
    Scalar,
    parse_duration,
    parse_env,
    parse_parameter,
    parse_repeats,
)

__all__ = ["StudySpec", "load_study"]


class StudySpec(BaseModel):
    """A validated study. Build it with :func:`load_study` (or :meth:`from_mapping`)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str
    path: Path | None
    raw: dict[str, Any]
    workload: str
    workload_options: dict[str, Any]
    parameters: tuple[ParameterSpec, ...]
    derived: dict[str, Expression]
    constraints: tuple[ConstraintSpec, ...]
    env_sets: dict[str, dict[str, str]] | None
    repeats: int
    """Rounds of every point (``repeats: auto``: the most it may run, the budget)."""
    auto_repeats: tuple[int, int] | None = None
    """``repeats: auto``: (min, max) rounds, more rounds of the undecided points in between."""
    baseline: dict[str, Scalar] | None
    timeout_s: float
    objective_fom: str | None
    objective_direction: Literal["minimize", "maximize"] | None
    strategy: StrategyName
    seed: int
    samples: int | None
    search_options: dict[str, Any] = {}
    """The ``search`` section's other fields (sampler, racing and budget settings)."""
    noise_threshold: float
    lines: dict[tuple[Any, ...], int] = {}
    source: str | None = None
    """The file as the user named it (relative where they gave it so): errors name it so,
    whether found while the file was read or later."""

    def where(self, *path: Any) -> str:
        """``file:line`` of the deepest known part of ``path`` (for error messages)."""
        source = self.source or (str(self.path) if self.path is not None else "<study>")
        for depth in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:depth]))
            if line is not None:
                return f"{source}:{line}"
        return source

    @property
    def parameter_names(self) -> list[str]:
        """Parameter names in file order, with the ``env`` axis last when present."""
        names = [p.name for p in self.parameters]
        return [*names, ENV_AXIS] if self.env_sets is not None else names

    def identity_hash(self) -> str:
        """Hash of what makes two study files the same study (repeats, the description and
        where the runs execute — the launcher — may differ)."""
        ident = {k: v for k, v in self.raw.items()
                 if k not in ("repeats", "description", "launcher")}
        blob = json.dumps(ident, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @classmethod
    def from_mapping(
        cls, data: Any, *, source: str = "<study>", path: Path | None = None
    ) -> StudySpec:
        """Validate an already-parsed mapping (no line numbers in errors)."""
        return _build(data, StudyLines(source, {}), path)


def load_study(path: str | Path) -> StudySpec:
    """Read and validate the study file at ``path``."""
    path = Path(path)
    data, lines = load_yaml(_read_study_text(path), str(path))
    return _build(data, StudyLines(str(path), lines), path.resolve())


def _read_study_text(path: Path) -> str:
    """The study file's text, read no further than the size limit (a FIFO, a device or a
    huge file is refused before it is read)."""
    limit = LIMITS.study_file_bytes
    try:
        if stat.S_ISDIR(os.stat(path).st_mode):
            raise IsADirectoryError
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block, a device not end
            raise StudyError(f"{path}: not a regular file")
        with open(path, "rb") as f:
            blob = f.read(limit + 1)
    except FileNotFoundError:
        raise StudyError(f"{path}: study file not found") from None
    except IsADirectoryError:
        raise StudyError(f"{path}: is a directory, not a study file") from None
    except OSError as exc:
        raise StudyError(f"{path}: cannot read study file: {exc.strerror or exc}") from None
    if len(blob) > limit:
        raise StudyError(f"{path}: larger than {limit >> 20} MiB; a study file is a short "
                         "description, not data")
    try:
        return blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = blob.count(b"\n", 0, exc.start) + 1
        column = exc.start - blob.rfind(b"\n", 0, exc.start)
        raise StudyError(f"{path}:{line}: not UTF-8 text (byte 0x{blob[exc.start]:02x} at "
                         f"column {column}, offset {exc.start})") from None


# --- building the spec ----------------------------------------------------------------


def _build(data: Any, lines: StudyLines, path: Path | None) -> StudySpec:
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise lines.error((), f"a study file must be a mapping of fields, but it is {kind}")
    try:
        raw = StudyFile.model_validate(data)
    except ValidationError as exc:
        raise pydantic_error(exc, lines, data) from None

    if len(raw.parameters) > LIMITS.parameters:
        raise lines.error(("parameters",), f"more than {LIMITS.parameters} parameters")
    parameters = tuple(
        parse_parameter(name, value, lines) for name, value in raw.parameters.items()
    )
    names = [p.name for p in parameters]
    for name in names:
        if not name.isidentifier():
            raise lines.error(("parameters", name), f"parameter {name!r} must be an identifier")
        _check_not_keyword(name, "parameter", ("parameters", name), lines)
        _check_normal_form(name, "parameter", ("parameters", name), names, lines)
    env_sets = parse_env(raw.env, lines)
    if env_sets is not None and ENV_AXIS in names:
        raise lines.error(
            ("parameters", ENV_AXIS),
            "parameter 'env' clashes with the environment-set axis; rename it",
        )

    derived: dict[str, Expression] = {}
    for dname, source in raw.derived.items():
        where = ("derived", dname)
        if dname in names or dname == ENV_AXIS:
            raise lines.error(where, f"derived value {dname!r} has the name of a parameter")
        _check_not_keyword(dname, "derived value", where, lines)
        _check_normal_form(dname, "derived value", where, [*names, *raw.derived], lines)
        try:
            derived[dname] = Expression.parse(source)
        except ExpressionError as exc:
            raise lines.error(where, f"derived value {dname!r}: {exc}") from None

    constraints = []
    for i, item in enumerate(raw.constraints):
        source, why = (item, None) if isinstance(item, str) else (item.expr, item.why)
        try:
            constraints.append(ConstraintSpec(Expression.parse(source), why))
        except ExpressionError as exc:
            raise lines.error(("constraints", i),
                              f"constraint {shorten(source)!r}: {exc}") from None

    repeats, auto_repeats = parse_repeats(raw.repeats, lines)
    try:
        timeout_s = parse_duration(raw.timeout)
    except ValueError as exc:
        raise lines.error(("timeout",), f"'timeout' {exc}") from None

    search = raw.search
    needs_samples = search.strategy in ("random", "optuna") or (
        search.strategy == "racing" and search.propose == "random")
    if needs_samples and search.samples is None:
        what = "racing with propose: random" if search.strategy == "racing" else \
            f"search strategy {search.strategy!r}"
        raise lines.error(("search",), f"{what} needs 'samples: N'")
    if search.min_repeats > search.max_repeats:
        raise lines.error(("search", "min_repeats"), f"'min_repeats' ({search.min_repeats}) is "
                          f"larger than 'max_repeats' ({search.max_repeats})")
    search_options = search.model_dump(exclude={"strategy", "seed", "samples"},
                                       exclude_defaults=True)
    if search.max_wall is not None:
        try:
            search_options["max_wall"] = parse_duration(search.max_wall)
        except ValueError as exc:
            raise lines.error(("search", "max_wall"), f"'max_wall' {exc}") from None

    baseline = None
    if raw.baseline is not None:
        baseline = dict(raw.baseline)
        known = set(names) | ({ENV_AXIS} if env_sets is not None else set())
        for key, value in baseline.items():
            if isinstance(value, float) and not math.isfinite(value) or \
                    not isinstance(value, int | float | str | bool):
                raise lines.error(("baseline", key), f"baseline value of {key!r} must be a "
                                  f"number, string or boolean, got {shorten(repr(value))}")
            if key not in known:
                raise lines.error(
                    ("baseline", key),
                    f"baseline names {key!r}, which is not a parameter; "
                    f"parameters: {', '.join(sorted(known)) or 'none'}",
                )
        missing = known - set(baseline)
        if missing:
            raise lines.error(
                ("baseline",), f"baseline does not give a value for {', '.join(sorted(missing))}"
            )

    if auto_repeats is not None and baseline is None:
        raise lines.error(("repeats",), "repeats: auto adds rounds until every point's "
                          "comparison with the baseline is decided: the study needs a "
                          "'baseline:'")
    return StudySpec(
        name=raw.name or _name_from_file(path, lines),
        path=path,
        raw=data,
        workload=raw.workload.name,
        workload_options=raw.workload.options,
        parameters=parameters,
        derived=derived,
        constraints=tuple(constraints),
        env_sets=env_sets,
        repeats=repeats,
        auto_repeats=auto_repeats,
        baseline=baseline,
        timeout_s=timeout_s,
        objective_fom=raw.objective.fom if raw.objective else None,
        objective_direction=raw.objective.direction if raw.objective else None,
        strategy=raw.search.strategy,
        seed=raw.search.seed,
        samples=raw.search.samples,
        search_options=search_options,
        noise_threshold=raw.noise_threshold,
        lines=dict(lines.lines),
        source=lines.source,
    )


def _check_not_keyword(name: str, what: str, where: tuple[Any, ...],
                       lines: StudyLines) -> None:
    """Refuse a name expressions cannot read: ``True``, ``False`` and ``None`` read as those
    constants, other Python keywords (``if``, ``in``) cannot stand as a name at all."""
    if name in ("True", "False", "None"):
        raise lines.error(where, f"{what} {name!r} cannot be named so: expressions read "
                                 f"{name} as the constant, never as the {what}; rename it")
    if keyword.iskeyword(name):
        raise lines.error(where, f"{what} {name!r} cannot be named so: {name!r} is a Python "
                                 "keyword, which no expression can use as a name; rename it")


def _check_normal_form(name: str, what: str, where: tuple[Any, ...], others: list[str],
                       lines: StudyLines) -> None:
    """Refuse a name that expressions would read as another: Python reads identifiers in
    Unicode's NFKC form, so ``ﬁ`` (a ligature) and ``fi`` would be one name there."""
    normal = unicodedata.normalize("NFKC", name)
    if normal == name:
        return
    clash = next((o for o in others if o != name and
                  unicodedata.normalize("NFKC", o) == normal), None)
    advice = f"the same name as {clash!r}: rename one" if clash else f"write it {normal!r}"
    raise lines.error(where, f"{what} {name!r} reads as {normal!r} in expressions (Unicode "
                             f"NFKC form), {advice}")


def _name_from_file(path: Path | None, lines: StudyLines) -> str:
    """The study's name when the file gives none: the file's stem, if it is a valid name."""
    if path is None:
        return "study"
    problem = name_problem(path.stem)
    if problem:
        raise lines.error((), f"the study has no 'name:' and its file name {path.stem!r} "
                              f"cannot name it ({problem}); add 'name: ...' to the file")
    return path.stem
