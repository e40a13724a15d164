"""Real pw.x runs under real mpirun, built by the workload and parsed back (slow)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tunelab.errors import ParseError
from tunelab.workload import RunContext
from tunelab.workloads.qe import QEOptions, QEWorkload

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
needs_pw = pytest.mark.skipif(
    shutil.which("pw.x") is None or shutil.which("mpirun") is None,
    reason="pw.x (quantum-espresso) and mpirun (openmpi-bin) are needed",
)

pytestmark = [pytest.mark.slow, needs_pw]


@pytest.fixture(scope="module")
def workload() -> QEWorkload:
    wl = QEWorkload(QEOptions(input="qe/si.in", oversubscribe=True), EXAMPLES / "qe-si.yaml")
    wl.check()
    return wl


def _run(wl: QEWorkload, run_dir: Path, values: dict[str, Any]
         ) -> tuple[subprocess.CompletedProcess[str], RunContext]:
    run_dir.mkdir()
    ctx = RunContext(values, {}, run_dir, run_dir.parent, EXAMPLES / "qe-si.yaml",
                     os.cpu_count() or 1)
    cmd = wl.command(ctx)
    proc = subprocess.run(
        list(cmd.argv), cwd=cmd.cwd, env={**os.environ, **cmd.env}, capture_output=True,
        text=True, timeout=120, stdin=subprocess.DEVNULL, check=False,
    )
    return proc, ctx


def test_serial_run_figures_match_the_output(workload: QEWorkload, tmp_path: Path) -> None:
    proc, ctx = _run(workload, tmp_path / "np1", {"np": 1, "npool": 1, "ndiag": 1})
    assert proc.returncode == 0, proc.stderr[-2000:]
    foms = workload.parse(proc.stdout, proc.stderr, ctx.run_dir)
    text = proc.stdout
    total = re.search(r"PWSCF\s*:\s*(\S+)s CPU\s+(\S+)s WALL", text)
    assert total is not None
    assert foms["pwscf_cpu_s"] == float(total.group(1))
    assert foms["pwscf_wall_s"] == float(total.group(2))
    assert foms["total_energy_ry"] == float(re.findall(r"!\s+total energy\s+=\s+(\S+)", text)[-1])
    assert foms["scf_iterations"] == float(re.findall(r"achieved in\s+(\d+)", text)[-1])
    timers = re.findall(r"^\s+(\S+)\s*:\s+(\S+)s CPU\s+(\S+)s WALL \(\s*(\d+) calls\)", text, re.M)
    assert timers
    for name, _cpu, wall, calls in timers:
        assert foms[f"timer.{name}.wall_s"] == float(wall)
        assert foms[f"timer.{name}.calls"] == float(calls)
    assert (foms["par_mpi_procs"], foms["par_pools"], foms["par_ndiag"]) == (1.0, 1.0, 1.0)
    # The run used its own scratch and pseudopotential copies.
    assert (ctx.run_dir / "out" / "si.save").is_dir()
    assert (ctx.run_dir / "pseudo" / "Si.pz-vbc.UPF").is_file()
    assert not (EXAMPLES / "qe" / "tmp").exists()


def test_total_energy_is_the_same_with_pools(workload: QEWorkload, tmp_path: Path) -> None:
    energies = {}
    for values in ({"np": 1, "npool": 1}, {"np": 2, "npool": 2, "ndiag": 1}):
        name = "_".join(f"{k}{v}" for k, v in values.items())
        proc, ctx = _run(workload, tmp_path / name, values)
        assert proc.returncode == 0, proc.stderr[-2000:]
        foms = workload.parse(proc.stdout, proc.stderr, ctx.run_dir)
        assert foms["par_pools"] == float(values["npool"])
        assert foms["par_mpi_procs"] == float(values["np"])
        energies[name] = foms["total_energy_ry"]
    first, second = energies.values()
    assert abs(first - second) <= workload.invariants()["total_energy_ry"]


def test_oversubscribed_ndiag_group_is_really_used(workload: QEWorkload, tmp_path: Path) -> None:
    proc, ctx = _run(workload, tmp_path / "np4", {"np": 4, "npool": 1, "ndiag": 4})
    assert proc.returncode == 0, proc.stderr[-2000:]
    foms = workload.parse(proc.stdout, proc.stderr, ctx.run_dir)
    assert (foms["par_mpi_procs"], foms["par_ndiag"]) == (4.0, 4.0)


def test_impossible_pools_fail_with_pw_message(workload: QEWorkload, tmp_path: Path) -> None:
    proc, ctx = _run(workload, tmp_path / "bad", {"np": 2, "npool": 3, "ndiag": 1})
    assert proc.returncode != 0
    assert (ctx.run_dir / "CRASH").is_file()
    with pytest.raises(ParseError, match=r"mp_start_pools \(1\): invalid number of pools"):
        workload.parse(proc.stdout, proc.stderr, ctx.run_dir)
