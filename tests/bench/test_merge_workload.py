"""The ``merge`` workload (command + parser) and the ``tunelab bench merge`` typer app."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import env_with_pythonpath
from tunelab.errors import ParseError, RunReportedError, WorkloadError
from tunelab.workload import RunContext
from tunelab.workloads import get_workload
from tunelab.workloads.merge import MergeOptions, MergeWorkload

from .merge_helpers import SRC


def ctx(tmp_path: Path, values: dict, env: dict | None = None) -> RunContext:
    return RunContext(values=values, env=env or {}, run_dir=tmp_path, study_dir=tmp_path,
                      study_file=None, cores=2)


def workload(**options: object) -> MergeWorkload:
    return MergeWorkload(MergeOptions(**options))  # type: ignore[arg-type]


def run_like_engine(cmd, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """What the engine does: argv list, the run's env merged into the environment, cwd."""
    full = {**env_with_pythonpath(SRC), **cmd.env, **env}
    return subprocess.run(list(cmd.argv), cwd=cmd.cwd, env=full, capture_output=True,
                          text=True, timeout=120)


def test_registered_with_throughput_objective() -> None:
    cls = get_workload("merge")
    assert cls is MergeWorkload
    w = workload()
    assert (w.objective.fom, w.objective.direction) == ("throughput", "maximize")
    with pytest.raises(WorkloadError, match="greater than or equal to 2"):  # no rule: refused
        w.check_parameter("workers", 1)
    w.check_parameter("workers", 3)
    w.check_parameter("unrelated", -1)  # no option of the merge workload: not its to judge
    with pytest.raises(ValueError):
        MergeOptions(bogus=1)  # type: ignore[call-arg]


def test_point_parameters_override_options(tmp_path: Path) -> None:
    w = workload(transport="mpi", chunk_size=1000, workers=2, mpi_args=["-x", "UCX_TLS"])
    cmd = w.command(ctx(tmp_path, {"transport": "tcp", "chunk_size": 500, "workers": 3,
                                   "unrelated": 7}))
    argv = list(cmd.argv)
    assert argv[:3] == [sys.executable, "-m", "tunelab.bench.merge"]
    assert argv[argv.index("--transport") + 1] == "tcp"
    assert argv[argv.index("--chunk-size") + 1] == "500"
    assert argv[argv.index("--workers") + 1] == "3"
    assert "--mpi-arg=-x" in argv and "--mpi-arg=UCX_TLS" in argv
    assert cmd.cwd == tmp_path and dict(cmd.env) == {}
    hosts = workload(hostfile="hosts.txt").command(ctx(tmp_path, {}))
    assert hosts.argv[hosts.argv.index("--hostfile") + 1] == str(tmp_path / "hosts.txt")


def test_invalid_point_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="invalid point") as err:
        workload().command(ctx(tmp_path, {"chunk_size": 0}))
    assert "\n" not in str(err.value)
    with pytest.raises(WorkloadError):
        workload().command(ctx(tmp_path, {"transport": "pigeon"}))


def test_check_reports_missing_programs() -> None:
    with pytest.raises(WorkloadError, match="not installed or not on PATH"):
        workload(transport="mpi", mpirun="/nonexistent/mpirun").check()
    if subprocess.run([sys.executable, "-c", "import ucxx"], capture_output=True).returncode:
        with pytest.raises(WorkloadError, match=r"tunelab\[ucx\]"):
            workload(transport="ucxx").check()
    workload(transport="tcp").check()


@pytest.mark.slow
def test_engine_style_run_and_parse(tmp_path: Path) -> None:
    w = workload(transport="tcp", workers=2, chunk_size=1000, iterations=2, warmup=1)
    cmd = w.command(ctx(tmp_path, {"chunk_size": 800}))
    proc = run_like_engine(cmd, {})
    assert proc.returncode == 0, proc.stderr
    foms = w.parse(proc.stdout, proc.stderr, tmp_path)
    assert foms["throughput"] > 0 and foms["bandwidth"] > 0
    assert foms["merged_rows"] == 2 * 240
    assert foms["data_processed"] == 32 * 800
    assert set(foms) >= {"throughput_std", "bandwidth_min", "bandwidth_max", "wall_iter_s"}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun (openmpi-bin)")
def test_env_set_reaches_mpi_ranks_over_ucx(tmp_path: Path) -> None:
    """A study's env set (UCX_*) reaches UCX inside every rank: a bad UCX_TLS makes the UCX
    PML fail, a good one runs."""
    w = workload(transport="mpi", mpi_pml="ucx", workers=2, chunk_size=500, iterations=1,
                 timeout=20)
    cmd = w.command(ctx(tmp_path, {}))
    good = run_like_engine(cmd, {"UCX_TLS": "tcp,self", "UCX_RNDV_SCHEME": "am"})
    assert good.returncode == 0, good.stderr
    assert w.parse(good.stdout, good.stderr, tmp_path)["throughput"] > 0
    bad = run_like_engine(cmd, {"UCX_TLS": "cma"})  # no active-message transport: no UCX
    assert bad.returncode != 0
    # the failure reason is UCX's own, not a line of Open MPI's banner
    with pytest.raises(RunReportedError, match="UCX refused the configuration: .*transport"):
        w.parse(bad.stdout, bad.stderr, tmp_path)
    ignored = run_like_engine(cmd, {"UCX_TLSS": "tcp"})  # misspelt: UCX ran its defaults
    with pytest.raises(RunReportedError, match="UCX did not use UCX_TLSS"):
        w.parse(ignored.stdout, ignored.stderr, tmp_path)


