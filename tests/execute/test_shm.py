"""A run's shared memory goes with it: the MPI and UCX backing files of a run live in a private
directory under /dev/shm, removed after the run whatever happened, swept when a study starts
after a killed controller; the user's own settings win; a concurrent run's directory and
anything a live process uses are never removed (real mpirun where it runs here)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tunelab.execute import hygiene, shm
from tunelab.execute.launchers import step
from tunelab.execute.launchers.base import RunRequest
from tunelab.execute.launchers.process import run_command
from tunelab.workload import Needs

VADER = "OMPI_MCA_btl_vader_backing_directory"

# each rank: reach a barrier (the shared-memory segments exist by then), write the paths of
# the vader segments it maps into seg.RANK and its parent's pid (mpirun's) into launcher.RANK
# (in the working directory), then wait to be killed
RANK = ("import os, time\n"
        "from mpi4py import MPI\n"
        "MPI.COMM_WORLD.Barrier()\n"
        "maps = sorted({l.split()[-1] for l in open('/proc/self/maps') if 'vader_segment' in l})\n"
        "name = f'seg.{MPI.COMM_WORLD.rank}'\n"
        "open(name + '.part', 'w').write('\\n'.join(maps))\n"
        "open(f'launcher.{MPI.COMM_WORLD.rank}', 'w').write(str(os.getppid()))\n"
        "os.rename(name + '.part', name)\n"
        "time.sleep(600)\n")


def _mpi_ok() -> bool:
    if shutil.which("mpirun") is None:
        return False
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


needs_mpi = pytest.mark.skipif(not _mpi_ok(), reason="needs mpirun and mpi4py")


def _mpi_env() -> dict[str, str]:
    return {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_mpi_yield_when_idle": "1", "OMPI_MCA_btl": "self,vader"}


def _mpirun(tmp_path: Path, *, timeout_s: float, stop_when_up: bool) -> tuple[str, list[str]]:
    """Run 2 ranks of :data:`RANK` under real mpirun, killed at the timeout or, with
    ``stop_when_up``, once both ranks said which segments they map; the outcome's status and
    the segments' paths."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    out = run_dir / "stdout.txt"

    def both_up() -> bool:
        return all((tmp_path / f"seg.{rank}").exists() for rank in (0, 1))

    outcome = run_command(
        ["mpirun", "-np", "2", "--oversubscribe", sys.executable, "-c", RANK],
        env=_mpi_env(), cwd=tmp_path, timeout_s=timeout_s, stdout_path=out,
        stderr_path=run_dir / "stderr.txt", should_stop=both_up if stop_when_up else None,
        poll_s=0.05)
    segments = sorted({p for seg in tmp_path.glob("seg.?") for p in seg.read_text().split()})
    return outcome.status, segments


def _private(path: str) -> bool:
    return Path(path).parent.parent == shm.ROOT and Path(path).parent.name.startswith("tunelab-")


@needs_mpi
def test_a_killed_mpi_run_leaves_no_shared_memory_segment(tmp_path):
    status, segments = _mpirun(tmp_path, timeout_s=120, stop_when_up=True)
    assert status == "stopped"
    assert len(segments) == 2, (tmp_path / "run" / "stderr.txt").read_text()
    assert all(_private(p) for p in segments), segments  # not /dev/shm/vader_segment.*
    assert [p for p in segments if os.path.exists(p)] == []
    assert not Path(segments[0]).parent.exists()


@needs_mpi
def test_a_killed_mpi_run_leaves_no_session_directory_of_its_launcher(tmp_path):
    """Field test: each of 5 real mpirun runs stopped this way left its Open MPI session
    directory (/tmp/ompi.<node>.<uid>/pid.<mpirun's pid>, its PMIx store: 8 MB apparent;
    90 such here, 731 MB); now 0 of 5."""
    status, _ = _mpirun(tmp_path, timeout_s=120, stop_when_up=True)
    assert status == "stopped"
    launcher = int((tmp_path / "launcher.0").read_text())
    assert shm.session_dirs([launcher], {})[0].parent.name == (
        f"ompi.{os.uname().nodename}.{os.getuid()}")
    assert not shm.session_dirs([launcher], {})[0].exists()


def test_only_a_gone_launchers_unused_session_directory_is_removed(tmp_path):
    env = {"TMPDIR": str(tmp_path)}
    alive = os.getpid()  # a live "launcher": its directory is its own
    gone = _gone_pid()
    mine, theirs = shm.session_dirs([alive, gone], env)
    for directory in (mine, theirs):
        (directory / "0").mkdir(parents=True)
        (directory / "contact.txt").write_text("x")
    assert shm.remove_sessions([alive, gone], env) == [theirs]
    assert mine.exists() and not theirs.exists()
    # a user's orte_tmpdir_base wins over TMPDIR
    assert shm.session_dirs([1], {"OMPI_MCA_orte_tmpdir_base": "/x", **env})[0] == Path(
        f"/x/ompi.{os.uname().nodename}.{os.getuid()}/pid.1")


