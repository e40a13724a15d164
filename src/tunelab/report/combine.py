"""The seed's follow-up study: combine the environment options that were really better.

The competition team tried each UCX option alone against a baseline, then combined "all
that helped". :func:`combine_better_options` does that step honestly: only env sets whose
verdict against the baseline is *better* (confidence interval beyond 1 and the noise
threshold) — all other parameters held at the baseline's values — go into the combination.
The result is a new study file: the baseline, each winner alone (re-measured in the same
study) and their combination.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from tunelab.errors import TunelabError
from tunelab.report.results import StudyResults
from tunelab.spec import ENV_AXIS
from tunelab.stats import Verdict

__all__ = ["Combination", "combine_better_options", "left_out_text"]

COMBINED = "combined"


@dataclass(frozen=True)
class Combination:
    """Which env sets went into the combination, which did not and why, and the study."""

    winners: tuple[str, ...]
    left_out: tuple[tuple[str, str], ...]  # (env set, verdict)
    env: dict[str, str]
    study_yaml: str


def combine_better_options(results: StudyResults) -> Combination:
    """Build the follow-up study of ``results`` (a study with ``env`` sets and a baseline)."""
    spec = dict(results.spec)
    env_sets: dict[str, dict[str, Any]] = {k: dict(v or {}) for k, v in
                                           (spec.get("env") or {}).items()}
    if not env_sets or results.baseline is None:
        raise TunelabError(f"study {results.name!r} has no env sets or no baseline: "
                           "nothing to combine")
    baseline = json.loads(results.baseline)
    base_set = str(baseline[ENV_AXIS])
    others = {k: v for k, v in baseline.items() if k != ENV_AXIS}
    winners: list[str] = []
    left_out: list[tuple[str, str]] = []
    for pc in results.comparisons:
        params = dict(pc.summary.params)
        env_name = str(params.pop(ENV_AXIS, ""))
        if pc.is_baseline or params != others:
            continue  # only options tried alone, everything else as in the baseline
        if pc.comparison.verdict is Verdict.BETTER:
            winners.append(env_name)
        else:
            left_out.append((env_name, str(pc.comparison.verdict)))
    if not winners:
        detail = left_out_text(left_out) or "none tried"
        raise TunelabError(f"no env set of study {results.name!r} was better than the "
                           f"baseline {base_set!r} ({detail}); nothing to combine")
    merged = {k: str(v) for k, v in env_sets[base_set].items()}
    origin: dict[str, str] = {}
    for name in winners:
        for var, value in env_sets[name].items():
            if var in origin and merged[var] != str(value):
                raise TunelabError(
                    f"env sets {origin[var]!r} and {name!r} both helped but set {var} to "
                    f"{merged[var]!r} and {str(value)!r}; combine them by hand")
            merged[var], origin[var] = str(value), name
    new = dict(spec)
    new["name"] = f"{results.name}-{COMBINED}"
    new["env"] = {base_set: env_sets[base_set], **{w: env_sets[w] for w in winners},
                  COMBINED: merged}
    header = [f"# Follow-up of study {results.name!r}: the baseline, each env set that was",
              "# better than the baseline alone, and their combination (re-measured together).",
              f"# better: {', '.join(winners)}"]
    if left_out:
        header.append("# left out: " + ", ".join(f"{n} ({v})" for n, v in left_out))
    text = "\n".join(header) + "\n" + yaml.safe_dump(new, sort_keys=False)
    return Combination(tuple(winners), tuple(left_out), merged, text)


def left_out_text(left_out: Sequence[tuple[str, str]], shown: int = 8) -> str:
    """The env sets left out, with their verdicts, for one line: each named
    (``a (slower), b (indistinguishable)``) up to ``shown`` of them, else counted by verdict
    with the first few names (``230 indistinguishable (e1, e2, e3 and 227 more), 10 slower
    (…)``); "" when none."""
    if len(left_out) <= shown:
        return ", ".join(f"{name} ({verdict})" for name, verdict in left_out)
    by_verdict: dict[str, list[str]] = {}
    for name, verdict in left_out:
        by_verdict.setdefault(verdict, []).append(name)
    first = 3
    return ", ".join(
        f"{len(names)} {verdict} ({', '.join(names[:first])}"
        + (f" and {len(names) - first} more)" if len(names) > first else ")")
        for verdict, names in by_verdict.items())
