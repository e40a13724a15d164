"""Fuzzing the command line with generated study files (Hypothesis, fixed seed).

Whatever the file — plausible with hostile parts, or broken YAML — tunelab must end with
exit 0, 1 or 2; exit 2 is exactly one line ``tunelab: error: …`` and never a traceback; no
exception escapes; each command stays under 5 CPU seconds and the process under 500 MB. A
study small enough is also really run (harmless programs only, see ``strategies.py``) and its
store checked. The examples are derandomized: CI runs the same ones every time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hardening.conftest import CPU_LIMIT_S, RSS_LIMIT_MB, store_rows
from tests.hardening.strategies import broken_yaml, dump, studies

FUZZ = settings(max_examples=120, derandomize=True, database=None, deadline=None,
                suppress_health_check=list(HealthCheck), print_blob=True)
MAX_FUZZED_RUNS = 12


def check(answer: dict[str, Any]) -> None:
    """The promises every answer keeps, whatever the input."""
    assert answer["escaped"] is None, answer["escaped"]
    assert answer["rc"] in (0, 1, 2), (answer["rc"], answer["stderr"][-2000:])
    for stream in ("stdout", "stderr"):
        assert "Traceback" not in answer[stream], answer[stream][-2000:]
    if answer["rc"] == 2:
        lines = answer["stderr"].strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tunelab: error: "), lines
    assert answer["cpu_s"] < CPU_LIMIT_S, answer
    assert answer["maxrss_mb"] < RSS_LIMIT_MB, answer


@FUZZ
@given(study=studies(), command=st.sampled_from(["space", "dry-run", "run"]))
def test_generated_studies_end_cleanly(cli, study, command):
    files = {"s.yaml": dump(study)}
    if command == "dry-run":
        check(cli.run(files, ["run", "--dry-run", "s.yaml"]))
        return
    space = cli.run(files, ["space", "s.yaml", "--format", "json"])
    check(space)
    if command == "space" or space["rc"] != 0:
        return
    plan = json.loads(space["stdout"])["plan"]
    if plan["runs"] > MAX_FUZZED_RUNS or plan["adaptive"]:
        return
    answer = cli.run({}, ["run", "s.yaml", "--dir", "d"], cwd=space["dir"], timeout_s=300)
    check(answer)
    db = Path(space["dir"], "d", "tunelab.db")
    if answer["rc"] in (0, 1):
        rows = store_rows(db)
        assert len(rows) == plan["runs"]
        assert len({(key, repeat) for key, repeat, _, _ in rows}) == len(rows)


@FUZZ
@given(text=broken_yaml(), command=st.sampled_from(["space", "dry-run"]))
def test_broken_yaml_ends_cleanly(cli, text, command):
    argv = ["space", "s.yaml"] if command == "space" else ["run", "--dry-run", "s.yaml"]
    check(cli.run({"s.yaml": text}, argv))
