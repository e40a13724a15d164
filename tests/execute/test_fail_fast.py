"""Stopping a study whose every point fails its first run the same way."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import tunelab
from tests.execute.test_runner import runs, study_text
from tunelab.execute.runner import FailFast, run_study
from tunelab.execute.study import prepare_study
from tunelab.spec import load_study
from tunelab.store import RunRecord


def _record(point: str, status: str, reason: str | None, repeat: int = 0,
            run_dir: str = "runs/x/r0") -> RunRecord:
    return RunRecord(point_key=point, params={}, repeat=repeat, status=status, reason=reason,
                     rc=1, wall_s=0.1, started_at="", ended_at="", host="h", command=[],
                     env={}, run_dir=run_dir, foms={})


def test_the_same_failure_everywhere_stops_once_every_point_ran(tmp_path: Path) -> None:
    ff = FailFast(3)
    for i, point in enumerate(("a", "b", "c")):
        assert ff.stop_reason is None
        run_dir = f"runs/{point}/r0"
        reason = f"exit code 1: cannot read {tmp_path / run_dir}/pw.in"
        ff.add(_record(point, "failed", reason, run_dir=run_dir), tmp_path)
        assert (ff.stop_reason is None) == (i < 2)
    assert ff.stop_reason is not None
    assert ff.stop_reason.endswith("exit code 1: cannot read <run dir>/pw.in")
    assert "each of the 3 points" in ff.stop_reason


def test_a_success_a_timeout_an_invalid_run_or_another_error_disarms_it(tmp_path: Path
                                                                        ) -> None:
    for other in (("ok", None), ("timeout", "killed"), ("invalid", "energy differs"),
                  ("failed", "exit code 2: something else")):
        ff = FailFast(2)
        ff.add(_record("a", "failed", "exit code 1: boom"), tmp_path)
        ff.add(_record("b", *other), tmp_path)
        assert ff.stop_reason is None
    ff = FailFast(2)  # only the first run of a point counts
    ff.add(_record("a", "failed", "exit code 1: boom"), tmp_path)
    ff.add(_record("a", "ok", None, repeat=1), tmp_path)
    ff.add(_record("b", "failed", "exit code 1: boom"), tmp_path)
    assert ff.stop_reason is not None
    assert FailFast(0).stop_reason is None


def test_a_study_failing_everywhere_stops_after_one_run_per_point(write_study, tmp_path):
    path = write_study(study_text("[crash]", "[1, 2, 3]", repeats=4))
    outcome = run_study(prepare_study(load_study(path)), tmp_path / "d")
    assert outcome.ran == 3 and outcome.planned == 12 and not outcome.all_ok
    assert outcome.stopped is not None and "something broke badly" in outcome.stopped
    res = tunelab("run", path, "--dir", tmp_path / "e", "-q")
    assert res.returncode == 1
    assert "stopped early: the first run of each of the 3 points failed the same way" in \
        res.stderr
    assert len(runs(tmp_path / "e")) == 3


def test_a_study_with_one_working_point_runs_to_the_end(write_study, tmp_path):
    path = write_study(study_text("[crash, ok]", "[1, 2]", repeats=2))
    outcome = run_study(prepare_study(load_study(path)), tmp_path / "d")
    assert outcome.stopped is None and outcome.ran == 8


def test_runs_lost_the_same_way_in_other_jobs_stop_the_study(tmp_path: Path) -> None:
    """A job script that cannot start (a module missing on every node) loses every run in
    its own job: the job tokens differ, the failure is the same."""
    ff = FailFast(2)
    for point, token in (("a", "0123456789ab"), ("b", "ba9876543210")):
        ff.add(_record(point, "lost", f"scheduler: FAILED (job tunelab-{token} ended before this "
                                      "run started): tunelab: module load qe failed on node1; "
                                      "lost 3 times, not submitted again (a resume runs it "
                                      "again)"), tmp_path)
    assert ff.stop_reason is not None and "job tunelab-<job> ended" in ff.stop_reason
