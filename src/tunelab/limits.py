"""The one set of limits tunelab enforces at its edges.

Every count, size, width and depth that comes from a study file, the command line or a run's
output is checked against a limit here *before* anything is allocated or computed for it; an
input over a limit is refused with one line naming the file, field or value, the limit, and
what to do instead. ``docs/user-guide.md`` ("What tunelab promises when things go wrong")
lists them; a test keeps that table and :data:`LIMITS` equal.

The values are far above what a real study needs (a study of 1,000,000 runs of one second
each takes eleven days) and far below what would exhaust a laptop: every refused input ends
within seconds and well under 500 MB.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TypeVar

__all__ = ["LIMITS", "Limits", "describe"]

_T = TypeVar("_T")


def _limit(value: _T, doc: str) -> _T:
    result: _T = field(default=value, metadata={"doc": doc})
    return result


@dataclass(frozen=True)
class Limits:
    """Upper bounds; each field's ``metadata["doc"]`` says what it bounds."""

    study_file_bytes: int = _limit(1 << 20, "size of a study file")
    input_file_bytes: int = _limit(
        8 << 20, "size of a file that a study or a command names and tunelab reads whole (a "
                  "pw.x input, a Leopard data manifest, an accelerator or bounds profile); it "
                  "must be a regular file (not a FIFO or a device)")
    pseudo_file_bytes: int = _limit(
        64 << 20, "size of a pw.x pseudopotential file (each run gets a copy of it; real "
                  "ones are at most a few MiB)")
    yaml_nodes: int = _limit(
        100_000, "YAML nodes of a study file, counting every alias (*name) expansion")
    yaml_aliases: int = _limit(
        1_000, "alias references (*name) in a study file")
    yaml_depth: int = _limit(
        64, "nesting depth of mappings and sequences in a study file")
    name_chars: int = _limit(
        100, "characters of a study name (it names the default study directory)")
    parameters: int = _limit(
        100, "parameters of a study (axes of its space)")
    parameter_values: int = _limit(
        100_000, "values of one parameter (type: int ranges included)")
    enumeration_steps: int = _limit(
        200_000, "steps a grid search (and tunelab space) may take to enumerate a space: one "
                 "per value tried at any depth, so a grid of N combinations takes N to 2N "
                 "unless constraints prune early; a larger space must be sampled (search: "
                 "{strategy: random or optuna, samples: N})")
    samples: int = _limit(
        10_000, "samples of a random or optuna search")
    sample_draws: int = _limit(
        200_000, "random draws spent looking for the valid points of a space too large "
                   "to enumerate")
    repeats: int = _limit(
        10_000, "repeats per point (the study file's repeats and --repeats), and times a "
                "disturbed run is run again (--rerun-disturbed)")
    runs: int = _limit(
        1_000_000, "runs of one study (points x repeats)")
    template_width: int = _limit(
        1_000, "width or precision in an argv placeholder's format spec ({x:>8})")
    expression_chars: int = _limit(
        2_000, "characters of one constraint or derived-value expression")
    expression_nodes: int = _limit(
        500, "syntax nodes (names, numbers, operators, calls) of one expression")
    expression_depth: int = _limit(
        50, "nesting depth of one expression")
    integer_bits: int = _limit(
        4_096, "bits of an integer an expression computes (about 1,233 decimal digits)")
    string_chars: int = _limit(
        10_000, "characters of a string, or items of a tuple, an expression computes")
    duration_s: int = _limit(
        365 * 86400, "seconds of a duration: a study's timeout and max_wall, a launcher's "
                     "walltime, a preparation step's timeout")
    output_parse_bytes: int = _limit(
        16 << 20, "bytes of a run's stdout, and of its stderr, read for parsing (the first "
                  "and the last half when the output is larger)")
    fom_magnitude: float = _limit(
        1e50, "magnitude of a figure of merit (and, unless it is 0, the inverse of the "
              "smallest one): the statistics square and divide them, so a run whose figure "
              "is outside fails; print it in other units")
    json_line_chars: int = _limit(
        1_000_000, "characters of a line of a run's stdout read as a JSON object (json_line, "
                   "and the result lines of tunelab's own benchmarks)")
    json_members: int = _limit(
        1_000, "members of the JSON object line a run's figures of merit are read from (each "
               "numeric member is one)")
    regex_size: int = _limit(
        100_000, "size of a study's figure-of-merit regexes together, each counted repeat "
                 "expanded ((ab){1000} counts 2,000): the regex engine compiles a repeat by "
                 "copying it")
    regex_timeout_s: float = _limit(
        2.0, "CPU seconds all figure-of-merit regexes of one run may spend searching its "
             "output")


LIMITS = Limits()
"""The limits in force."""


def describe() -> list[tuple[str, str, str]]:
    """(name, value as the docs show it, what it bounds) for every limit, in order."""
    rows = []
    for f in fields(Limits):
        value = getattr(LIMITS, f.name)
        if f.name.endswith("_bytes"):
            shown = f"{value >> 20} MiB" if value >= 1 << 20 else f"{value:,} bytes"
        else:
            shown = f"{value:,}" if isinstance(value, int) else f"{value:g}"
        rows.append((f.name, shown, f.metadata["doc"]))
    return rows
