"""The generic ``command`` workload: any program, tuned through its argv.

Options::

    argv: [python3, bench.py, --threads, "{threads}"]   # {name} placeholders: parameters,
                                                        # derived values, env (the set name)
    foms:                                               # name -> regex on stdout (+ stderr);
      gflops: 'GFLOP/s: (?P<value>[0-9.eE+-]+)'         # group 'value' or the first group
    json_line: true        # also read the last JSON object line of stdout as FOMs
    env: {OMP_PROC_BIND: close}                         # fixed extra environment
    cwd: null              # working directory (default: the run's own directory)
    work:                  # what one run does, for the fraction of the machine's bounds
      flops: "2 * n**3 * reps"       # FLOPs (expressions over parameters and FOMs)
      bytes_moved: "12 * n**2 * reps"  # bytes through main memory
      seconds: kernel_s              # the time the work takes (default: wall_s)
      precision: fp32                # of the FLOPs: fp32, bf16, fp16, tf32

The wall time the engine measured is always recorded as the FOM ``wall_s``.

Everything is checked before the first run: placeholders are plain names of the study
(``{x}``, ``{x:>8}``; no ``{x.attr}``, ``{x[0]}`` or ``{x:{w}}``) with a format width and
precision within ``LIMITS.template_width``; environment names hold no ``=`` or NUL; the working
directory exists; FOM regexes are sized before they are compiled (``LIMITS.regex_size``, see
:mod:`tunelab.workloads.regexsize`). FOM regexes run with the ``regex`` engine under a CPU-time
budget (``LIMITS.regex_timeout_s`` for all of a run's regexes together), so a pattern that
backtracks catastrophically fails the run instead of hanging the study.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import string
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import regex
from pydantic import BaseModel, ConfigDict, Field, field_validator

from tunelab.errors import ParseError, WorkloadError
from tunelab.expr import Expression, ExpressionError
from tunelab.limits import LIMITS
from tunelab.workload import (
    WALL_FOM,
    Command,
    RunContext,
    Work,
    Workload,
    WorkloadOptions,
    fom_name_problem,
    last_json_object,
)
from tunelab.workloads.regexsize import expanded_size

__all__ = ["CommandOptions", "CommandWork", "CommandWorkload", "read_json_foms"]

_AMOUNTS = {"flops": "gemm", "bytes_moved": "memory", "bytes_exchanged": "link",
            "bytes_read": "storage"}
_WORDS = {"gemm": "FLOP/s", "memory": "memory bytes/s", "link": "bytes/s sent to other ranks",
          "storage": "bytes/s read"}


class CommandWork(BaseModel):
    """What one run of a ``command`` workload does (``workload.options.work``): amounts as
    expressions over the point's parameters and the run's FOMs, the seconds they take
    (default the FOM ``wall_s``), and what picks the bound (precision, threads; stack,
    pattern, ranks, message size; directory, cache)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    flops: str | None = None
    bytes_moved: str | None = None
    bytes_exchanged: str | None = None
    bytes_read: str | None = None
    seconds: str = WALL_FOM
    precision: Literal["fp32", "bf16", "fp16", "tf32"] = "fp32"
    threads: str | None = None
    stack: str | None = None
    pattern: Literal["alltoall", "bothways", "oneway"] = "alltoall"
    ranks: str | None = None
    message_bytes: str | None = None
    directory: str | None = None
    cache: Literal["cold", "warm"] = "cold"

    @field_validator("flops", "bytes_moved", "bytes_exchanged", "bytes_read", "seconds",
                     "threads", "ranks", "message_bytes")
    @classmethod
    def _expression(cls, source: str | None) -> str | None:
        if source is not None:
            try:
                Expression.parse(str(source))
            except ExpressionError as exc:
                raise ValueError(str(exc)) from None
        return source


class CommandOptions(WorkloadOptions):
    """Options of the ``command`` workload."""

    argv: list[str] = Field(min_length=1)
    foms: dict[str, str] = Field(default_factory=dict)
    json_line: bool = False
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    work: CommandWork | None = None

    @field_validator("argv")
    @classmethod
    def _templates_parse(cls, argv: list[str]) -> list[str]:
        for index, arg in enumerate(argv):
            problem = _template_problem(arg)
            if problem:
                raise ValueError(f"argv[{index}] {arg!r}: {problem}")
        return argv

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not name or "=" in name or "\x00" in name:
                raise ValueError(f"{name!r} is not an environment variable name (no '=' or "
                                 "NUL, not empty)")
            if "\x00" in value:
                raise ValueError(f"the value of {name} holds a NUL character")
        return env

    @field_validator("foms")
    @classmethod
    def _regexes_compile(cls, foms: dict[str, str]) -> dict[str, str]:
        budget = LIMITS.regex_size
        for name, pattern in foms.items():
            problem = fom_name_problem(name)
            if problem:
                raise ValueError(f"FOM {name!r}: {problem}")
            size = expanded_size(pattern, budget)
            if size > budget:
                raise ValueError(
                    f"FOM {name!r}: the regex {_shown(pattern)!r} grows larger than "
                    f"{LIMITS.regex_size:,} once its counted repeats ({{n}}) are expanded "
                    "(with the study's other FOM regexes); repeat less, or use * or +")
            budget -= size
            try:
                compiled = regex.compile(pattern, regex.MULTILINE)
            except (regex.error, OverflowError, RecursionError) as exc:
                raise ValueError(f"FOM {name!r}: invalid regular expression: {exc}") from None
            if "value" not in compiled.groupindex and compiled.groups == 0:
                raise ValueError(f"FOM {name!r}: the regex needs a group, e.g. (?P<value>...)")
        return foms


