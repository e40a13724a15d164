"""The workload contract (a command plus a parser) and the registry of workloads by name.

A workload turns a :class:`~tunelab.space.Point` into a :class:`Command` (argv list,
environment, working directory) and turns the captured output of that command into figures of
merit (FOMs, ``dict[str, float]``). The engine knows nothing else about it.

Rules for implementers:

* ``command`` must return an argv list, never a shell string. It may write files into
  ``ctx.run_dir`` (a private, empty directory per run) but nowhere else.
* ``parse`` raises :class:`~tunelab.errors.ParseError` with a one-line reason when the output
  holds no usable figure of merit; the run is then recorded as ``failed`` with that reason.
* ``rules`` are constraints the workload imposes on every study (for example pw.x's ``npool``
  must divide ``np``); they are checked exactly like a study's own constraints.
* ``declared_foms`` names the FOMs ``parse`` can return, when they are known before any run;
  a study whose objective is none of them (nor ``wall_s``) is then refused at load. No FOM
  of a workload may be named ``wall_s`` (:data:`ENGINE_FOMS`: the engine records it itself)
  or be empty (:func:`fom_name_problem`).
* ``invariants`` name FOMs that must agree across all runs of a study (for example the total
  energy of a pw.x input); a run whose value differs from the study's reference (the value
  most runs agree on, see :func:`tunelab.execute.invariants.check_invariants`) by more than
  the tolerance is recorded as ``invalid``.
* ``work`` (a classmethod, optional) declares what one run did against the machine's limits
  (:class:`Work`: FLOPs at a precision, bytes exchanged between ranks, bytes read from a
  directory, bytes moved through memory), from the study's options, the point's values and
  the run's FOMs; the reports divide each rate by the bound ``tunelab bounds`` measured on
  the machine (the fraction of bound). A workload that declares nothing gets no such column.
* Workload classes are registered through the entry-point group ``tunelab.workloads``
  (``name = "package.module:Class"``). A plugin that fails to import is skipped with a warning
  and listed with the reason by ``tunelab workloads``; asking for it by name raises that reason.

The contract sits below the engine (``tunelab.execute`` runs any workload through it); the
built-in workloads live in :mod:`tunelab.workloads`, above the engine, and are found through
the entry points like any plugin.
"""

from __future__ import annotations

import functools
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from tunelab.cluster.mpi import Placement
from tunelab.errors import ParseError, WorkloadError
from tunelab.limits import LIMITS

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ENGINE_FOMS", "ENTRY_POINT_GROUP", "WALL_FOM", "WORK_KINDS", "Command", "Needs",
           "Objective", "RunContext", "Work", "Workload", "WorkloadOptions",
           "available_workloads", "fom_name_problem", "get_workload", "last_json_object"]

Direction = Literal["minimize", "maximize"]

WALL_FOM = "wall_s"
"""The FOM the engine records of every run itself: the wall time it measured, in seconds."""
ENGINE_FOMS = frozenset({WALL_FOM})
"""Every FOM name the engine writes itself (whatever the workload parsed under that name
would be replaced): no workload's own FOM may take one."""


def fom_name_problem(name: str) -> str | None:
    """Why a workload's own figure of merit may not be called ``name``, or None."""
    if not name.strip():
        return "a FOM name must not be empty or blank"
    if name in ENGINE_FOMS:
        return ("the name is reserved: tunelab records the wall time it measures of every "
                "run under it; call this figure something else")
    return None


_FLOAT_DIGITS = 300
"""Integers of more digits are read as the float they round to (infinite past about 308)."""


def _json_int(text: str) -> int | float:
    """A JSON integer: an ``int``, or past ``_FLOAT_DIGITS`` digits the float ``float()``
    makes of it (``inf`` when too large), so that no caller's ``float(value)`` overflows and
    Python's limit on converting long digit strings never drops the line."""
    return int(text) if len(text) <= _FLOAT_DIGITS else float(text)


