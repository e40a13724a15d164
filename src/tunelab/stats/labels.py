"""Words for readers: the verdict as ``faster`` / ``slower`` where the figure of merit is a
time or a rate (:func:`verdict_label`), and failure counts as text (:func:`failures_text`)."""

from __future__ import annotations

import re

from tunelab.stats.results import Verdict

_TIME_LIKE = re.compile(r"(^|[._])(wall|time|seconds|latency|duration)|_(s|ms|us|ns|sec)$")
_RATE_LIKE = re.compile(r"throughput|bandwidth|per_s(ec)?$|_per_second|(^|_)rate$|flops|/s$|bps$")


def verdict_label(verdict: Verdict | str, fom: str, direction: str) -> str:
    """The word a reader expects: ``faster``/``slower`` for a time minimised or a rate
    maximised (``wall_s``, ``bandwidth_gib_s``), ``better``/``worse`` otherwise."""
    verdict = Verdict(verdict)
    if verdict not in (Verdict.BETTER, Verdict.WORSE):
        return verdict.value
    name = fom.removeprefix("fom.").lower()
    timed = (direction == "minimize" and _TIME_LIKE.search(name) is not None) or (
        direction == "maximize" and _RATE_LIKE.search(name) is not None
    )
    if not timed:
        return verdict.value
    return "faster" if verdict is Verdict.BETTER else "slower"


def failures_text(failed: dict[str, int]) -> str:
    """Counts by status as ``"2 failed, 1 timeout"`` (``"no runs"`` when empty)."""
    if not failed:
        return "no runs"
    return ", ".join(f"{count} {status}" for status, count in sorted(failed.items()))
