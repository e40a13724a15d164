"""Real multi-step pw.x studies through the CLI: scf -> nscf, an md restart, a preparation
that fails, and an input pw.x rejects (slow: real pw.x under real mpirun)."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
CORPUS = Path(__file__).parent / "corpus"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("pw.x") is None or shutil.which("mpirun") is None,
                       reason="pw.x (quantum-espresso) and mpirun (openmpi-bin) are needed"),
]


def _cli(tmp_path: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    # waiting MPI ranks give their core away: the machine is shared with other tests
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "OMPI_MCA_mpi_yield_when_idle": "1"}
    return subprocess.run([sys.executable, "-m", "tunelab", *map(str, args)],
                          capture_output=True, text=True, timeout=600, env=env)


def _study(tmp_path: Path, options: str, parameters: str = "{np: [1, 2], npool: [1, 2]}",
           repeats: int = 1) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(f"name: wf\nworkload:\n  name: qe\n  options:\n{options}"
                    f"parameters: {parameters}\nrepeats: {repeats}\ntimeout: 300\n")
    return path


def _runs(study_dir: Path) -> list[dict[str, object]]:
    conn = sqlite3.connect(study_dir / "tunelab.db")
    conn.row_factory = sqlite3.Row
    rows = [dict(r) for r in conn.execute("SELECT * FROM runs ORDER BY id")]
    for row in rows:
        row["foms"] = dict(conn.execute("SELECT name, value FROM foms WHERE run_id = ?",
                                        (row["id"],)).fetchall())
    conn.close()
    return rows


def _own_wall(stdout: str) -> float:
    m = re.findall(r"PWSCF\s*:.*CPU\s+([\d.]+)s WALL", stdout)
    return float(m[-1])


def test_scf_then_nscf_times_only_the_nscf(tmp_path: Path) -> None:
    study = _study(tmp_path, f"    input: {EXAMPLES / 'qe' / 'si-nscf.in'}\n"
                             f"    prepare: [{{input: {EXAMPLES / 'qe' / 'si-scf.in'}}}]\n"
                             "    keep_outdir: true\n")  # to look at each run's copy
    d = tmp_path / "d"
    res = _cli(tmp_path, "run", study, "--dir", d, "-q")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "3 runs now" in res.stderr and "(3 ok)" in res.stderr
    prepared = list((d / "prepare").iterdir())
    assert len(prepared) == 1 and (prepared[0] / "done").is_file()
    scf = (prepared[0] / "step1.out").read_text()
    assert "convergence has been achieved" in scf and not (prepared[0] / "step2.out").exists()
    for run in _runs(d):
        run_dir = d / str(run["run_dir"])
        out = (run_dir / "stdout.txt").read_text()
        assert "Band Structure Calculation" in out  # the nscf, not the scf
        foms = run["foms"]
        assert isinstance(foms, dict)
        assert foms["pwscf_wall_s"] == _own_wall(out)  # only the tuned step is timed
        assert foms["kpoints"] == 16  # 6x6x6 grid, as the rules computed before the run
        assert (run_dir / "out" / "si.save" / "charge-density.dat").is_file()
    space = _cli(tmp_path, "space", study)
    assert "qe: k-points (nk): 16, counted by pw.x" in space.stdout, space.stdout
    assert "on the prepared data" in space.stdout and "estimate" not in space.stdout


def test_md_restart_continues_from_prepared_data_per_point(tmp_path: Path) -> None:
    study = _study(tmp_path, f"    input: {EXAMPLES / 'qe' / 'si-md-restart.in'}\n"
                             f"    prepare: [{{input: {EXAMPLES / 'qe' / 'si-md.in'}, "
                             "per_point: true}]\n", "{np: [1, 2]}")
    d = tmp_path / "d"
    res = _cli(tmp_path, "run", study, "--dir", d, "-q")
    assert res.returncode == 0, res.stdout + res.stderr
    (prepared,) = list((d / "prepare").iterdir())
    per_point = [p for p in prepared.iterdir() if p.is_dir()]
    assert len(per_point) == 2 and all((p / "done").is_file() for p in per_point)
    energies = set()
    for run in _runs(d):
        out = (d / str(run["run_dir"]) / "stdout.txt").read_text()
        steps = re.findall(r"Entering Dynamics:\s+iteration =\s+(\d+)", out)
        assert steps[0] == "5" and steps[-1] == "12"  # continued, not started again
        foms = run["foms"]
        assert isinstance(foms, dict)
        energies.add(foms["total_energy_ry"])
        assert run["status"] == "ok"
    assert len(energies) == 1


def test_a_failing_preparation_is_run_once_and_stops_the_study(tmp_path: Path) -> None:
    study = _study(tmp_path, f"    input: {EXAMPLES / 'qe' / 'si-nscf.in'}\n"
                             f"    prepare: [{{input: {CORPUS / 'si-bad-namelist.in'}}}]\n",
                   repeats=3)
    # the broken step writes prefix 'sibad'; the nscf reads 'si': refused before any run
    res = _cli(tmp_path, "run", study, "--dir", tmp_path / "d", "-q")
    assert res.returncode == 2 and "write prefix 'sibad'" in res.stderr
    bad = tmp_path / "bad-scf.in"
    bad.write_text((CORPUS / "si-bad-namelist.in").read_text().replace("'sibad'", "'si'"))
    study = _study(tmp_path, f"    input: {EXAMPLES / 'qe' / 'si-nscf.in'}\n"
                             f"    prepare: [{{input: {bad}}}]\n", repeats=3)
    res = _cli(tmp_path, "run", study, "--dir", tmp_path / "d2", "-q")
    assert res.returncode == 1, res.stderr
    assert "stopped early: the first run of each of the 3 points failed the same way" in \
        res.stderr
    runs = _runs(tmp_path / "d2")
    assert len(runs) == 3 and {r["status"] for r in runs} == {"failed"}
    assert all("preparation step 1 (bad-scf.in) failed" in str(r["reason"]) for r in runs)
    (prepared,) = list((tmp_path / "d2" / "prepare").iterdir())
    assert (prepared / "failed.txt").is_file() and len(list(prepared.glob("step*.out"))) == 1


def test_an_input_pw_rejects_stops_after_one_run_per_point_and_still_reports(
    tmp_path: Path
) -> None:
    study = _study(tmp_path, f"    input: {CORPUS / 'si-bad-namelist.in'}\n", repeats=3)
    d = tmp_path / "d"
    res = _cli(tmp_path, "run", study, "--dir", d, "-q")
    assert res.returncode == 1, res.stderr
    text = res.stderr
    assert "stopped early" in text and "read_namelists (1): bad line in namelist &system" in text
    assert "3 runs now" in text and "Traceback" not in res.stderr
    assert len(_runs(d)) == 3  # one per point, not 3 points x 3 repeats
    report = _cli(tmp_path, "report", d)
    assert "Traceback" not in report.stderr and "no figure of merit" not in report.stderr
    html = (d / "report.html").read_text()
    assert "Runs that were not ok (3)" in html and "read_namelists (1)" in html
    compare = _cli(tmp_path, "compare", d)
    assert "no figure of merit" not in compare.stderr and "3 failed" not in compare.stderr
    assert "1 failed" in compare.stdout and compare.returncode == 1
    best = _cli(tmp_path, "best", d)
    assert "no figure of merit" not in best.stderr and "Traceback" not in best.stderr
    assert best.returncode != 0
