"""The `leopard` workload: registration, command lines, parsing, synthetic data, a real run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tunelab.errors import ParseError, WorkloadError
from tunelab.workload import RunContext
from tunelab.workloads import get_workload
from tunelab.workloads.leopard import LeopardOptions, LeopardWorkload

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "leopard-tune.yaml"


def _ctx(tmp_path: Path, **values: object) -> RunContext:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    return RunContext(values=values, env={}, run_dir=run, study_dir=tmp_path,
                      study_file=None, cores=2)


def test_registered_with_objective_and_space() -> None:
    cls = get_workload("leopard")
    assert cls is LeopardWorkload
    w = cls(LeopardOptions())
    assert (w.objective.fom, w.objective.direction) == ("val_pr_auc", "maximize")
    assert list(w.default_space()) == ["batch_size", "lr"]


def test_single_process_command(synth: Path, tmp_path: Path) -> None:
    w = LeopardWorkload(LeopardOptions(data=str(synth.parent), window=512))
    cmd = w.command(_ctx(tmp_path, batch_size=32, lr=0.0025, epochs=3))
    argv = list(cmd.argv)
    assert argv[1:4] == ["-m", "tunelab.leopard", "train"]
    assert argv[argv.index("--batch-size") + 1] == "32"
    assert argv[argv.index("--lr") + 1] == "0.0025"
    assert argv[argv.index("--epochs") + 1] == "3"
    assert argv[argv.index("--window") + 1] == "512"
    assert argv[argv.index("--out") + 1] == str(tmp_path / "run" / "train")
    assert cmd.env["OMP_NUM_THREADS"] == "2" and cmd.cwd == tmp_path / "run"


def test_repeats_train_with_different_seeds(synth: Path, tmp_path: Path) -> None:
    import dataclasses

    w = LeopardWorkload(LeopardOptions(data=str(synth.parent), window=512, seed=7))
    ctx = _ctx(tmp_path, batch_size=8)
    seeds = []
    for repeat in (0, 1, 2):
        argv = list(w.command(dataclasses.replace(ctx, repeat=repeat)).argv)
        seeds.append(argv[argv.index("--seed") + 1])
    assert seeds == ["7", "8", "9"]


def test_nproc_launches_torchrun(synth: Path, tmp_path: Path) -> None:
    w = LeopardWorkload(LeopardOptions(data=str(synth.parent)))
    argv = list(w.command(_ctx(tmp_path, batch_size=8, lr=0.01, nproc=2,
                               sync_bn=True)).argv)
    assert argv[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                         "2"]
    assert "--sync-bn" in argv
    assert w.command(_ctx(tmp_path, nproc=2)).env["OMP_NUM_THREADS"] == "1"


def test_parse(tmp_path: Path) -> None:
    w = LeopardWorkload(LeopardOptions())
    out = 'log\n{"val_pr_auc": 0.5, "train_time_s": 12.5}\n'
    assert w.parse(out, "", tmp_path) == {"val_pr_auc": 0.5, "train_time_s": 12.5}
    with pytest.raises(ParseError, match="error: window length 1000"):
        w.parse("epoch 1\n", "Traceback\nerror: window length 1000 bad\n", tmp_path)
    with pytest.raises(ParseError, match="no figures-of-merit"):
        w.parse('{"other": 1}\n', "", tmp_path)


def test_missing_data_option(tmp_path: Path) -> None:
    w = LeopardWorkload(LeopardOptions(data="nowhere"), study_file=tmp_path / "s.yaml")
    with pytest.raises(WorkloadError, match="nowhere does not exist"):
        w.check()


def test_check_generates_the_synthetic_set_once(tmp_path: Path) -> None:
    w = LeopardWorkload(LeopardOptions(cache_dir=str(tmp_path / "cache"), synth_chroms=3,
                                       synth_length=12_000))
    assert not (w.synthetic_dir() / "leopard.json").exists()
    w.check()
    manifest = w.synthetic_dir() / "leopard.json"
    stamp = manifest.stat().st_mtime_ns
    w.check()
    assert manifest.stat().st_mtime_ns == stamp
    assert (w.synthetic_dir() / "dnase.bw").is_file()


def test_example_study_names_valid_options() -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    assert doc["workload"]["name"] == "leopard"
    opts = LeopardOptions(**doc["workload"]["options"])
    assert opts.device == "cpu"  # sized for 2 CPU cores: the same runs on a GPU machine
    assert list(doc["parameters"]) == ["batch_size", "lr"]
    assert doc["objective"] == {"fom": "val_pr_auc", "direction": "maximize"}


@pytest.mark.slow
def test_real_run_of_the_command(windows: Path, tmp_path: Path) -> None:
    w = LeopardWorkload(LeopardOptions(data=str(windows), window=512, epochs=1,
                                       steps_per_epoch=2, device="cpu"))
    cmd = w.command(_ctx(tmp_path, batch_size=4, lr=0.001))
    r = subprocess.run(list(cmd.argv), env={**os.environ, **cmd.env}, cwd=cmd.cwd,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    foms = w.parse(r.stdout, r.stderr, tmp_path / "run")
    assert 0 <= foms["val_pr_auc"] <= 1 and foms["train_time_s"] > 0
    assert (tmp_path / "run" / "train" / "metrics.json").is_file()


def test_dry_run_says_the_study_sets_the_threads_over_the_shell_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``OMP_NUM_THREADS=1 tunelab run examples/leopard-tune.yaml --dry-run`` listed
    ``OMP_NUM_THREADS=2`` commands and said nothing of the shell's 1 being overridden."""
    from tests.conftest import tunelab

    study = yaml.safe_load(EXAMPLE.read_text())
    study["workload"]["options"].update(threads=3, cache_dir=str(tmp_path / "cache"))
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    res = tunelab("run", path, "--dir", tmp_path / "d", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "OMP_NUM_THREADS=3" in res.stdout
    assert res.stderr.count("leopard: its runs set OMP_NUM_THREADS=3 (this shell's: 1): the "
                            "workload sets these itself") == 1
    assert not (tmp_path / "d").exists()