def _shown(pattern: str, width: int = 60) -> str:
    return pattern if len(pattern) <= width else pattern[:width - 1] + "…"


_SPEC = re.compile(r"(?:.?[<>=^])?[-+ ]?z?#?0?(?P<width>\d*)[,_]?(?:\.(?P<precision>\d+))?"
                   r"[a-zA-Z%]?")


def _template_problem(arg: str) -> str | None:
    """Why ``arg`` is not a valid argv template, or None."""
    try:
        parts = list(string.Formatter().parse(arg))
    except ValueError as exc:
        return f"not a valid template ({exc}); a literal brace is written {{{{ or }}}}"
    for _, field_name, spec, conversion in parts:
        if field_name is None:
            continue
        if not field_name.isidentifier():
            return (f"placeholder {{{field_name}}} must be a plain name such as {{np}} (no "
                    "attributes, indexes or positional fields)")
        if conversion not in (None, "r", "s", "a"):
            return f"placeholder {{{field_name}!{conversion}}}: unknown conversion"
        if spec and ("{" in spec or "}" in spec):
            return f"placeholder {{{field_name}}}: nested placeholders in a format spec"
        match = _SPEC.fullmatch(spec or "")
        if match is None:
            return f"placeholder {{{field_name}:{spec}}}: invalid format spec {spec!r}"
        for part in ("width", "precision"):
            digits = match.group(part)
            if digits and (len(digits) > 6 or int(digits) > LIMITS.template_width):
                return (f"placeholder {{{field_name}:{spec}}}: {part} larger than "
                        f"{LIMITS.template_width:,}")
    return None


