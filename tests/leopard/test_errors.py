"""Every bad input of the issue gives one line naming the file and the problem."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyBigWig
import pytest
import torch

from tunelab.errors import TunelabError
from tunelab.leopard.data import load_chromosomes, load_manifest
from tunelab.leopard.errors import LeopardError
from tunelab.leopard.model import Architecture, LeopardUNet
from tunelab.leopard.train import TrainConfig, load_checkpoint, train
from tunelab.leopard.windows import extract_windows, load_windows


def _copy(synth: Path, tmp_path: Path) -> Path:
    d = tmp_path / "data"
    shutil.copytree(synth.parent, d)
    return d


def _load(d: Path) -> None:
    m = load_manifest(d)
    load_chromosomes(m, m.chromosomes("train") + m.chromosomes("val"))


def _fails(fn, *needles: str) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(LeopardError) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert isinstance(info.value, TunelabError)
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    return msg


def test_missing_fasta(synth: Path, tmp_path: Path) -> None:
    d = _copy(synth, tmp_path)
    (d / "genome.fa").unlink()
    _fails(lambda: _load(d), "genome.fa", "not found")


def test_fasta_without_header(synth: Path, tmp_path: Path) -> None:
    d = _copy(synth, tmp_path)
    (d / "genome.fa").write_text("ACGTACGT\nACGT\n")
    _fails(lambda: _load(d), "genome.fa", "not a FASTA file")


def test_fasta_with_ragged_lines(synth: Path, tmp_path: Path) -> None:
    d = _copy(synth, tmp_path)
    (d / "genome.fa.fai").unlink(missing_ok=True)
    (d / "genome.fa").write_text(">chr1\nACGTACGT\nACG\nACGTACGT\n")
    _fails(lambda: _load(d), "genome.fa", "malformed FASTA")


def test_missing_bigwig(synth: Path, tmp_path: Path) -> None:
    d = _copy(synth, tmp_path)
    (d / "dnase.bw").unlink()
    _fails(lambda: _load(d), "dnase.bw", "not found")


def test_malformed_bigwig(synth: Path, tmp_path: Path) -> None:
    d = _copy(synth, tmp_path)
    (d / "dnase.bw").write_text("chr1\t0\t10\t1.0\n")
    _fails(lambda: _load(d), "dnase.bw", "bigWig")


@pytest.mark.parametrize("keep", [0, 40, 3000, 20_000])
def test_truncated_or_empty_bigwig(synth: Path, tmp_path: Path, keep: int,
                                   capfd: pytest.CaptureFixture[str]) -> None:
    d = _copy(synth, tmp_path)
    data = (d / "dnase.bw").read_bytes()
    (d / "dnase.bw").write_bytes(data[:keep])
    msg = _fails(lambda: _load(d), "dnase.bw", "bigWig", f"{keep} bytes")
    if keep >= 64:
        assert "truncated bigWig (DNase): header field" in msg
    assert "bw is NULL" not in capfd.readouterr().err  # (libBigWig's own line: not reached)


def test_bigwig_without_values(synth: Path, tmp_path: Path) -> None:
    d = _copy(synth, tmp_path)
    bw = pyBigWig.open(str(d / "dnase.bw"), "w")
    bw.addHeader([(f"chr{i}", 16_000) for i in range(1, 5)])
    bw.close()  # a header and no entry: the values read as an empty array
    _fails(lambda: _load(d), "dnase.bw", "holds no values")


def test_stale_fasta_index_past_the_end(synth: Path, tmp_path: Path) -> None:
    d = _copy(synth, tmp_path)
    fai = d / "genome.fa.fai"
    if not fai.is_file():
        _load(d)
    lines = fai.read_text().splitlines()
    cols = lines[0].split("\t")
    cols[1] = "900000000000"
    fai.write_text("\n".join(["\t".join(cols), *lines[1:]]) + "\n")
    later = (d / "genome.fa").stat().st_mtime + 3600
    os.utime(fai, (later, later))  # newer than the FASTA: pyfaidx trusts it
    _fails(lambda: _load(d), "genome.fa.fai", "'chr1'", "900000000000", "past the end")


def test_genome_larger_than_the_memory_available(synth: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    real = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory",
                        lambda: real._replace(available=100_000))
    _fails(lambda: _load(synth.parent), "genome.fa", "GiB in memory", "available")


@pytest.mark.parametrize(("line", "problem"), [
    ("chr1\t100\n", "line 2: expected at least 3 columns"),
    ("chr1\tten\t20\n", "line 2: start/end 'ten', '20' are not integers"),
    ("chr1\t50\t40\n", "line 2: invalid interval 50-40"),
    ("chr1\t10\t99999\n", "line 2: end 99999 beyond the length"),
])
def test_malformed_bed(synth: Path, tmp_path: Path, line: str, problem: str) -> None:
    d = _copy(synth, tmp_path)
    (d / "labels.narrowPeak").write_text("chr1\t10\t20\n" + line)
    _fails(lambda: _load(d), "labels.narrowPeak", problem)


def test_bed_chromosome_names_do_not_match(synth: Path, tmp_path: Path) -> None:
    d = _copy(synth, tmp_path)
    (d / "labels.narrowPeak").write_text("1\t10\t20\n2\t30\t40\n")
    _fails(lambda: _load(d), "labels.narrowPeak", "no chromosome name matches the FASTA")


def test_bigwig_chromosome_names_do_not_match(synth: Path, tmp_path: Path) -> None:
    d = _copy(synth, tmp_path)
    bw = pyBigWig.open(str(d / "dnase.bw"), "w")
    bw.addHeader([("1", 16_000), ("2", 16_000)])
    bw.addEntries("1", 0, values=np.ones(10), span=1, step=1)
    bw.close()
    _fails(lambda: _load(d), "dnase.bw", "'chr1' not in this bigWig")


def test_split_chromosome_not_in_fasta(synth: Path, tmp_path: Path) -> None:
    d = _copy(synth, tmp_path)
    man = json.loads((d / "leopard.json").read_text())
    man["split"]["val"] = ["chrX"]
    (d / "leopard.json").write_text(json.dumps(man))
    _fails(lambda: _load(d), "'chrX'", "not in genome.fa")


def test_nan_in_bigwig_signal(synth: Path, tmp_path: Path) -> None:
    d = _copy(synth, tmp_path)
    bw = pyBigWig.open(str(d / "dnase.bw"), "w")
    bw.addHeader([(f"chr{i}", 16_000) for i in range(1, 5)])
    vals = np.ones(16_000)
    vals[1234] = np.nan
    bw.addEntries("chr1", 0, values=vals, span=1, step=1)
    bw.close()
    _fails(lambda: _load(d), "dnase.bw", "NaN", "'chr1'")


def test_labels_without_a_bound_base_in_training(synth: Path, tmp_path: Path) -> None:
    d = _copy(synth, tmp_path)
    (d / "labels.narrowPeak").write_text("")
    _fails(lambda: train(TrainConfig(data=d, out=tmp_path / "o", window=512, batch_size=2,
                                     epochs=1, steps_per_epoch=1)),
           "labels.narrowPeak (chr1, chr2)", "no base is labelled bound (1) in the train data")


def test_every_base_ambiguous(synth: Path, tmp_path: Path) -> None:
    d = _copy(synth, tmp_path)
    (d / "ambiguous.bed").write_text("".join(f"chr{i}\t0\t16000\n" for i in range(1, 5)))
    _fails(lambda: train(TrainConfig(data=d, out=tmp_path / "o", window=512, batch_size=2,
                                     epochs=1, steps_per_epoch=1)),
           "labels.narrowPeak", "every base is labelled -1")


def test_npz_split_without_a_bound_base(windows: Path, tmp_path: Path) -> None:
    for split in ("train", "val", "test"):
        shutil.copy(windows / f"{split}.npz", tmp_path / f"{split}.npz")
    with np.load(windows / "test.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["label"][arrays["label"] == 1] = 0
    np.savez(tmp_path / "test.npz", **arrays)
    _fails(lambda: train(TrainConfig(data=tmp_path, out=tmp_path / "o", batch_size=2,
                                     epochs=1, steps_per_epoch=1)),
           "test.npz", "no base is labelled bound (1) in the test data")


def test_evaluated_windows_without_a_bound_base(synth: Path) -> None:
    from tunelab.leopard.windows import WindowSource

    m = load_manifest(synth)
    src = WindowSource(load_chromosomes(m, m.chromosomes("val")), None, 512, "val source")
    starts = np.arange(0, 16_000 - 512, 512)
    empty = [s for s in starts if not (src.get(np.asarray([s])).label == 1).any()]
    src.check_labels("val", starts)  # the tiling holds bound bases
    _fails(lambda: src.check_labels("val", np.asarray(empty[:3])),
           "val source", "the 3 val windows evaluated hold no bound base", "--max-eval-windows")


def test_split_of_only_n_bases(synth: Path, tmp_path: Path) -> None:
    d = _copy(synth, tmp_path)
    (d / "genome.fa.fai").unlink(missing_ok=True)
    lines = (d / "genome.fa").read_text().splitlines()
    (d / "genome.fa").write_text("\n".join(ln if ln.startswith(">") else "N" * len(ln)
                                           for ln in lines) + "\n")
    _fails(lambda: _load(d), "genome.fa", "chromosomes chr1, chr2, chr3", "no A, C, G or T")


def test_nan_in_npz_signal(windows: Path, tmp_path: Path) -> None:
    with np.load(windows / "train.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["dnase"][0, 5] = np.nan
    np.savez(tmp_path / "train.npz", **arrays)
    _fails(lambda: load_windows(tmp_path / "train.npz"), "train.npz", "NaN")


def test_window_not_divisible_by_32(synth: Path, tmp_path: Path) -> None:
    _fails(lambda: train(TrainConfig(data=synth, out=tmp_path / "o", window=1000,
                                     epochs=1)), "window length 1000", "divisible by 32")
    _fails(lambda: extract_windows(synth, tmp_path / "w", 1000, 4), "divisible by 32")


def test_batch_larger_than_data(windows: Path, tmp_path: Path) -> None:
    _fails(lambda: train(TrainConfig(data=windows, out=tmp_path / "o", batch_size=64,
                                     epochs=1)), "train.npz", "batch size 64",
           "larger than the 32 training windows")


def test_checkpoint_of_another_architecture(tmp_path: Path) -> None:
    ck = tmp_path / "six.pt"
    torch.save({"arch": Architecture(in_channels=6).to_dict(),
                "model": LeopardUNet(in_channels=6).state_dict()}, ck)
    _fails(lambda: load_checkpoint(ck, Architecture(in_channels=5)), "six.pt",
           "different architecture", "in_channels=6 (wanted 5)")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    _fails(lambda: load_checkpoint(junk), "junk.pt", "not a readable checkpoint")


def test_resume_from_another_architecture(windows: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    torch.save({"arch": Architecture(in_channels=6).to_dict(), "model": {}},
               out / "last.pt")
    _fails(lambda: train(TrainConfig(data=windows, out=out, batch_size=4, epochs=1,
                                     resume=True)), "last.pt", "different architecture")


def test_cli_prints_one_line_and_exits_2(synth: Path, tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "tunelab.leopard", "train", "--data", str(synth),
                        "--out", str(tmp_path / "o"), "--window", "1000"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: window length 1000")
