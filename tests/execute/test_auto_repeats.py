"""The runner's loop for ``repeats: auto`` and ``--rerun-disturbed``: real processes, the
real store; the noise watch of the second test is told which runs were disturbed."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import PY
from tunelab.execute.launchers import LocalLauncher
from tunelab.execute.launchers.watch import RunWatch
from tunelab.execute.runner import run_study
from tunelab.execute.study import prepare_study
from tunelab.noise import NoiseSample, NoiseWatch, Snapshot
from tunelab.report.load import load_results
from tunelab.spec import load_study
from tunelab.stats import Verdict

# x = 1 is the baseline (10), x = 2 is twice as fast, x = 3 equal to the baseline; the noise
# of each point (per cent) is its second parameter
PROG = """\
import os, random, sys
random.seed(os.path.basename(os.getcwd()))  # the run's directory: one value per run
x, cv = int(sys.argv[1]), float(sys.argv[2])
print("v=%f" % ((5.0 if x == 2 else 10.0) * random.lognormvariate(0, cv / 100)))
"""

STUDY = """\
name: auto
workload:
  name: command
  options:
    argv: [{python}, {prog}, "{{x}}", "{{cv}}"]
    foms: {{v: 'v=(?P<value>[0-9.]+)'}}
parameters: {{x: [1, 2, 3], cv: [{cv}]}}
repeats: {repeats}
baseline: {{x: 1, cv: {cv}}}
objective: {{fom: v, direction: minimize}}
"""


def _study(tmp_path: Path, cv: float, repeats: object) -> str:
    (tmp_path / "prog.py").write_text(PROG)
    return STUDY.format(python=PY, prog=tmp_path / "prog.py", cv=cv, repeats=repeats)


def _rounds(study_dir: Path) -> Counter[int]:
    runs = load_results(study_dir).runs
    return Counter(json.loads(p)["x"] for p in runs["point"])


@pytest.mark.slow
def test_repeats_auto_stops_once_every_comparison_is_decided(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(_study(tmp_path, cv=0.1, repeats="{min: 3, max: 8}"))
    outcome = run_study(prepare_study(load_study(path)), tmp_path / "d")
    assert outcome.planned == 24 and outcome.ran == 9  # three rounds decided everything
    assert _rounds(tmp_path / "d") == {1: 3, 2: 3, 3: 3}
    results = load_results(tmp_path / "d")
    assert results.plan is not None and (results.plan.min_rounds, results.plan.max_rounds) == (3, 8)
    by_x = {pc.summary.params["x"]: pc.comparison for pc in results.comparisons}
    assert by_x[2].verdict is Verdict.BETTER and by_x[2].decided
    assert by_x[3].verdict is Verdict.INDISTINGUISHABLE and by_x[3].decided
    assert any("all 2 comparisons decided" in n for n in results.notes)


@pytest.mark.slow
def test_repeats_auto_never_passes_its_budget_and_resumes(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(_study(tmp_path, cv=30, repeats="{min: 3, max: 5}"))
    run_study(prepare_study(load_study(path)), tmp_path / "d")
    rounds = _rounds(tmp_path / "d")
    assert min(rounds.values()) >= 3 and max(rounds.values()) <= 5
    assert rounds[1] == max(rounds.values())  # the baseline runs with every other point
    results = load_results(tmp_path / "d")
    open_ = [pc for pc in results.comparisons if pc.comparison.decided is False]
    assert all(rounds[pc.summary.params["x"]] == 5 for pc in open_)  # only at the budget
    again = run_study(prepare_study(load_study(path)), tmp_path / "d")  # resume: all done
    assert again.ran == 0


class FirstRunsDisturbed(NoiseWatch):
    """Flags the first ``n`` runs it watches as disturbed."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.left = n

    def stop(self, before: Snapshot) -> NoiseSample:
        sample = super().stop(before)
        flagged = self.left > 0
        self.left -= 1
        return NoiseSample(sample.cpus, sample.cpu_list, 0.9 if flagged else 0.0,
                           sample.own_share, 0.0, sample.psi_some, None, None, None, None,
                           flagged, "others took 90% of cores" if flagged else None)


@pytest.mark.slow
def test_disturbed_runs_are_run_again(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(_study(tmp_path, cv=1, repeats=2))
    study = prepare_study(load_study(path))
    launcher = LocalLauncher(watch=RunWatch("v", noise=FirstRunsDisturbed(2)))
    outcome = run_study(study, tmp_path / "d", launcher=launcher, rerun_disturbed=1)
    assert outcome.counts == {"ok": 6} and outcome.ran == 8
    results = load_results(tmp_path / "d")
    assert results.disturbance is not None and results.disturbance.disturbed == 0
    # the two runs made again (both of round r0) pair with each other, not with r0's third
    assert [(b.round, b.reruns) for b in results.unpaired] == [(0, 2)]
    assert any("The 2 runs made again by --rerun-disturbed (round r0)" in n
               for n in results.notes)
    from tunelab.store import open_store

    with open_store(tmp_path / "d") as store:
        assert len(json.loads(store.get_meta("discarded_runs") or "[]")) == 2
