"""The machine snapshot's tool version probes: they leave the user's cwd as it was."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tunelab.sysinfo import snapshot


def test_a_probe_that_writes_files_leaves_the_cwd_clean(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe that reads stdin and drops files (as a bare pw.x does) writes them elsewhere."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    probe = [sys.executable, "-c",
             "import sys; data = sys.stdin.read(); open('CRASH', 'w').write('x'); "
             "print('probe 1.0', len(data))"]
    snap = snapshot({"probe": probe})
    assert snap["tools"]["probe"] == "probe 1.0 0"
    assert list(cwd.iterdir()) == []


@pytest.mark.skipif(shutil.which("pw.x") is None, reason="pw.x (quantum-espresso) is needed")
def test_the_pw_x_banner_probe_leaves_no_crash_file(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The qe workload's probe (pw.x with no input) writes CRASH and input_tmp.in where it runs."""
    monkeypatch.chdir(tmp_path)
    snap = snapshot({"pw.x": ["pw.x"]})
    assert "PWSCF" in snap["tools"]["pw.x"]
    assert list(tmp_path.iterdir()) == []


AVX512 = "flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw avx512_bf16 xsave\n"
AVX2 = "flags\t\t: fpu sse4_2 avx avx2 fma xsave\n"


def test_machines_of_one_model_with_other_vector_units_have_other_fingerprints() -> None:
    """Two 'AMD EPYC' VMs of one host name, cores and memory, one with AVX-512 BF16 and one
    with AVX2 only, shared one fingerprint: bounds measured on one (bf16 GEMM 253 GFLOP/s)
    judged runs on the other, where bf16 runs 40x slower. The instruction sets are now part
    of the machine's identity; a snapshot without them keeps its old fingerprint."""
    import hashlib
    import json

    from tunelab.sysinfo import cpu_isa, fingerprint, isa_summary, machine_identity

    assert cpu_isa(AVX512) == ["avx", "avx2", "avx512_bf16", "avx512bw", "avx512f", "fma",
                               "sse4_2"]
    assert cpu_isa(AVX2) == ["avx", "avx2", "fma", "sse4_2"]
    assert cpu_isa("model name\t: x\n") == []
    base = {"host": "vm", "cpu_model": "AMD EPYC", "logical_cores": 2, "physical_cores": 2,
            "memory_gib": 23.5}
    wide, narrow = {**base, "cpu_isa": cpu_isa(AVX512)}, {**base, "cpu_isa": cpu_isa(AVX2)}
    assert fingerprint(wide) != fingerprint(narrow)
    assert isa_summary(wide["cpu_isa"]) == "AVX-512 BF16"
    assert isa_summary(narrow["cpu_isa"]) == "AVX2"
    old = {"host": "vm", "cpu_model": "AMD EPYC", "logical_cores": 2, "physical_cores": 2,
           "memory_gib": 24, "gpu": None}
    assert machine_identity(base) == old
    assert fingerprint(base) == hashlib.sha256(
        json.dumps(old, sort_keys=True).encode()).hexdigest()[:12]
    assert "cpu_isa" in snapshot()
