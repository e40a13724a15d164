"""How the command workload finds its figures of merit: the last match of each FOM regex,
found from the output's end, is the one a scan from the start finds."""

from __future__ import annotations

import random
import time

import pytest
import regex

from tunelab.workloads import command
from tunelab.workloads.command import _last_match

PATTERNS = [
    r"v=(?P<value>\S+)",
    r"^v=(\d+)$",
    r"(\d+)",
    r"(\d*)",
    r"(?<=x)(\d)",
    r"(?<!\n)(\d)",
    r"\A(\d+)",
    r"(\d+)\Z",
    r"(\d)$",
    r"\s(\d)",
    r"Total:\s+(\d+)",
    r"\bx(\d+)\b",
]


def _forward(pattern: str, text: str) -> regex.Match[str] | None:
    last = None
    for last in regex.finditer(pattern, text, regex.MULTILINE):  # noqa: B007
        pass
    return last


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_last_match_is_the_one_a_scan_from_the_start_finds(monkeypatch, pattern):
    monkeypatch.setattr(command, "_WINDOW", 3)  # many windows on short texts
    rng = random.Random(pattern)
    pieces = ["v=", "1", "23", "x", " ", "\n", "\n\n", "Total:", "y", "\t"]
    for _ in range(1500):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 25)))
        want = _forward(pattern, text)
        got = _last_match("v", pattern, text, time.process_time() + 60)
        if want is None:
            assert got is None, (pattern, text)
        else:
            assert got is not None, (pattern, text)
            assert (got.span(), got.groups()) == (want.span(), want.groups()), (pattern, text)


def test_a_g_anchored_regex_is_scanned_from_the_start(monkeypatch):
    monkeypatch.setattr(command, "_WINDOW", 2)
    match = _last_match("v", r"\Gv=(\d)", "v=1v=2\nv=3", time.process_time() + 60)
    assert match is not None and match.group(1) == "2"


def test_the_last_match_is_found_without_scanning_what_lies_far_before_it():
    # A scan from the start backtracks without end on the first line (2**2500 ways to
    # split it) and would spend the CPU budget there; the match at the end is found.
    text = "a" * 5000 + "!\n" + "v=7\n" * 20_000
    match = _last_match("v", r"^(?:(a|aa)+$|v=)(?P<value>\d+)", text,
                        time.process_time() + 2.0)
    assert match is not None and match.group("value") == "7"
    assert match.end() == len(text) - 1
