"""Which runs a verdict pairs (:mod:`tunelab.stats.blocks`): a round split across ``tunelab
run`` sessions, and runs made again by ``--rerun-disturbed``, are not paired across the
break. The runs are written through the real store with controlled times, so the store's
``session`` and ``rerun`` columns are what a real study would have."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tunelab.report.results import pairing_line, results_from_frame
from tunelab.report.views import best_view, compare_view
from tunelab.stats import SequentialPlan, compare_to_baseline, pairing_breaks, still_undecided
from tunelab.stats.pooled import RoundTable
from tunelab.stats.summaries import point_groups
from tunelab.store import RunRecord, open_store
from tunelab.workload import Objective

T0 = datetime(2026, 11, 1, tzinfo=UTC)
POINTS = 4  # x = 0 is the baseline; all four are equal
BASE = json.dumps({"x": 0})
# run-to-run noise, fixed so that nothing depends on a seed: 0.3 % at most
NOISE = [[1.000, 1.002, 0.999, 1.001, 1.000],
         [1.001, 0.999, 1.002, 1.000, 0.998],
         [0.999, 1.001, 1.000, 0.998, 1.002],
         [1.002, 1.000, 0.998, 1.001, 0.999]]


def _iso(t: datetime) -> str:
    return t.isoformat(timespec="milliseconds")


def _record(x: int, repeat: int, value: float, start: datetime) -> RunRecord:
    params = {"x": x}
    return RunRecord(point_key=json.dumps(params), params=params, repeat=repeat, status="ok",
                     reason=None, rc=0, wall_s=value, started_at=_iso(start),
                     ended_at=_iso(start + timedelta(seconds=value)), host="h", command=[],
                     env={}, run_dir="r", foms={"t": value})


def _study(tmp_path: Path, *, rounds: int = 5, break_after: int | None = None,
           slower: float = 0.15, pause: timedelta = timedelta(days=2)) -> pd.DataFrame:
    """A study of equal points, round by round (the baseline first in even rounds, last in
    odd ones), interrupted after ``break_after`` runs and resumed ``pause`` later on a
    machine ``slower`` (a share) slower; its runs table as the store reads it."""
    now = T0
    factor = 1.0
    with open_store(tmp_path, create=True) as store:
        store.add_sysinfo(_iso(now), {"session": 1})
        done = 0
        for r in range(rounds):
            order = range(POINTS) if r % 2 == 0 else reversed(range(POINTS))
            for x in order:
                if done == break_after:
                    now += pause
                    factor = 1.0 + slower
                    store.add_sysinfo(_iso(now), {"session": 2})
                value = 10.0 * NOISE[x][r] * factor
                store.record_run(_record(x, r, value, now))
                now += timedelta(seconds=value + 0.1)
                done += 1
        return store.runs_frame()


def _by_x(runs: pd.DataFrame, **kw: object) -> dict[int, object]:
    out = compare_to_baseline(runs, "t", "minimize", BASE, **kw)  # type: ignore[arg-type]
    return {pc.summary.params["x"]: pc.comparison for pc in out if not pc.is_baseline}


def _same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN (the comparisons of two computations)."""
    return all(x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
               for x, y in zip(vars(a).values(), vars(b).values(), strict=True))


def test_a_round_split_across_sessions_is_not_paired_across_the_break(tmp_path: Path):
    """Interrupted in the middle of round r2 (the baseline and x=1 before the break, x=2 and
    x=3 two days later on a machine 15 % slower): round r2's pairs of x=2 and x=3 with the
    baseline carried the 15 % as if it were theirs — speedup 0.973, interval about ±3 %,
    noise 5 % where the runs vary by 0.2 %. Each session's runs now pair only among
    themselves: the estimates are the equal points' (within 0.3 %)."""
    runs = _study(tmp_path, break_after=2 * POINTS + 2)
    assert runs["session"].tolist() == [1] * 10 + [2] * 10
    assert pairing_breaks(runs, "fom.t")[0].round == 2
    comparisons = _by_x(runs)
    for x in (1, 2, 3):
        c = comparisons[x]
        assert abs(math.log(c.speedup)) < 0.003, (x, c.speedup)  # type: ignore[attr-defined]
        assert c.ci_high / c.ci_low < 1.02, (x, c.ci_low, c.ci_high)  # type: ignore[attr-defined]
    assert comparisons[1].n_pairs == 5  # type: ignore[attr-defined]  # x=1 shares a session
    assert comparisons[2].n_pairs == 4  # type: ignore[attr-defined]  # x=2 does not