def last_json_object(stdout: str,
                     accept: Callable[[dict[str, Any]], bool] = lambda _: True,
                     ) -> dict[str, Any] | None:
    """The last line of ``stdout`` that is a JSON object ``accept`` takes; None if none is.

    Integers too large for a float read as ``inf`` (like ``1e400``, ``NaN`` and
    ``Infinity``, which JSON parsing already makes floats of), for the engine to refuse as a
    non-finite figure of merit. A line longer than ``LIMITS.json_line_chars`` (refused before
    it is parsed), nested too deep to read, or a taken object of more than
    ``LIMITS.json_members`` members raises :class:`~tunelab.errors.ParseError` rather than
    letting an earlier line stand in for it.
    """
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        if len(line) > LIMITS.json_line_chars:
            raise ParseError(f"JSON line: {len(line):,} characters, more than the "
                             f"{LIMITS.json_line_chars:,} tunelab reads")
        try:
            record = json.loads(line, parse_int=_json_int)
        except RecursionError:
            raise ParseError("JSON line: nested too deep to read") from None
        except ValueError:
            continue
        if isinstance(record, dict) and accept(record):
            if len(record) > LIMITS.json_members:
                raise ParseError(f"JSON line: {len(record):,} members, more than the "
                                 f"{LIMITS.json_members:,} tunelab reads (each number is a "
                                 "figure of merit)")
            return record
    return None