def test_parse_errors() -> None:
    w = workload()
    with pytest.raises(RunReportedError, match=r"^merge: worker 1 .*died"):
        w.parse("table only\n", "merge: worker 1 (pid 3) died: killed by SIGKILL\n", Path())
    with pytest.raises(ParseError, match="no merge result line"):
        w.parse("table only\n", "merge: warning: UCX_X\n", Path())
    failed = json.dumps({"benchmark": "merge", "verified": False, "error": "iteration 0: bad"})
    with pytest.raises(ParseError, match="verification failed: iteration 0: bad"):
        w.parse(f"x\n{failed}\n", "", Path())
    ok = json.dumps({"benchmark": "merge", "verified": True, "throughput": 5, "bandwidth": 2.5,
                     "workers": 2, "transport": "tcp"})
    foms = w.parse(f'{ok}\n{{"other": 1}}\nnot json {{\n', "", Path())
    assert foms == {"throughput": 5.0, "bandwidth": 2.5}
    with pytest.raises(ParseError, match="no throughput"):
        w.parse(json.dumps({"benchmark": "merge", "verified": True}), "", Path())


def test_typer_app_mounts_as_bench_merge() -> None:
    from tunelab.cli import app as main  # the real CLI: plain help, whatever the terminal

    runner = CliRunner()
    res = runner.invoke(main, ["bench", "merge", "--help"])
    assert res.exit_code == 0 and "--chunk-size" in res.output and "--transport" in res.output
    assert "--inject-fault" not in res.output
    bad = runner.invoke(main, ["bench", "merge", "--chunk-size", "0"])
    assert bad.exit_code == 2


@pytest.mark.slow
def test_typer_app_runs_the_benchmark() -> None:
    from tunelab.bench.cli import app

    res = CliRunner().invoke(app, ["merge", "-n", "2", "-c", "300", "-i", "1"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output.strip().splitlines()[-1])["verified"] is True


def test_memory_need_is_refused_before_anything_is_allocated() -> None:
    from tunelab.bench.merge.config import MergeConfig, check_memory, memory_need

    cfg = MergeConfig(workers=4, chunk_size=10**6)
    assert memory_need(cfg, 4) == 4 * ((128 << 20) + 192 * 10**6)
    check_memory(cfg, 4, memory_need(cfg, 4))  # exactly enough: runs
    with pytest.raises(WorkloadError, match=r"--chunk-size 1000000 with 4 worker\(s\) on this "
                                            r"host needs about 1\.2 GiB .* 1\.0 GiB is available"):
        check_memory(cfg, 4, 1 << 30)


def test_a_point_that_cannot_fit_here_is_refused_by_check_values_unless_it_runs_elsewhere(
) -> None:
    w = workload(transport="tcp")
    with pytest.raises(WorkloadError, match=r"chunk_size 1000000000000 with 2 worker\(s\) on "
                                            r"this host needs about .* \(MemAvailable\)") as err:
        w.check_values({"chunk_size": 10**12})
    assert err.value.option == ("chunk_size",)
    w.check_values({"chunk_size": 1000})
    with pytest.raises(WorkloadError) as err:
        w.check_values({"workers": 10**6})
    assert err.value.option == ("workers",)
    workload(transport="tcp", hostfile="hosts").check_values({"workers": 10**6})  # 1 here
    w.runs_here = False  # a batch launcher's node: the benchmark judges there
    w.check_values({"chunk_size": 10**12})


def test_a_failure_of_dask_itself_is_one_line_and_exit_4(monkeypatch, capsys) -> None:
    """Dask lost a merge's dependencies under load (1 run of 9 in examples/
    merge-transports.yaml): a 113-line traceback and exit 1 before, dask's log line the
    run's reason."""
    from tunelab.bench.merge import dask as merge_dask
    from tunelab.bench.merge.config import MergeConfig

    class Lost(Exception):
        pass

    class Client:
        def scheduler_info(self) -> dict:
            raise Lost("2 Futures cancelled:\nReasons:\n2 Futures cancelled for reason: lost "
                       "dependencies.\nMessage: None")

        def close(self) -> None:
            pass

    monkeypatch.setattr(merge_dask, "_client", lambda cfg: (Client(), None))
    assert merge_dask.run_dask(MergeConfig(transport="dask")) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["merge: dask failed in phase generate: Lost: 2 Futures cancelled: Reasons: 2 "
                   "Futures cancelled for reason: lost dependencies. Message: None"]