def test_the_user_is_told_which_round_was_split_and_how_far_apart(tmp_path: Path):
    runs = _study(tmp_path, break_after=2 * POINTS + 2)
    results = results_from_frame(runs, Objective("t", "minimize"), BASE)
    line = ("Round r2 was split across 2 'tunelab run' sessions (2.0 days apart): runs of "
            "different sessions are not paired.")
    assert line in results.trust and line in results.notes
    document = compare_view(results).document
    assert document["unpaired"] == [{"round": 2, "sessions": 2,
                                     "apart_s": pytest.approx(2 * 86400 + 0.1), "reruns": 0}]
    best = best_view(results, results.best_result()).document
    assert best["unpaired"] == document["unpaired"] and line in best["notes"]


def test_a_study_never_interrupted_in_a_round_is_judged_exactly_as_before(tmp_path: Path):
    """One session, or a resume between two rounds: the same comparisons, to the last bit,
    as the runs table without the session columns (what every verdict was before), and no
    note."""
    for i, cut in enumerate((None, 2 * POINTS)):  # never interrupted; resumed at r2's start
        runs = _study(tmp_path / str(i), break_after=cut)
        plain = runs.drop(columns=["session", "rerun"])
        assert pairing_breaks(runs, "fom.t") == ()
        for plan in (None, SequentialPlan(3, 5)):
            new, old = _by_x(runs, plan=plan), _by_x(plain, plan=plan)
            assert all(_same(new[x], old[x]) for x in new)
        results = results_from_frame(runs, Objective("t", "minimize"), BASE)
        assert not results.unpaired and not any("paired." in n for n in results.notes)
        assert compare_view(results).document["unpaired"] == []


def test_runs_made_again_by_rerun_disturbed_are_not_paired_with_their_round(tmp_path: Path):
    """``--rerun-disturbed`` runs a disturbed run again after the study's rounds, here on a
    machine 10 % slower by then: x=1's reruns of r1 and r3 were paired with their rounds'
    runs as if made beside them (speedup 0.96). They now pair with nothing."""
    runs_before = _study(tmp_path)
    assert pairing_breaks(runs_before, "fom.t") == ()
    later = T0 + timedelta(hours=3)
    with open_store(tmp_path, write=True) as store:
        store.discard_runs([(json.dumps({"x": 1}), 1, "others took 90%"),
                            (json.dumps({"x": 1}), 3, "others took 90%")], _iso(later))
        for r in (1, 3):
            later += timedelta(seconds=12)
            store.record_run(_record(1, r, 11.0 * NOISE[1][r], later))
        runs = store.runs_frame()
    assert sorted(runs.loc[runs["rerun"] != "", "repeat"]) == [1, 3]
    c = _by_x(runs)[1]
    assert abs(math.log(c.speedup)) < 0.003 and c.n_pairs == 3  # type: ignore[attr-defined]
    (line,) = [n for n in results_from_frame(runs, Objective("t", "minimize"), BASE).trust
               if "rerun" in n]
    assert line == ("The 2 runs made again by --rerun-disturbed (rounds r1, r3) are not "
                    "paired with the other runs of their rounds.")


def test_the_looks_of_repeats_auto_take_a_split_round_at_its_round(tmp_path: Path):
    """The sequential looks read rounds: a look before round r2 sees neither of its two
    blocks, the look after it both; and the runner's question (still undecided?) and the
    replay answer alike."""
    runs = _study(tmp_path, break_after=2 * POINTS + 2)
    table = RoundTable.of(point_groups(runs, "fom.t"))
    assert table is not None
    assert table.rounds.tolist() == [0, 1, 2, 2, 3, 4]  # r2 is two blocks
    assert table.upto(2).shape[1] == 2 and table.upto(3).shape[1] == 4
    plan = SequentialPlan(3, 8)
    assert still_undecided(runs, "t", "minimize", BASE, plan) == \
        still_undecided(runs.copy(), "t", "minimize", BASE, plan)
    decided = _by_x(runs, plan=plan)
    assert all(abs(math.log(c.speedup)) < 0.003 for c in decided.values())  # type: ignore[attr-defined]


def test_pairing_line_names_rounds_and_reruns_in_one_sentence():
    from tunelab.stats import PairingBreak

    assert pairing_line((PairingBreak(3, 2, 40.0, 0), PairingBreak(7, 3, 7200.0, 1))) == (
        "Rounds r3, r7 were split across 'tunelab run' sessions (up to 2.0 h apart): runs of "
        "different sessions are not paired; the 1 run made again by --rerun-disturbed "
        "(round r7) is not paired with the other runs of its round.")
    assert pairing_line((PairingBreak(0, 2, math.nan, 0),)) == (
        "Round r0 was split across 2 'tunelab run' sessions: runs of different sessions are "
        "not paired.")