def _gone_pid() -> int:
    """A pid no process has now (a child that has exited and been reaped)."""
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@needs_mpi
@pytest.mark.slow
def test_an_mpi_run_killed_by_its_timeout_leaves_no_shared_memory_segment(tmp_path):
    status, segments = _mpirun(tmp_path, timeout_s=8, stop_when_up=False)
    assert status == "timeout"
    assert len(segments) == 2, (tmp_path / "run" / "stderr.txt").read_text()
    assert all(_private(p) for p in segments), segments
    assert [p for p in segments if os.path.exists(p)] == []


def _report_env(tmp_path: Path, env: dict[str, str], **options: object) -> dict[str, str]:
    """Run a program that writes a file into the vader backing directory it was given and
    reports its environment; that environment."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    script = ("import json, os, sys\n"
              f"d = os.environ.get({VADER!r})\n"
              "if d: open(os.path.join(d, 'vader_segment.x.0'), 'w').write('x')\n"
              "json.dump(dict(os.environ), sys.stdout)\n")
    outcome = run_command([sys.executable, "-c", script], env=env, cwd=tmp_path, timeout_s=60,
                          stdout_path=run_dir / "stdout.txt",
                          stderr_path=run_dir / "stderr.txt", **options)  # type: ignore[arg-type]
    assert outcome.status == "ok", (run_dir / "stderr.txt").read_text()
    return json.loads((run_dir / "stdout.txt").read_text())


def test_the_runs_directory_is_gone_after_the_run(tmp_path):
    seen = _report_env(tmp_path, dict(os.environ))
    private = Path(seen[VADER])
    assert _private(str(private / "f"))
    for var in shm.VARIABLES:
        assert seen[var] == str(private)
    assert not private.exists()


def test_a_users_own_backing_directory_is_kept(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    seen = _report_env(tmp_path, {**os.environ, VADER: str(mine)})
    assert seen[VADER] == str(mine) and (mine / "vader_segment.x.0").exists()
    assert _private(seen["UCX_POSIX_DIR"] + "/f")  # the others still point to the run's own


def test_a_backing_directory_set_in_open_mpis_params_file_is_kept(tmp_path):
    home = tmp_path / "home"
    (home / ".openmpi").mkdir(parents=True)
    (home / ".openmpi" / "mca-params.conf").write_text(
        "# mine\nbtl_vader_backing_directory = /tmp\n")
    seen = _report_env(tmp_path, {**os.environ, "HOME": str(home), "UCX_POSIX_DIR": "/tmp"})
    assert VADER not in seen and seen["UCX_POSIX_DIR"] == "/tmp"
    assert _private(seen["OMPI_MCA_btl_sm_backing_directory"] + "/f")


def test_a_run_across_nodes_points_nothing_at_a_directory_only_this_node_has(
        tmp_path, monkeypatch):
    monkeypatch.setattr(step, "other_jobs", lambda hosts, job_id: set())
    script = f"import os; print(os.environ.get({VADER!r}, 'unset'))"
    for nodes, expect_private in ((2, False), (1, True)):
        run_dir = tmp_path / f"n{nodes}"
        run = RunRequest(f"n{nodes}", 0, run_dir, (sys.executable, "-c", script), {}, tmp_path,
                         60, needs=Needs(ranks=nodes, nodes=nodes))
        outcome = step.execute_run(run, hosts=["localhost", "localhost"], status_file=False)
        assert outcome.status == "ok", (run_dir / "stderr.txt").read_text()
        said = (run_dir / "stdout.txt").read_text().strip()
        assert _private(said + "/f") is expect_private, said


def _other_run_dir(processes: hygiene.StudyProcesses, name: str) -> Path:
    directory = shm.make(processes.token, name)
    assert directory is not None
    (directory / "vader_segment.other.0").write_text("in use")
    return directory


def test_a_concurrent_runs_directory_is_untouched(tmp_path):
    """Another study's run in flight (its file open), and a run of this study whose file a
    live process still holds: neither a run's cleanup nor the sweep removes them."""
    with hygiene.study_processes(tmp_path / "a") as a, \
            hygiene.study_processes(tmp_path / "b") as b:
        theirs = _other_run_dir(b, "r1")
        held = _other_run_dir(a, "r0")
        with open(theirs / "vader_segment.other.0") as f1, open(held / "vader_segment.other.0"):
            _report_env(tmp_path, dict(os.environ))  # a run of study a, cleaned up
            a.sweep()
            assert (theirs / "vader_segment.other.0").exists()
            assert (held / "vader_segment.other.0").exists()  # in use: kept
            f1.close()
            a.sweep()  # study a's sweep never looks at study b's directories
            assert (theirs / "vader_segment.other.0").exists()
        a.sweep()  # nothing uses it now: what a killed controller left is swept
        assert not held.exists()
        shm.remove(theirs)
        assert not theirs.exists()


def test_a_directory_in_use_is_not_removed(tmp_path):
    directory = shm.make("testtoken", f"{os.getpid()}")
    assert directory is not None
    try:
        segment = directory / "vader_segment.x.0"
        segment.write_bytes(b"\0" * 4096)
        import mmap

        with open(segment, "r+b") as f:
            mapped = mmap.mmap(f.fileno(), 4096)
        try:
            assert shm.remove(directory) is False and segment.exists()  # mapped, fd closed
        finally:
            mapped.close()
        assert shm.remove(directory) is True and not directory.exists()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
