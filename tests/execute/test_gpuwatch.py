"""Another process computing on a run's GPU makes the run disturbed: the GPU neighbour watch
with its reading injected (real processes of this machine stand for the GPUs' processes),
and a whole study run through a stand-in ``nvidia-smi`` on PATH (no GPU here; the real
one is read by the same code on the GPU machine)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from tests.conftest import PY, tunelab
from tunelab.execute.gpuwatch import GpuProcess, GpuWatch, compute_apps
from tunelab.store import open_store

A, B = "GPU-aaaa", "GPU-bbbb"
NAMES = {A: "0", B: "1"}


@pytest.fixture
def own_pid():
    """A live process that descends from this one (a run's process)."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc.pid
    proc.kill()
    proc.wait()


def watch_of(*apps: GpuProcess) -> GpuWatch:
    return GpuWatch(lambda: list(apps), every_s=3600, names=NAMES)


def test_another_process_on_the_runs_gpu_is_named(own_pid):
    run = watch_of(GpuProcess(A, own_pid, "python"), GpuProcess(A, 1, "/usr/bin/train")).start()
    assert run.stop() == "another process computed on its GPU: pid 1 (train) on GPU 0"


@pytest.mark.parametrize("apps", [
    [GpuProcess(A, 0, "x"), GpuProcess(B, 1, "train")],  # another GPU than the run's
    [GpuProcess(B, 1, "train")],  # the run used no GPU
    [GpuProcess(A, 0, "x"), GpuProcess(A, 2**22 + 1, "train")],  # not in /proc: unknown
], ids=["other-gpu", "run-without-gpu", "other-namespace"])
def test_no_neighbour_on_the_runs_gpus_is_no_flag(own_pid, apps):
    apps = [GpuProcess(a.gpu, own_pid if a.pid == 0 else a.pid, a.name) for a in apps]
    assert watch_of(*apps).start().stop() is None


def test_nothing_readable_is_no_flag():
    assert GpuWatch(lambda: None, every_s=3600, names={}).start().stop() is None


def test_a_neighbour_seen_only_while_the_run_runs_counts(own_pid):
    """Read at the start, while the run runs and at its end: one that came and went between
    the start and the end is seen by the readings in between."""
    readings = iter([[GpuProcess(A, own_pid, "py")],
                     [GpuProcess(A, own_pid, "py"), GpuProcess(A, 1, "train")]])
    done = []

    def read():
        try:
            return next(readings)
        except StopIteration:
            done.append(True)
            return [GpuProcess(A, own_pid, "py")]

    run = GpuWatch(read, every_s=0.01, names=NAMES).start()
    while not done:
        pass  # the reading thread takes the second reading, then the third
    assert run.stop() == "another process computed on its GPU: pid 1 (train) on GPU 0"


FAKE_SMI = """#!{py}
import subprocess, sys
tag, other = {tag!r}, {other!r}
args = " ".join(sys.argv[1:])
def pids(pattern):
    res = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return res.stdout.split()
if "--query-compute-apps" in args:
    for pid in pids(tag):
        print(f"GPU-aaaa, {{pid}}, python3")
    for pid in pids(other):
        print(f"GPU-aaaa, {{pid}}, /opt/other/train")
elif "--query-gpu=uuid,index" in args:
    print("GPU-aaaa, 0")
else:
    print("Stand-in GPU, 999.0")
"""


@pytest.mark.parametrize("neighbour", [True, False])
def test_a_study_beside_another_gpu_process_has_its_runs_flagged(tmp_path, neighbour):
    tag, other = f"tlgpu{uuid.uuid4().hex[:8]}", f"tlother{uuid.uuid4().hex[:8]}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(py=sys.executable, tag=tag, other=other))
    smi.chmod(0o755)
    study = tmp_path / "s.yaml"
    code = "import time; time.sleep(3); print('v=1')"
    study.write_text(
        f"name: g\nworkload: {{name: command, options: {{argv: [{PY}, -c, {code!r}, {tag}], "
        "foms: {v: 'v=(?P<value>\\S+)'}}}\n"
        "parameters: {x: [1, 2]}\nrepeats: 1\nobjective: {fom: v}\n")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    hog = (subprocess.Popen([PY, "-c", f"import time; time.sleep(120)  # {other}"],
                            start_new_session=True) if neighbour else None)
    try:
        res = subprocess.run([PY, "-m", "tunelab", "run", str(study), "--dir",
                              str(tmp_path / "d"), "-q"], capture_output=True, text=True,
                             env=env, timeout=120)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    assert res.returncode == 0, res.stderr
    with open_store(tmp_path / "d") as store:
        frame = store.runs_frame()
    evidence = frame["noise.evidence"].fillna("").tolist()
    on_gpu = [f"another process computed on its GPU: pid {hog.pid} (train) on GPU 0" in e
              for e in evidence] if hog is not None else ["on its GPU" in e for e in evidence]
    assert on_gpu == [neighbour, neighbour], evidence
    if neighbour:
        assert (frame["noise.disturbed"] == 1).all()
        compare = tunelab("compare", tmp_path / "d")
        assert "disturbed" in compare.stdout + compare.stderr


def _cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count())