def test_a_table_without_session_columns_pairs_by_round_as_before():
    runs = pd.DataFrame({"point": [BASE, json.dumps({"x": 1})] * 3, "status": "ok",
                         "repeat": np.repeat([0, 1, 2], 2), "fom.t": [1.0, 1.1, 1.01, 1.12,
                                                                      0.99, 1.09]})
    assert pairing_breaks(runs, "fom.t") == ()
    group = point_groups(runs, "fom.t")[BASE]
    assert group.blocks is not None and group.blocks.tolist() == [0, 1, 2]


def _rerun(tmp_path: Path, again: list[tuple[int, int]], factor: float = 1.10) -> pd.DataFrame:
    """The study of :func:`_study`, then the runs ``again`` ((x, round) pairs) made again
    by one ``--rerun-disturbed`` pass three hours later, on a machine ``factor`` slower."""
    _study(tmp_path)
    later = T0 + timedelta(hours=3)
    with open_store(tmp_path, write=True) as store:
        store.discard_runs([(json.dumps({"x": x}), r, "others took 90%") for x, r in again],
                           _iso(later))
        for x, r in again:
            later += timedelta(seconds=12)
            store.record_run(_record(x, r, 10.0 * factor * NOISE[x][r], later))
        return store.runs_frame()


def test_a_point_left_with_too_few_pairs_is_linked_through_the_other_points(tmp_path: Path):
    """x=1 was disturbed in rounds r0, r1 and r2 and made again after the machine had drifted
    10 %: it keeps 2 rounds in common with the baseline, too few to pair. Welch's test on all
    its runs compared its three late runs with the baseline's early ones and took the drift
    for a change (×0.944 [0.860, 1.036], p 0.07, where the runs vary by 0.3 %). The study's
    additive model links the late runs through x=2, made again in the same pass: no change,
    within ±0.4 %."""
    from tunelab.stats.results import TEST_POOLED_ADDITIVE, Verdict

    runs = _rerun(tmp_path, [(1, 0), (1, 1), (1, 2), (2, 1), (2, 2)])
    c = _by_x(runs)[1]
    assert c.test == TEST_POOLED_ADDITIVE and c.n_pairs == 2  # type: ignore[attr-defined]
    assert abs(math.log(c.speedup)) < 0.003, c.speedup  # type: ignore[attr-defined]
    assert c.verdict is Verdict.INDISTINGUISHABLE  # type: ignore[attr-defined]
    assert c.ci_high / c.ci_low < 1.01, (c.ci_low, c.ci_high)  # type: ignore[attr-defined]
    results = results_from_frame(runs, Objective("t", "minimize"), BASE)
    assert any(TEST_POOLED_ADDITIVE in n for n in results.trust)


def test_a_point_the_model_cannot_link_or_that_is_noisier_keeps_welchs_test(tmp_path: Path):
    """Made again alone in its pass in rounds r0-r2, x=1's late runs share a block with no
    other point: the model sets them aside and judges x=1 on its two rounds left (no
    change). Made again alone in every round, nothing links x=1 to the baseline: Welch's
    test, as before. A point whose runs scatter 10 % about the model where the study's
    scatter 0.3 % is not judged on the study's noise either."""
    from tunelab.stats.results import TEST_POOLED_ADDITIVE, TEST_WELCH

    alone = _by_x(_rerun(tmp_path / "alone", [(1, 0), (1, 1), (1, 2)]))[1]
    assert alone.test == TEST_POOLED_ADDITIVE  # type: ignore[attr-defined]
    assert abs(math.log(alone.speedup)) < 0.003  # type: ignore[attr-defined]
    apart = _rerun(tmp_path / "apart", [(1, r) for r in range(5)])
    assert _by_x(apart)[1].test == TEST_WELCH  # type: ignore[attr-defined]
    noisy = _rerun(tmp_path / "noisy", [(1, 0), (1, 1), (1, 2), (2, 1)])
    wild = noisy["point"].eq(json.dumps({"x": 1})) & noisy["repeat"].isin([3, 4])
    noisy.loc[wild, "fom.t"] *= np.array([0.9, 1.1])
    assert _by_x(noisy)[1].test == TEST_WELCH  # type: ignore[attr-defined]
