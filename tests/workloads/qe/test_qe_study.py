"""The qe workload through the whole engine: study, store, report plots, job script."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.conftest import tunelab

EXAMPLE = Path(__file__).parents[3] / "examples" / "qe-si.yaml"


@pytest.mark.slow
def test_si_study_runs_reports_and_writes_a_job_script(tmp_path):
    d = tmp_path / "study"
    res = tunelab("run", EXAMPLE, "--dir", d, "--repeats", "2", "-q")
    assert res.returncode == 0, res.stderr
    assert "14 runs now" in res.stderr and "(14 ok)" in res.stderr
    assert "baseline" in res.stdout
    rep = tunelab("report", d)
    assert rep.returncode == 0, rep.stderr
    for png in ("qe_wall_vs_np.png", "qe_timers.png", "report-speedup.png"):
        data = (d / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    html = (d / "report.html").read_text()
    assert "pwscf_wall_s" in html and "data:image/png;base64," in html
    script = tunelab("script", d, "--scheduler", "pbs", "--project", "jx00")
    assert script.returncode == 0, script.stderr
    lines = script.stdout.splitlines()
    assert lines[0] == "#!/bin/bash" and "#PBS -P jx00" in lines
    launch = [ln for ln in lines if "pw.x" in ln]
    assert len(launch) == 1 and launch[0].startswith("mpirun -np ") and "-inp si.in" in launch[0]
    assert "the script expects beside it: pseudo/Si.pz-vbc.UPF, si.in" in script.stderr
    written = tunelab("script", d, "--scheduler", "slurm", "-o", tmp_path / "job" / "qe.sh")
    assert written.returncode == 0, written.stderr
    staged = (tmp_path / "job" / "si.in").read_text()
    assert "./pseudo/" in staged and str(tmp_path) not in staged  # travels to another machine
    assert list((tmp_path / "job" / "pseudo").glob("*.UPF"))
    assert "-inp si.in" in (tmp_path / "job" / "qe.sh").read_text()
    best = tunelab("best", d)
    assert best.returncode == 0
    np_best = launch[0].split()[2]
    assert f"np={np_best}" in best.stdout.replace("\n", " ")


@pytest.mark.parametrize(("seeds", "fragment"), [
    (["simd.md"], "reads the directory simd.save from outdir, but the seed files (simd.md)"),
    (["old-out"], "reads the directory simd.save from outdir, but the seed files (old-out)"),
])
def test_an_md_restart_without_its_save_directory_is_refused_alike_everywhere(tmp_path, seeds,
                                                                               fragment):
    """space, --dry-run and run refuse the same input: a restart whose seeds lack prefix.save
    (here: the .md file alone, or a directory that holds simd.save one level down) used to pass
    the first two and fail every run at 0.00 s."""
    restart = Path(__file__).parents[3] / "examples" / "qe" / "si-md-restart.in"
    (tmp_path / "si-md-restart.in").write_text(restart.read_text())
    (tmp_path / "simd.md").write_text("md history\n")
    (tmp_path / "old-out" / "simd.save").mkdir(parents=True)
    (tmp_path / "s.yaml").write_text(
        "name: md\nworkload:\n  name: qe\n  options:\n    input: si-md-restart.in\n"
        f"    seed: {seeds}\n    oversubscribe: true\nparameters: {{np: [1], npool: [1]}}\n"
        "repeats: 1\n")
    errors = set()
    for command in (["space"], ["run", "--dry-run"], ["run", "--dir", "d"]):
        res = tunelab(*command, "s.yaml", cwd=tmp_path)
        assert res.returncode == 2, (command, res.stderr)
        assert fragment in res.stderr and "s.yaml:4:" in res.stderr, res.stderr
        errors.add(res.stderr)
    assert len(errors) == 1  # one and the same line
    assert not (tmp_path / "d" / "runs").exists() or not any((tmp_path / "d" / "runs").iterdir())
    (tmp_path / "simd.save").mkdir()
    (tmp_path / "s.yaml").write_text((tmp_path / "s.yaml").read_text().replace(
        str(seeds), "[simd.md, simd.save]"))
    assert tunelab("space", "s.yaml", cwd=tmp_path).returncode == 0
