"""Pruning of training runs from their intermediate JSON lines, through the real runner."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.conftest import PY
from tunelab.execute.runner import run_study
from tunelab.execute.study import point_dir_name, prepare_study
from tunelab.report.load import load_results
from tunelab.search import IntermediateTail, RunPruner
from tunelab.space import Point
from tunelab.spec import load_study
from tunelab.store import open_store

TRAINER = textwrap.dedent("""\
    import json, sys, time
    quality = float(sys.argv[1])
    for step in range(1, 7):
        time.sleep(0.15)
        print(json.dumps({"intermediate": {"step": step, "score": quality * step}}),
              flush=True)
    print(f"score={quality * 6}")
    """)


def test_tail_reads_complete_new_lines_only(tmp_path: Path) -> None:
    out = tmp_path / "stdout.txt"
    out.write_text('noise\n{"intermediate": {"epoch": 1, "auc": 0.5}}\n{"interm')
    tail = IntermediateTail(out, "auc")
    assert tail.read() == [(1, 0.5)]
    with open(out, "a") as f:
        f.write('ediate": {"step": 2, "auc": 0.6}}\n{"intermediate": {"step": 3}}\n')
    assert tail.read() == [(2, 0.6)]  # the half line completed; a line without the FOM skipped
    assert tail.read() == []


def test_median_pruner_stops_runs_behind_the_earlier_ones() -> None:
    pruner = RunPruner("maximize", startup_runs=2, warmup_steps=1)
    for quality in (1.0, 1.2):
        run = pruner.begin()
        for step in range(1, 5):
            assert not pruner.report(run, step, quality * step)
        pruner.end(run, quality * 4)
    good, bad = pruner.begin(), pruner.begin()
    assert not pruner.report(good, 1, 1.5) and not pruner.report(good, 2, 3.0)
    assert not pruner.report(bad, 1, 0.2)  # warm-up step
    assert pruner.report(bad, 2, 0.4)  # behind the median of the finished runs at step 2
    assert bad.pruned_at == 2
    pruner.end(bad, None)
    pruner.end(good, 6.0)


def test_pruned_runs_are_killed_and_recorded_as_pruned(write_study, tmp_path: Path) -> None:
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    path = write_study(f"""\
        name: prune
        workload:
          name: command
          options:
            argv: [{PY}, {trainer}, "{{quality}}"]
            foms: {{score: 'score=(?P<value>[0-9.]+)'}}
        parameters:
          quality: [1.0, 0.2, 1.1, 0.1, 1.2]
        repeats: 1
        baseline: {{quality: 1.0}}
        objective: {{fom: score, direction: maximize}}
        search: {{strategy: grid, prune: true}}
        """)
    run_study(prepare_study(load_study(path)), tmp_path / "d")
    with open_store(tmp_path / "d") as store:
        frame = store.runs_frame()
    by_quality = {row["quality"]: row for _, row in frame.iterrows()}
    pruned = {q for q, row in by_quality.items() if row["status"] == "pruned"}
    assert pruned and pruned <= {0.2, 0.1}
    for q in pruned:
        row = by_quality[q]
        assert row["reason"].startswith("pruned at step ")
        out = tmp_path / "d" / "runs" / point_dir_name(Point({"quality": q})) / "r0"
        steps = [json.loads(ln)["intermediate"]["step"]
                 for ln in (out / "stdout.txt").read_text().splitlines()]
        assert steps and max(steps) < 6  # killed before its last step (not timed: load)
    assert by_quality[1.2]["status"] == "ok"
    results = load_results(tmp_path / "d")
    counted = {s.params["quality"]: s.failed for s in results.summaries}
    assert all(counted[q] == {"pruned": 1} for q in pruned)
