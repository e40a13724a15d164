"""The generic ``command`` workload: any program, tuned through its argv.

Options::

    argv: [python3, bench.py, --threads, "{threads}"]   # {name} placeholders: parameters,
                                                        # derived values, env (the set name)
    foms:                                               # name -> regex on stdout (+ stderr);
      gflops: 'GFLOP/s: (?P<value>[0-9.eE+-]+)'         # group 'value' or the first group
    json_line: true        # also read the last JSON object line of stdout as FOMs
    env: {OMP_PROC_BIND: close}                         # fixed extra environment
    cwd: null              # working directory (default: the run's own directory)

The wall time the engine measured is always recorded as the FOM ``wall_s``.
"""

from __future__ import annotations

import json
import re
import shutil
import string
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from tunelab.errors import ParseError, WorkloadError
from tunelab.workloads.base import Command, RunContext, Workload, WorkloadOptions

__all__ = ["CommandOptions", "CommandWorkload", "read_json_foms"]


class CommandOptions(WorkloadOptions):
    """Options of the ``command`` workload."""

    argv: list[str] = Field(min_length=1)
    foms: dict[str, str] = Field(default_factory=dict)
    json_line: bool = False
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None

    @field_validator("argv")
    @classmethod
    def _templates_parse(cls, argv: list[str]) -> list[str]:
        for index, arg in enumerate(argv):
            try:
                list(string.Formatter().parse(arg))
            except ValueError as exc:
                raise ValueError(f"argv[{index}] {arg!r} is not a valid template ({exc}); a "
                                 "literal brace is written {{ or }}") from None
        return argv

    @field_validator("foms")
    @classmethod
    def _regexes_compile(cls, foms: dict[str, str]) -> dict[str, str]:
        for name, pattern in foms.items():
            try:
                compiled = re.compile(pattern, re.MULTILINE)
            except re.error as exc:
                raise ValueError(f"FOM {name!r}: invalid regular expression: {exc}") from None
            if "value" not in compiled.groupindex and compiled.groups == 0:
                raise ValueError(f"FOM {name!r}: the regex needs a group, e.g. (?P<value>...)")
        return foms


def read_json_foms(stdout: str) -> dict[str, float]:
    """Numbers of the last line of ``stdout`` that is a JSON object; {} if none."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")):
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict):
            return {k: float(v) for k, v in data.items()
                    if isinstance(v, int | float) and not isinstance(v, bool)}
    return {}


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

    def check(self) -> None:
        exe = self.options.argv[0]
        if "{" not in exe and shutil.which(exe) is None and not Path(exe).is_file():
            raise WorkloadError(f"workload 'command': executable {exe!r} not found on PATH")

    def command(self, ctx: RunContext) -> Command:
        values: dict[str, Any] = dict(ctx.values)
        try:
            argv = tuple(arg.format_map(values) for arg in self.options.argv)
        except KeyError as exc:
            raise WorkloadError(
                f"workload 'command': argv placeholder {{{exc.args[0]}}} is not a parameter "
                f"or derived value; known: {', '.join(sorted(values))}"
            ) from None
        cwd = Path(self.options.cwd) if self.options.cwd else ctx.run_dir
        if self.options.cwd and not cwd.is_absolute() and ctx.study_file is not None:
            cwd = ctx.study_file.parent / cwd
        return Command(argv=argv, env=dict(self.options.env), cwd=cwd)

    def parse(self, stdout: str, stderr: str, run_dir: Path) -> dict[str, float]:
        foms: dict[str, float] = read_json_foms(stdout) if self.options.json_line else {}
        if self.options.json_line and not foms and not self.options.foms:
            raise ParseError("no JSON line of figures of merit in stdout")
        text = stdout + "\n" + stderr
        for name, pattern in self.options.foms.items():
            # keep the last match: programs often print progress before the result
            matches = list(re.finditer(pattern, text, re.MULTILINE))
            match = matches[-1] if matches else None
            if match is None:
                raise ParseError(f"FOM {name!r}: no match for {pattern!r} in the output")
            raw = match.group("value") if "value" in match.re.groupindex else match.group(1)
            try:
                foms[name] = float(raw)
            except (TypeError, ValueError):
                raise ParseError(f"FOM {name!r}: matched {raw!r}, which is not a number") \
                    from None
        return foms
