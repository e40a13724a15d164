"""The typer app in-process: commands listed, synth -> extract on real files."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from tunelab.leopard.cli import app

runner = CliRunner()


def test_help_lists_the_commands() -> None:
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0
    for cmd in ("synth", "extract", "train", "predict"):
        assert cmd in r.output


def test_synth_then_extract(tmp_path: Path) -> None:
    r = runner.invoke(app, ["synth", str(tmp_path / "g"), "--n-chroms", "3",
                            "--chrom-length", "8000", "--site-spacing", "1000"])
    assert r.exit_code == 0, r.output
    assert Path(r.output.strip()) == tmp_path / "g" / "leopard.json"
    names = {p.name for p in (tmp_path / "g").iterdir()}
    assert {"genome.fa", "dnase.bw", "dnase_avg.bw", "labels.narrowPeak",
            "ambiguous.bed", "leopard.json"} <= names
    r = runner.invoke(app, ["extract", str(tmp_path / "g"), str(tmp_path / "w"),
                            "--window", "256", "--n-train", "10", "--max-eval", "5"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == {"train": 10, "val": 5, "test": 5}
    assert (tmp_path / "w" / "test.npz").is_file()
