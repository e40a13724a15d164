"""``tunelab bounds`` as a user runs it: a stored profile is shown without measuring, a
measurement is kept and merged, bad input is one line and exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import tunelab
from tunelab.bounds.profile import Bound, Profile, load_profile, save_profile
from tunelab.cli.bounds import parse_bytes
from tunelab.errors import TunelabError
from tunelab.sysinfo import fingerprint, snapshot


@pytest.fixture
def bounds_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "bounds"
    monkeypatch.setenv("TUNELAB_BOUNDS_DIR", str(d))
    return d


def test_a_stored_profile_is_shown_in_every_format_without_measuring(bounds_dir: Path):
    machine = fingerprint(snapshot())
    save_profile(Profile(machine, {"host": "here", "cpu_model": "CPU X", "logical_cores": 2,
                                   "memory_gib": 24}, "2026-11-26 10:00:00 UTC",
                         (Bound("memory", {"device": "cpu", "threads": 2}, 9.5e9,
                                (9.0e9, 9.5e9, 9.9e9), "triad"),
                          Bound("gemm", {"precision": "fp32", "device": "cpu", "threads": 2},
                                3.0e10, (3.0e10,), "matmul")), quick=True), bounds_dir)
    res = tunelab("bounds", "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["schema"] == "tunelab.bounds" and doc["measured_now"] is False
    assert [b["kind"] for b in doc["bounds"]] == ["memory", "gemm"]
    assert doc["bounds"][0]["best"] == 9.9e9 and "measuring" not in res.stderr
    text = tunelab("bounds").stdout.splitlines()
    assert text[0].startswith("bounds of here (CPU X, 2 cores, 24 GiB), measured 2026-11-26")
    assert text[2].split()[:2] == ["gemm", "fp32"]  # gemm first, whatever the stored order
    assert "9.50 GB/s" in text[3] and "9.90 GB/s" in text[3]
    assert text[-1].endswith("stored earlier: tunelab bounds --refresh measures again")
    rows = tunelab("bounds", "--format", "csv").stdout.splitlines()
    assert rows[0].startswith("kind,precision,device,threads") and len(rows) == 3


@pytest.mark.parametrize("args, needle", [
    (["--sizes", "4X"], "--sizes: '4X' is not a size"),
    (["--only", "gpu"], "unknown bound kind 'gpu'"),
    (["--threads", "two"], "--threads: 'two' is not a whole number"),
    (["--only", "storage"], "needs --storage DIR"),
    (["--storage", "/nonexistent/dir"], "is not a directory"),
])
def test_bad_input_is_one_line_and_exit_2(bounds_dir: Path, args: list[str], needle: str):
    res = tunelab("bounds", *args)
    assert res.returncode == 2 and needle in res.stderr
    assert res.stderr.count("\n") == 1 and not res.stdout
    assert not bounds_dir.exists()  # nothing measured, nothing written


def test_sizes_read_like_a_person_writes_them():
    assert [parse_bytes(s, "x") for s in ("65536", "64K", "4M", "4MiB", "1GB", "1.5k")] == \
        [65536, 65536, 4 << 20, 4 << 20, 10**9, 1536]
    with pytest.raises(TunelabError):
        parse_bytes("-1", "x")


@pytest.mark.slow
def test_a_quick_measurement_is_kept_and_a_later_one_merged(bounds_dir: Path,
                                                            tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "f.bin").write_bytes(b"x" * (1 << 20))
    kinds = "memory,link,storage" if shutil.which("mpirun") else "memory,storage"
    res = tunelab("bounds", "--quick", "--only", kinds, "--threads", "1", "--sizes", "64K",
                  "--stacks", "mpi-ob1", "--storage", data, "--storage-bytes", "2M",
                  "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["measured_now"] is True and "tunelab bounds: measuring (quick)" in res.stderr
    found = {(b["kind"], b["variant"].get("pattern") or b["variant"].get("cache"))
             for b in doc["bounds"]}
    assert {("memory", None), ("storage", "cold"), ("storage", "warm")} <= found
    if "link" in kinds:
        assert {("link", "oneway"), ("link", "bothways"), ("link", "alltoall")} <= found
    stored = load_profile(doc["fingerprint"], bounds_dir)
    assert stored is not None and len(stored.bounds) == len(doc["bounds"])
    again = json.loads(tunelab("bounds", "--quick", "--only", "memory", "--threads", "1",
                               "--format", "json").stdout)
    assert len(again["bounds"]) == len(doc["bounds"])  # memory replaced, the rest kept
    assert again["taken_at"] >= doc["taken_at"]