def read_json_foms(stdout: str) -> dict[str, float]:
    """Numbers of the last line of ``stdout`` that is a JSON object; {} if none."""
    data = last_json_object(stdout)
    if data is None:
        return {}
    return {k: float(v) for k, v in data.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


class CommandWorkload(Workload):
    """Any program: an argv template with ``{param}`` placeholders and FOM regexes."""

    name = "command"
    description = "any program: argv template with {param} placeholders, FOMs by regex or JSON"
    Options = CommandOptions
    options: CommandOptions

    def placeholders(self) -> set[str]:
        """Every ``{name}`` used in the argv template."""
        found = set()
        for arg in self.options.argv:
            for _, field_name, _, _ in string.Formatter().parse(arg):
                if field_name is not None:
                    found.add(field_name)
        return found

    def declared_foms(self) -> frozenset[str] | None:
        """The names of the FOM regexes; None with ``json_line`` (its names are the JSON
        line's, known only once a run printed it)."""
        return None if self.options.json_line else frozenset(self.options.foms)

    def validate(self, names: frozenset[str]) -> None:
        unknown = sorted(self.placeholders() - names)
        if unknown:
            raise WorkloadError(
                f"argv placeholder {{{unknown[0]}}} is not a parameter or derived value; "
                f"known: {', '.join(sorted(names)) or 'none'} (a literal brace is written "
                "{{ or }})")

    def _cwd(self, run_dir: Path) -> Path:
        if not self.options.cwd:
            return run_dir
        cwd = Path(self.options.cwd)
        if not cwd.is_absolute() and self.study_file is not None:
            cwd = self.study_file.parent / cwd
        return cwd

    def check(self) -> None:
        exe = self.options.argv[0]
        try:
            if "{" not in exe and shutil.which(exe) is None and not Path(exe).is_file():
                raise WorkloadError(f"workload 'command': executable {_shown(exe, 200)!r} not "
                                    "found on PATH")
        except OSError as exc:  # a name too long, a directory on the way that is closed
            raise WorkloadError(f"workload 'command': executable {_shown(exe, 200)!r} cannot "
                                f"be reached: {exc.strerror or exc}") from None
        if self.options.cwd:
            cwd = self._cwd(Path("."))
            if not os.path.isdir(cwd):  # False, never an error, for a name too long
                raise WorkloadError(f"workload 'command': working directory (cwd) {cwd} "
                                    "does not exist or is not a directory")

    def check_values(self, values: Mapping[str, Any]) -> None:
        """Refuse values the argv templates cannot format (``{c:>5d}`` of a float)."""
        self._argv(values)

    def command(self, ctx: RunContext) -> Command:
        try:
            argv = self._argv(ctx.values)
        except WorkloadError as exc:
            raise WorkloadError(f"workload 'command': {exc}", exc.option) from None
        return Command(argv=tuple(argv), env=dict(self.options.env), cwd=self._cwd(ctx.run_dir))

    def _argv(self, values: Mapping[str, Any]) -> list[str]:
        """The argv templates filled with ``values``; WorkloadError naming the argument and
        the values it cannot format."""
        scope: dict[str, Any] = dict(values)
        argv = []
        for index, arg in enumerate(self.options.argv):
            try:
                argv.append(arg.format_map(scope))
            except KeyError as exc:
                raise WorkloadError(
                    f"argv placeholder {{{exc.args[0]}}} is not a parameter or derived value; "
                    f"known: {', '.join(sorted(scope))}", ("argv", index)) from None
            except (ValueError, TypeError, OverflowError) as exc:
                used = sorted({name for _, name, _, _ in string.Formatter().parse(arg)
                               if name in scope})
                shown = " ".join(f"{name}={scope[name]!r}" for name in used)
                raise WorkloadError(f"argv[{index}] {arg!r} cannot format {shown}: {exc}",
                                    ("argv", index)) from None
        return argv

    @classmethod
    def work(cls, options: Mapping[str, Any], values: Mapping[str, Any],
             foms: Mapping[str, float]) -> list[Work]:
        """The amounts of ``options.work`` over its ``seconds``, one :class:`Work` each; an
        expression that names something the run lacks leaves its item out."""
        raw = options.get("work")
        if not raw:
            return []
        spec = CommandWork.model_validate(raw)
        names = {**values, **foms}

        def number(source: str | None) -> float | None:
            if source is None:
                return None
            try:
                value = Expression.parse(source).evaluate(names)
            except ExpressionError:
                return None
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            return float(value) if ok and math.isfinite(value) else None

        seconds = number(spec.seconds)
        if not seconds or seconds <= 0:
            return []
        out = []
        for field_name, kind in _AMOUNTS.items():
            amount = number(getattr(spec, field_name))
            if amount is None or amount < 0:
                continue
            variant: dict[str, Any] = {}
            if kind == "gemm":
                variant["precision"] = spec.precision
            if kind in ("gemm", "memory") and (threads := number(spec.threads)):
                variant["threads"] = int(threads)
            if kind == "link":
                ranks, size = number(spec.ranks), number(spec.message_bytes)
                variant.update(stack=spec.stack, pattern=spec.pattern,
                               **({"ranks": int(ranks)} if ranks else {}),
                               **({"message_bytes": size} if size else {}))
            if kind == "storage":
                variant.update(cache=spec.cache,
                               **({"directory": spec.directory} if spec.directory else {}))
            out.append(Work(kind, amount / seconds, variant, amount, _WORDS[kind]))
        return out

    def parse(self, stdout: str, stderr: str, run_dir: Path) -> dict[str, float]:
        foms: dict[str, float] = read_json_foms(stdout) if self.options.json_line else {}
        if self.options.json_line and not foms and not self.options.foms:
            raise ParseError("no JSON line of figures of merit in stdout")
        text = stdout + "\n" + stderr
        deadline = time.process_time() + LIMITS.regex_timeout_s
        for name, pattern in self.options.foms.items():
            match = _last_match(name, pattern, text, deadline)
            if match is None:
                raise ParseError(f"FOM {name!r}: no match for {pattern!r} in the output")
            raw = match.group("value") if "value" in match.re.groupindex else match.group(1)
            try:
                foms[name] = float(raw)
            except (TypeError, ValueError):
                raise ParseError(f"FOM {name!r}: matched {raw!r}, which is not a number") \
                    from None
        return foms


_WINDOW = 1 << 16
"""Characters at the end of the output searched first for a FOM regex's last match."""


def _last_match(name: str, pattern: str, text: str, deadline: float) -> Any:
    """The last match of ``pattern`` in ``text`` (programs often print progress before the
    result), or None; ParseError when the CPU-time ``deadline`` passes first.

    It is the last match a scan from the start would find, without walking every match:
    the scan starts at a line start ``_WINDOW`` characters before the end, then four times
    as far back, until it finds a match or starts at the start. The whole text stays in
    view, so anchors (``^``, ``\\A``) and lookbehinds see what a scan from the start sees. A
    scan from a line start finds what one from the start finds unless a match that crosses
    that line break overlaps the scan's first match (a regex that can match across lines
    and inside its own matches); ``\\G`` and reverse regexes are scanned from the start.
    """
    compiled = regex.compile(pattern, regex.MULTILINE)
    whole = "\\G" in pattern or bool(compiled.flags & regex.REVERSE)
    size = _WINDOW
    try:
        while True:
            start = 0 if whole or size >= len(text) else text.rfind("\n", 0,
                                                                     len(text) - size) + 1
            last = None
            for last in compiled.finditer(  # noqa: B007
                    text, start, timeout=max(deadline - time.process_time(), 0.001)):
                pass
            if last is not None or start == 0:
                return last
            size *= 4
    except TimeoutError:
        raise ParseError(f"FOM {name!r}: the regex {pattern!r} took more than "
                         f"{LIMITS.regex_timeout_s:g} s of CPU on the output (it backtracks too "
                         "much, or matches very often far from the output's end; make it more "
                         "specific)") from None
