"""``tunelab init WORKLOAD``: a commented example study for any workload."""

from __future__ import annotations

import yaml

from tunelab.workloads.base import Workload

__all__ = ["example_study"]

_COMMAND_EXAMPLE = """\
# A tunelab study of the generic `command` workload. Edit, then:
#   tunelab space my-command-study.yaml   # valid points, and what each constraint excluded
#   tunelab run my-command-study.yaml     # run it (resumable); then tunelab report runs/<name>
name: my-command-study
workload:
  name: command
  options:
    # argv list (never a shell string); {name} is replaced by parameters and derived values
    argv:
      - python3
      - -c
      - |
        import sys, time, zlib, random
        level = int(sys.argv[1])
        data = bytes(random.Random(0).choices(b"ACGT", k=1_000_000))
        start = time.perf_counter()
        packed = zlib.compress(data, level)
        print("seconds=%.6f ratio=%.4f" % (time.perf_counter() - start, len(data) / len(packed)))
      - "{level}"
    foms:                       # figures of merit: a regex with a group named 'value'
      seconds: 'seconds=(?P<value>[0-9.eE+-]+)'
      ratio: 'ratio=(?P<value>[0-9.]+)'
parameters:
  level: {type: int, min: 1, max: 9, step: 1}
constraints:
  - level % 2 == 1              # expressions over parameters; see docs/study-files.md
repeats: 3
baseline: {level: 1}
timeout: 60                     # seconds per run
objective: {fom: seconds, direction: minimize}
"""


def example_study(cls: type[Workload]) -> str:
    """The text of a commented example study file for workload class ``cls``."""
    custom = getattr(cls, "example_study", None)
    if callable(custom):
        return str(custom())
    if cls.name == "command":
        return _COMMAND_EXAMPLE
    body = {
        "name": f"my-{cls.name}-study",
        "workload": {"name": cls.name, "options": {}},
        "repeats": 3,
        "timeout": 600,
    }
    return (
        f"# A tunelab study of the {cls.name!r} workload: {cls.description}\n"
        "# Fill in the workload's options (see docs/workloads/), parameters and constraints\n"
        "# (see docs/study-files.md); without parameters the workload's default space is used.\n"
        + yaml.safe_dump(body, sort_keys=False)
    )