@dataclass(frozen=True)
class Command:
    """What to run: an argv list, extra environment variables and a working directory."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None


@dataclass(frozen=True)
class Objective:
    """The figure of merit a study optimises, and in which direction (``unit``: the FOM's
    unit when the workload declares one, :attr:`Workload.fom_units`; "" otherwise)."""

    fom: str
    direction: Direction = "minimize"
    unit: str = field(default="", compare=False)

    def better(self, a: float, b: float) -> bool:
        """True when value ``a`` is strictly better than value ``b``."""
        return a < b if self.direction == "minimize" else a > b


@dataclass(frozen=True)
class RunContext:
    """Where and how one run happens.

    ``values`` holds the point's parameters plus the study's derived values; ``env`` the
    chosen environment-variable set; ``run_dir`` is private to this run (scratch files, the
    command's working directory by default); ``study_file`` locates relative input paths;
    ``repeat`` is the repeat index (0-based), e.g. to vary a training seed between repeats.
    ``placement`` says where the processes go (this machine, a batch allocation's nodes, or
    a job script for another machine); ``cores`` are the cores of one node there.
    """

    values: Mapping[str, Any]
    env: Mapping[str, str]
    run_dir: Path
    study_dir: Path
    study_file: Path | None
    cores: int
    repeat: int = 0
    placement: Placement = field(default_factory=Placement)


WORK_KINDS = ("gemm", "memory", "link", "storage")


@dataclass(frozen=True)
class Work:
    """What one run did against one kind of machine limit (see :mod:`tunelab.bounds`).

    ``kind``: ``gemm`` (arithmetic, ``rate`` in FLOP/s), ``memory`` (bytes/s through main
    memory), ``link`` (bytes/s one rank sent to others), ``storage`` (bytes/s read).
    ``variant`` picks the bound among those measured: gemm ``precision`` (``fp32``,
    ``bf16``, ``fp16``, ``tf32``), ``device``, ``threads``; link ``stack`` (``mpi-ob1``,
    ``mpi-ucx``), ``pattern`` (``alltoall``, ``bothways``, ``oneway``), ``ranks``,
    ``message_bytes``; storage ``directory``, ``cache`` (``cold``/``warm``); memory
    ``threads``. ``amount`` is the work of one run (FLOPs or bytes; None when unknown),
    which a roofline plot needs; ``what`` names it in words ("training FLOP/s").
    """

    kind: str
    rate: float
    variant: Mapping[str, Any] = field(default_factory=dict)
    amount: float | None = None
    what: str = ""


_MAX_RANKS = 1_000_000


@dataclass(frozen=True)
class Needs:
    """What one run needs: MPI ranks (processes), nodes, threads per rank, memory per node
    (a scheduler string such as ``4G``, or None)."""

    ranks: int = 1
    nodes: int = 1
    threads: int = 1
    memory: str | None = None

    def __post_init__(self) -> None:
        for name in ("ranks", "nodes", "threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 1 <= value <= _MAX_RANKS:
                raise WorkloadError(f"a run's {name} must be a whole number from 1 to "
                                    f"{_MAX_RANKS}, got {value!r}")
        if self.nodes > self.ranks:
            raise WorkloadError(f"a run of {self.ranks} ranks cannot span {self.nodes} nodes")

    @property
    def ranks_per_node(self) -> int:
        """Ranks on each node (the first nodes take the remainder)."""
        return -(-self.ranks // self.nodes)

    @classmethod
    def from_values(cls, values: Mapping[str, Any], *, ranks: Any = None,
                    threads: Any = None, memory: str | None = None) -> Needs:
        """Needs from a point: ``ranks``/``threads`` as given, else the parameters ``np``
        (or ``ranks``) and ``omp`` (or ``threads``); ``nodes`` and ``ppn`` (ranks per node)
        fill in each other and the ranks (``ranks = nodes × ppn`` when no rank count is
        given)."""
        def whole(value: Any, name: str) -> int | None:
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int | float) or \
                    int(value) != value:
                raise WorkloadError(f"parameter {name!r} must be a whole number, got {value!r}")
            return int(value)

        n_ranks = whole(ranks if ranks is not None else values.get("np", values.get("ranks")),
                        "np")
        n_threads = whole(threads if threads is not None else
                          values.get("omp", values.get("threads")), "omp") or 1
        nodes = whole(values.get("nodes"), "nodes")
        ppn = whole(values.get("ppn"), "ppn")
        if n_ranks is None:
            n_ranks = (nodes or 1) * (ppn or 1)
        if nodes is None:
            nodes = -(-n_ranks // ppn) if ppn else 1
        return cls(n_ranks, nodes, n_threads, memory)


class WorkloadOptions(BaseModel):
    """Base class of a workload's fixed options (the study file's ``workload.options``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Workload(ABC):
    """A program to tune: builds its command from a point and parses its output.

    Subclasses set ``name``, ``description`` and ``Options`` (a :class:`WorkloadOptions`
    subclass) and implement :meth:`command` and :meth:`parse`.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    Options: ClassVar[type[WorkloadOptions]] = WorkloadOptions
    report_figures: ClassVar[tuple[str, ...]] = ()
    """Figure sets of ``tunelab report`` that fit this workload's studies, by name:
    ``"scaling"`` (throughput vs workers with the ideal line and the fitted model, efficiency,
    scale-up vs scale-out: any study with a ``workers`` axis) and ``"storage"`` (AU and read
    MB/s vs workers, for runs with input-pipeline figures). Drawn before :meth:`report_plots`."""
    reads: ClassVar[frozenset[str] | None] = None
    """The parameter names the workload's command uses, for a workload that has a fixed set
    (None: any name, e.g. argv templates). A study parameter outside them would make points
    that run the same command, so it is refused when the study is loaded."""
    fom_units: ClassVar[Mapping[str, str]] = {}
    """The unit of a figure of merit whose name does not say it (``throughput``: ``B/s``),
    by name: stored with the study and shown beside the objective by compare, best and the
    report."""
    measures_machine: ClassVar[bool] = True
    """False for a workload whose figures were measured elsewhere (``replay`` answers with
    recorded runs): the noise watch then neither flags its runs nor waits for quiet cores,
    since this machine's load changes nothing its runs report."""
    options_from_parameters: ClassVar[bool] = False
    """True for a workload whose parameters named like one of its options override that
    option for the point (:meth:`point_options`): each value of such a parameter is then
    checked against the option when the study is loaded (:meth:`check_parameter`)."""
    runs_here: bool = True
    """Set by the engine: False when the study's runs execute on a batch scheduler's nodes
    (slurm, pbs), where this machine's resources (its available memory) say nothing about
    them; :meth:`check_values` then leaves such checks to the run."""
    dry_run: bool = False
    """Set by the engine when the study is only looked at (``space``, ``run --dry-run``):
    the workload must then start no program (no probe, no preparation), only describe."""

    def __init__(self, options: WorkloadOptions, study_file: Path | None = None) -> None:
        self.options = options
        self.study_file = study_file

    def point_options(self, values: Any,
                      adjust: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """The options with the point's same-named parameters applied (``python`` stays the
        study's), then ``adjust``-ed, checked by the options model: a point the model refuses
        is one :class:`WorkloadError` line."""
        settings = self.options.model_dump()
        for key, value in dict(values).items():
            if key in settings and key != "python":
                settings[key] = value
        if adjust is not None:
            adjust(settings)
        try:
            type(self.options)(**settings)
        except ValueError as exc:
            first = str(exc).splitlines()
            raise WorkloadError(f"{self.name} workload: invalid point {dict(values)}: "
                                f"{' '.join(first[:3])}") from None
        return settings

    @property
    def objective(self) -> Objective:
        """The default objective when the study file names none."""
        return Objective(WALL_FOM, "minimize")

    def declared_foms(self) -> frozenset[str] | None:
        """The FOM names :meth:`parse` can return, when they are known before any run;
        None (the default) when they are not (e.g. every number of a JSON line). A study
        whose objective is neither one of them nor in :data:`ENGINE_FOMS` is refused."""
        return None

    def default_space(self) -> dict[str, Any]:
        """Parameters (in study-file form) used when the study file names none."""
        return {}

    def constants(self) -> dict[str, Any]:
        """Extra names usable in constraint expressions (for example ``nk`` k-points)."""
        return {}

    def rules(self) -> list[tuple[str, str]]:
        """Constraints every study of this workload obeys: ``(expression, why)`` pairs.

        A rule whose names are not all parameters of the study is skipped.
        """
        return []

    def facts(self) -> list[str]:
        """Lines ``tunelab space`` shows about what the workload worked out from its
        options (for example the k-points of a pw.x input and where the count came from)."""
        return []

    def invariants(self) -> dict[str, float]:
        """FOM name -> absolute tolerance for values that must agree across all runs."""
        return {}

    def configuration_problem(self, values: Mapping[str, Any],
                              foms: Mapping[str, float]) -> str | None:
        """Why a run that finished fine did not measure the configuration asked for — the
        program reports having used other values than ``values`` (e.g. pw.x running one
        OpenMP thread where two were asked) — or None. Such a run is ``invalid`` with this
        reason: its figures belong to another point."""
        return None

    def scratch(self, run_dir: Path) -> tuple[Path, ...]:
        """Paths inside ``run_dir`` that the engine deletes once the run is recorded: the
        program's scratch data (pw.x's outdir), which would otherwise grow the study's
        directory with every run. Nothing by default."""
        return ()

    def validate(self, names: frozenset[str]) -> None:  # noqa: B027 - optional hook
        """Raise :class:`~tunelab.errors.WorkloadError` when the options refer to a name the
        study does not define. ``names`` are the study's parameters, derived values and
        constants (``env`` when it has environment sets). Called before anything runs (also
        by ``tunelab space`` and ``--dry-run``)."""

    def check_values(self, values: Mapping[str, Any]) -> None:  # noqa: B027 - optional hook
        """Raise :class:`~tunelab.errors.WorkloadError` (with the ``option`` at fault) when a
        point's ``values`` (parameters and derived values) cannot make this workload's
        command, e.g. a format that does not fit a value's type. Called for every point
        known before the study runs (also by ``tunelab space`` and ``--dry-run``), so all
        three refuse such a point alike; it must start nothing and write nothing."""

    def check_parameter(self, name: str, value: Any) -> None:
        """Raise :class:`~tunelab.errors.WorkloadError` (why, one line) when ``value`` of the
        parameter ``name`` can never make this workload's command, whatever the other
        parameters are: bad input, refused when the study is loaded (also by ``tunelab
        space`` and ``--dry-run``) at that parameter, never a point a rule quietly excludes.
        By default, with :attr:`options_from_parameters`: a value the option ``name`` refuses
        (its type, taken strictly — ``1000.0`` is no integer — and its bounds)."""
        if not self.options_from_parameters or name == "python":
            return
        adapter = _option_adapter(type(self.options), name)
        if adapter is None:
            return
        try:
            adapter.validate_python(value)
        except ValidationError as exc:
            raise WorkloadError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None

    def check(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Raise :class:`~tunelab.errors.WorkloadError` if the workload cannot run here
        (missing executable, missing input file). Called once before a study starts."""

    def tool_versions(self) -> dict[str, list[str]]:
        """Commands whose first output line is stored in the machine snapshot."""
        return {}

    @classmethod
    def report_plots(
        cls, runs: pd.DataFrame, out_dir: Path, *, objective: Objective,
        best: str | None, baseline: str | None,
    ) -> list[Path]:
        """Workload-specific PNG plots for ``tunelab report`` (none by default).

        ``runs`` is the store's runs table (``Store.runs_frame``); ``best`` and ``baseline``
        are point keys. Return the paths written into ``out_dir``.
        """
        return []

    @classmethod
    def work(cls, options: Mapping[str, Any], values: Mapping[str, Any],
             foms: Mapping[str, float]) -> list[Work]:
        """What one run did against the machine's limits (none by default).

        ``options`` are the study's workload options with the defaults filled in,
        ``values`` the point's parameters, ``foms`` one ok run's figures of merit (without
        the ``fom.`` prefix). Return one :class:`Work` per limit the run leans on; leave out
        what cannot be told from these (a missing FOM): the reports then say nothing of it.
        """
        return []

    def needs(self, values: Mapping[str, Any]) -> Needs:
        """What a point needs from a batch allocation: ranks, nodes, threads per rank,
        memory. The default reads the parameters ``nodes``, ``ppn`` (ranks per node),
        ``np`` (or ``ranks``) and ``omp`` (or ``threads``) when the study has them."""
        return Needs.from_values(values)

    @abstractmethod
    def command(self, ctx: RunContext) -> Command:
        """Build the command for the point in ``ctx.values``."""

    @abstractmethod
    def parse(self, stdout: str, stderr: str, run_dir: Path) -> dict[str, float]:
        """Read the figures of merit from a finished run's output."""


# --- the registry ---------------------------------------------------------------------------

_log = logging.getLogger(__name__)
ENTRY_POINT_GROUP = "tunelab.workloads"


@functools.cache
@functools.cache
def _option_adapter(options: type[WorkloadOptions], name: str) -> TypeAdapter[Any] | None:
    """A strict validator of the option ``name`` of ``options`` alone, or None."""
    info = options.model_fields.get(name)
    if info is None:
        return None
    kind: Any = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
    return TypeAdapter(kind, config=ConfigDict(strict=True))


def available_workloads() -> dict[str, type[Workload] | str]:
    """Every registered workload: name -> class, or name -> reason it failed to load."""
    found: dict[str, type[Workload] | str] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            cls = ep.load()
        except Exception as exc:  # a broken plugin must not break tunelab
            _log.warning("workload %r could not be loaded: %s", ep.name, exc)
            found[ep.name] = f"failed to load {ep.value}: {exc}"
            continue
        if not (isinstance(cls, type) and issubclass(cls, Workload)):
            found[ep.name] = f"{ep.value} is not a tunelab Workload subclass"
            continue
        found[ep.name] = cls
    return dict(sorted(found.items()))


def get_workload(name: str) -> type[Workload]:
    """The workload class registered as ``name``; a clear error naming the valid ones."""
    registry = available_workloads()
    entry = registry.get(name)
    if entry is None:
        valid = ", ".join(registry) or "none"
        raise WorkloadError(f"unknown workload {name!r}; installed workloads: {valid}")
    if isinstance(entry, str):
        raise WorkloadError(f"workload {name!r} is installed but unusable: {entry}")
    return entry