HOLD_CUDA = ("import sys, time, torch; x = torch.ones(1, device='cuda'); "
             "print('ready', flush=True); time.sleep(float(sys.argv[1]))")


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.skipif(_cuda_devices() == 0, reason="needs a CUDA device")
def test_cuda_a_run_beside_another_process_on_its_gpu_is_flagged(tmp_path):
    """The real ``nvidia-smi`` on a GPU machine: a study whose run holds a CUDA context,
    beside another process holding one on the same GPU (the GPU check runs it)."""
    neighbour = subprocess.Popen([PY, "-c", HOLD_CUDA, "120"], stdout=subprocess.PIPE,
                                 text=True, start_new_session=True)
    try:
        assert neighbour.stdout is not None and neighbour.stdout.readline().strip() == "ready"
        listed = subprocess.run(["nvidia-smi", "--query-compute-apps=pid",
                                 "--format=csv,noheader"], capture_output=True, text=True)
        if str(neighbour.pid) not in listed.stdout.split():
            pytest.skip("nvidia-smi does not list this machine's processes (another PID "
                        f"namespace): it listed {listed.stdout.split()}")
        code = HOLD_CUDA.replace("print('ready', flush=True)", "print('v=1')")
        study = tmp_path / "s.yaml"
        study.write_text(
            f"name: g\nworkload: {{name: command, options: {{argv: [{PY}, -c, {code!r}, '4'], "
            "foms: {v: 'v=(?P<value>\\S+)'}}}\nparameters: {x: [1]}\nrepeats: 1\n"
            "objective: {fom: v}\n")
        res = tunelab("run", study, "--dir", tmp_path / "d", "-q")
    finally:
        neighbour.kill()
        neighbour.wait()
    assert res.returncode == 0, res.stderr
    with open_store(tmp_path / "d") as store:
        evidence = str(store.runs_frame()["noise.evidence"].iloc[0])
    print(evidence)
    assert f"another process computed on its GPU: pid {neighbour.pid} (python" in evidence


def test_a_batch_jobs_task_is_its_own_by_the_jobs_id_in_its_environment():
    """Under ``srun`` a run's tasks are children of ``slurmstepd``, not of the step: the
    job's id in their environment makes them the run's, not neighbours of it."""
    stranger = subprocess.Popen(["sleep", "60"])  # a root the tasks do not descend from
    task = subprocess.Popen(["sleep", "60"], env={**os.environ, "SLURM_JOB_ID": "4242"})
    other = subprocess.Popen(["sleep", "60"], env={**os.environ, "SLURM_JOB_ID": "4243"})
    try:
        def watch(own_env):
            return GpuWatch(lambda: [GpuProcess(A, task.pid, "python"),
                                     GpuProcess(A, other.pid, "python")],
                            root=stranger.pid, own_env=own_env, every_s=3600, names=NAMES)
        assert watch(b"\0SLURM_JOB_ID=4242\0").start().stop() == (
            f"another process computed on its GPU: pid {other.pid} (python) on GPU 0")
        assert watch(None).start().stop() is None  # no process of the run seen: no judgement
    finally:
        for proc in (stranger, task, other):
            proc.kill()
            proc.wait()


def test_the_rows_nvidia_smi_lists_are_read_and_the_mps_server_left_out(tmp_path, monkeypatch):
    """CUDA MPS's server holds its clients' contexts and is listed beside them: it is no
    neighbour (every run would be flagged on a machine that runs MPS)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '%s\\n' 'GPU-aaaa, 101, /usr/bin/nvidia-cuda-mps-server' "
                   "'GPU-aaaa, 102, python3' 'GPU-aaaa, [N/A], python3' 'GPU-bbbb, 10'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert compute_apps() == [GpuProcess("GPU-aaaa", 102, "python3")]
