"""The ``command`` workload's argv templates: a value a format does not fit is one
WorkloadError naming the argument, its option path and the values."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunelab.errors import WorkloadError
from tunelab.workload import RunContext
from tunelab.workloads.command import CommandOptions, CommandWorkload


def workload(*argv: str) -> CommandWorkload:
    return CommandWorkload(CommandOptions(argv=["echo", *argv]))


@pytest.mark.parametrize(("template", "values", "fragment"), [
    ("{c:>5d}", {"c": 0.5}, "argv[1] '{c:>5d}' cannot format c=0.5: Unknown format code 'd'"),
    ("--n={n:d}", {"n": "fast"}, "cannot format n='fast'"),
    ("{x:c}", {"x": 2**40}, "cannot format x=1099511627776"),  # OverflowError
])
def test_a_value_the_template_cannot_format_is_refused_with_its_option(template, values,
                                                                       fragment):
    with pytest.raises(WorkloadError) as exc:
        workload(template).check_values(values)
    assert fragment in str(exc.value) and exc.value.option == ("argv", 1)


def context(values: dict[str, object], tmp_path: Path) -> RunContext:
    return RunContext(values=values, env={}, run_dir=tmp_path, study_dir=tmp_path,
                      study_file=None, cores=1)


def test_values_that_fit_pass_and_make_the_command(tmp_path):
    w = workload("{c:>5.1f}", "{n}")
    w.check_values({"c": 0.5, "n": "fast"})
    assert w.command(context({"c": 0.5, "n": "fast"}, tmp_path)).argv == ("echo", "  0.5",
                                                                          "fast")


def test_a_run_whose_values_do_not_fit_fails_with_the_same_reason(tmp_path):
    with pytest.raises(WorkloadError, match="workload 'command': argv.1. '{c:>5d}' cannot "
                                            "format c=0.5"):
        workload("{c:>5d}").command(context({"c": 0.5}, tmp_path))
