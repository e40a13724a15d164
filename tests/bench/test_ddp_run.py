"""Real DDP runs (torchrun, gloo): 1 and 2 workers on one host through a study and the
scaling analysis, a worker killed mid-run, a rendezvous that never completes, 2 virtual
nodes with a link limit (root), and the refusal of virtual nodes without root."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import env_with_pythonpath

pytest.importorskip("torch")
if importlib.util.find_spec("torchvision") is None:  # importing it needs the shim in models
    pytest.skip("torchvision is not installed", allow_module_level=True)

PARAMS_RESNET18 = 11_689_512
PARAMS_LEOPARD = 474_017


def bench(*args: str, timeout: float = 300,
          cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    """The benchmark's CLI; on the CPU unless ``args`` name a device (these tests mean the
    CPU: on a CUDA machine ``--device auto`` would pick the GPU). It runs in ``cwd`` (by
    default the temporary directory: a failed run leaves its ddp-failure.log there)."""
    env = {k: v for k, v in env_with_pythonpath(Path(__file__).resolve().parents[2] / "src")
           .items() if k not in ("LOCAL_RANK", "WORLD_SIZE")}
    if "--device" not in args and not any(a in ("make-data", "calibrate") for a in args):
        args = (*args, "--device", "cpu")
    return subprocess.run([sys.executable, "-m", "tunelab.bench.ddp", *args],
                          capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=cwd or tempfile.gettempdir())


def fom(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["benchmark"] == "ddp"
    return dict(record)


@pytest.mark.slow
def test_study_of_1_and_2_workers_and_its_scaling_figures(tmp_path: Path) -> None:
    from tunelab.execute.runner import run_study
    from tunelab.execute.study import prepare_study
    from tunelab.scaling import observations, scaling_table
    from tunelab.spec import load_study
    from tunelab.store import open_store

    study = tmp_path / "s.yaml"
    study.write_text(textwrap.dedent("""\
        name: ddp-small
        workload:
          name: ddp
          options: {model: resnet18, image_size: 32, steps: 3, warmup: 1, device: cpu}
        parameters:
          workers: [1, 2]
        derived:
          batch_size: 4 * workers
        repeats: 1
        baseline: {workers: 1}
        timeout: 5m
        """))
    outcome = run_study(prepare_study(load_study(study)), tmp_path / "run")
    assert outcome.all_ok, outcome.counts
    with open_store(tmp_path / "run") as store:
        runs = store.runs_frame()
    for _, row in runs.iterrows():
        # fp32: 4 bytes per parameter; one worker all-reduces nothing
        assert row["fom.grad_bytes"] == (4 * PARAMS_RESNET18 if row["workers"] > 1 else 0)
        assert row["fom.params"] == PARAMS_RESNET18
        assert row["fom.local_batch"] == 4
        assert row["fom.throughput"] > 0 and row["fom.compute_s"] > 0
        assert row["fom.compute_emulated"] == 0.0
        assert row["fom.step_s"] >= row["fom.compute_s"]
    two = runs[runs["workers"] == 2].iloc[0]
    assert two["fom.allreduce_s"] > 0 and two["fom.allreduce_busbw"] > 0
    assert two["fom.throughput"] == pytest.approx(8 * 3 / (3 * two["fom.step_s"]), rel=0.5)
    table = {p.workers: p for p in scaling_table(runs)}
    assert table[1].speedup == pytest.approx(1.0)
    assert table[2].speedup == pytest.approx(
        two["fom.throughput"] / runs[runs["workers"] == 1].iloc[0]["fom.throughput"])
    assert table[2].efficiency == pytest.approx(table[2].speedup / 2)
    assert [o.workers for o in observations(runs)] == [1, 2]


@pytest.mark.slow
def test_emulated_compute_with_allreduce_real_all_reduces_real_buffers() -> None:
    rec = fom(bench("--model", "resnet18", "-n", "2", "-b", "4", "--steps", "3",
                    "--warmup", "1", "--compute", "emulate:0.05", "--allreduce", "real"))
    assert rec["compute_emulated"] is True and rec["compute"] == "emulate:0.05"
    assert rec["grad_bytes"] == 4 * PARAMS_RESNET18
    assert rec["compute_s"] == pytest.approx(0.05, abs=0.04)
    assert rec["allreduce_s"] > 0
    assert rec["step_s"] >= rec["compute_s"] + rec["allreduce_s"] * 0.9
    assert rec["allreduce_busbw"] == pytest.approx(rec["allreduce_algbw"])  # 2(N-1)/N = 1
    assert rec["hosts"] == 1


@pytest.mark.slow
def test_killed_worker_fails_the_run_naming_it(tmp_path: Path) -> None:
    proc = bench("--model", "resnet18", "-n", "2", "-b", "2", "--steps", "4", "--warmup", "0",
                 "--compute", "emulate:0.05", "--timeout", "60",
                 "--inject-fault", "rank=1,step=1,action=kill", cwd=tmp_path)
    assert proc.returncode == 4
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ddp: worker 1 (node 0, pid ")
    log = tmp_path / "ddp-failure.log"
    assert last.endswith(f"in phase timed at step 1 died: killed by SIGKILL (full output in "
                         f"{log})"), last
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # no torchrun traceback
    assert "Traceback" in log.read_text()  # torchrun's report: in the run's log
    assert '"benchmark"' not in proc.stdout


@pytest.mark.slow
def test_sigterm_stops_the_workers_and_what_the_run_set_up(tmp_path: Path) -> None:
    """A study ends a run with SIGTERM. The launcher died at once and its workers — each in
    a session of its own under torchrun — went on training and reading; with --read-limit
    the cgroup stayed too (field test). Now every descendant is gone, the exit is 130 with
    one line, and the scratch directory is removed."""
    import signal
    import time

    import psutil

    env = {k: v for k, v in env_with_pythonpath(Path(__file__).resolve().parents[2] / "src")
           .items() if k not in ("LOCAL_RANK", "WORLD_SIZE")}
    env["TMPDIR"] = str(tmp_path)
    family: list[psutil.Process] = []
    proc = subprocess.Popen(
        [sys.executable, "-m", "tunelab.bench.ddp", "--model", "resnet18", "-n", "2", "-b", "4",
         "--steps", "1000", "--warmup", "0", "--compute", "emulate:0.05", "--data", "memory",
         "--loader-workers", "1", "--device", "cpu"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            family = psutil.Process(proc.pid).children(recursive=True)
            if len(family) >= 5:  # torchrun, 2 workers, a loader each
                break
            time.sleep(0.2)
        assert len(family) >= 5, family
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        gone, alive = psutil.wait_procs(family, timeout=10)
        assert not alive, alive
        assert proc.returncode == 130
        assert err.strip().splitlines() == [
            "ddp: interrupted; the workers were stopped and what the run set up removed"]
        assert not list(tmp_path.glob("tunelab-ddp-*"))
    finally:  # whatever outlived the launcher (reparented: no longer our children)
        for child in [*family, *psutil.Process().children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                child.kill()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux's setpriv")
def test_a_launcher_killed_outright_takes_torchrun_and_the_workers_with_it() -> None:
    """Field test: after ``kill -9`` of the launcher, torchrun and its two workers (each in
    a session of its own) trained on, reparented to init, for the rest of their steps."""
    import signal
    import time

    import psutil

    env = {k: v for k, v in env_with_pythonpath(Path(__file__).resolve().parents[2] / "src")
           .items() if k not in ("LOCAL_RANK", "WORLD_SIZE")}
    family: list[psutil.Process] = []
    proc = subprocess.Popen(
        [sys.executable, "-m", "tunelab.bench.ddp", "--model", "leopard", "--window", "256",
         "-n", "2", "-b", "4", "--steps", "100000", "--warmup", "0", "--device", "cpu"],
        env=env, cwd=tempfile.gettempdir(), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            family = psutil.Process(proc.pid).children(recursive=True)
            if len(family) >= 3:  # (setpriv exec'd into) torchrun, 2 workers
                break
            time.sleep(0.2)
        assert len(family) >= 3, family
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        _, alive = psutil.wait_procs(family, timeout=45)  # torchrun's own grace is 30 s
        assert not alive, alive
    finally:
        for child in family:
            with contextlib.suppress(psutil.Error):
                child.kill()


@pytest.mark.slow
def test_rendezvous_that_never_completes_names_the_missing_ranks() -> None:
    proc = bench("--model", "resnet18", "-n", "2", "--nodes", "2", "-b", "2", "--steps", "1",
                 "--rendezvous-timeout", "4", "--inject-fault", "node=1,action=absent",
                 timeout=120)
    assert proc.returncode == 4
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ddp: rendezvous did not complete within 4 s: rank(s) 0, 1 never "
                           "joined"), last
    assert "node 1 ranks 1: its node was never started" in last


def _root() -> bool:
    return os.geteuid() == 0


@pytest.mark.slow
@pytest.mark.skipif(not _root(), reason="virtual nodes need root")
def test_two_virtual_nodes_with_a_link_limit() -> None:
    from tunelab.cluster.vnodes import STATE_ROOT, tbf_burst_bytes, unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    rec = fom(bench("--model", "leopard", "--window", "256", "-n", "2", "--nodes", "2",
                    "-b", "4", "--steps", "3", "--warmup", "1", "--placement", "vnodes",
                    "--link-gbit", "1"))
    assert (rec["nodes"], rec["workers_per_node"], rec["placement"]) == (2, 1, "vnodes")
    assert rec["grad_bytes"] == 4 * PARAMS_LEOPARD
    assert rec["unit"] == "windows" and rec["windows_per_s"] == rec["throughput"] > 0
    assert rec["hosts"] == 1  # virtual nodes share this machine
    # cannot beat the 1 Gbit/s link, less the token bucket refilled while the step computed:
    # each worker's link carries grad_bytes * 2(N-1)/N = grad_bytes bytes at N = 2
    rate, link_bytes = 1e9 / 8, rec["grad_bytes"]
    fastest = link_bytes / ((link_bytes - tbf_burst_bytes(10**9)) / rate)
    assert rec["allreduce_busbw"] < 1.1 * fastest
    # its namespaces are gone: every set left belongs to a live process (another run)
    for state in STATE_ROOT.glob("ddp*/state.json"):
        try:
            owner = json.loads(state.read_text()).get("owner_pid")
        except FileNotFoundError:  # another run's set, just removed
            continue
        assert owner is not None and Path(f"/proc/{owner}").exists(), state


@pytest.mark.slow
@pytest.mark.skipif(not _root() or shutil.which("setpriv") is None,
                    reason="needs root to drop to an unprivileged user")
def test_virtual_nodes_without_root_are_refused_in_one_line() -> None:
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable]
    # a checkout in a private directory (mktemp -d is 0700) cannot be imported by nobody
    probe = subprocess.run([*nobody, "-c", "import tunelab.bench.ddp"], capture_output=True,
                           text=True, timeout=120, env={**os.environ, "HOME": "/tmp"})
    if probe.returncode != 0:
        pytest.skip(f"cannot import tunelab as nobody here: {probe.stderr.strip()[-200:]}")
    proc = subprocess.run(
        [*nobody, "-m", "tunelab.bench.ddp", "--model", "leopard", "-n", "2", "--nodes", "2",
         "-b", "2", "--placement", "vnodes"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": "/tmp"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "ddp: error: --placement vnodes: virtual nodes need root (network namespaces, veth "
        "pairs, a bridge)")
