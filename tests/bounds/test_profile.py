"""Profiles: the machine's fingerprint, the JSON file kept per machine, merging a newer
measurement, one-line errors for a broken file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tunelab.bounds.profile import (
    Bound,
    Profile,
    load_profile,
    median_of,
    profile_dir,
    profile_path,
    save_profile,
)
from tunelab.errors import TunelabError
from tunelab.sysinfo import fingerprint, machine_identity

SNAP = {"host": "node7", "cpu_model": "AMD EPYC", "logical_cores": 2, "physical_cores": 2,
        "memory_gib": 23.5, "os": "Linux-6.1", "python": "3.11.2", "loadavg": [6.8, 6.1, 5.9],
        "packages": {"numpy": "2.4.6"}, "tools": {"mpirun": "mpirun (Open MPI) 4.1.4"}}


def profile(*bounds: Bound, fp: str = "abc123") -> Profile:
    return Profile(fp, {"host": "node7"}, "2026-11-26 10:00:00 UTC", bounds, quick=True,
                   loadavg=(1.0, 2.0), notes=("bf16 left out",), seconds=12.5)


def test_fingerprint_names_the_machine_not_its_load_or_versions():
    busier = {**SNAP, "loadavg": [1.0, 1.0, 1.0], "python": "3.12.1", "os": "Linux-6.2",
              "packages": {}, "memory_gib": 23.6}
    assert fingerprint(busier) == fingerprint(SNAP)
    assert len(fingerprint(SNAP)) == 12 and fingerprint(SNAP).isalnum()
    for change in ({"host": "node8"}, {"cpu_model": "Intel Xeon"}, {"logical_cores": 4},
                   {"tools": {"nvidia-smi": "NVIDIA H100 80GB HBM3, 550.54"}}):
        assert fingerprint({**SNAP, **change}) != fingerprint(SNAP), change
    assert machine_identity({**SNAP, "tools": {"nvidia-smi": "NVIDIA H100, 550"}})["gpu"] == \
        "NVIDIA H100"


def test_profile_round_trips_through_its_file(tmp_path: Path):
    b = Bound("link", {"stack": "mpi-ucx", "pattern": "alltoall", "ranks": 2,
                       "message_bytes": 4194304}, 2.0e9, (1.0e9, 2.0e9, 3.0e9), "probe")
    path = save_profile(profile(b), tmp_path)
    assert path == tmp_path / "abc123.json"
    doc = json.loads(path.read_text())
    assert doc["schema"] == "tunelab.bounds" and doc["bounds"][0]["best"] == 3.0e9
    back = load_profile("abc123", tmp_path)
    assert back == profile(b)
    assert back is not None and back.bounds[0].unit == "B/s" and back.bounds[0].best == 3.0e9
    assert load_profile("fff000", tmp_path) is None  # another machine: nothing stored


def test_a_newer_measurement_replaces_only_the_bounds_it_measured_again():
    fp32 = Bound("gemm", {"precision": "fp32", "device": "cpu", "threads": 2}, 30e9)
    bf16 = Bound("gemm", {"precision": "bf16", "device": "cpu", "threads": 2}, 60e9)
    triad = Bound("memory", {"device": "cpu", "threads": 2}, 9e9)
    newer = profile(Bound("gemm", {"precision": "fp32", "device": "cpu", "threads": 2}, 35e9))
    merged = profile(fp32, bf16, triad).merged(newer)
    values = sorted((b.kind, b.variant.get("precision"), b.value) for b in merged.bounds)
    assert values == [("gemm", "bf16", 60e9), ("gemm", "fp32", 35e9), ("memory", None, 9e9)]


def test_the_directory_comes_from_the_environment(tmp_path: Path):
    assert profile_dir({"TUNELAB_BOUNDS_DIR": str(tmp_path)}) == tmp_path
    assert profile_dir({}).parts[-3:] == (".cache", "tunelab", "bounds")
    with pytest.raises(TunelabError, match="invalid machine fingerprint"):
        profile_path("../etc", tmp_path)


@pytest.mark.parametrize("text, needle", [
    ("{not json", "is not JSON"),
    ('{"schema": "other"}', "not a bounds profile"),
    ('{"schema": "tunelab.bounds", "version": 99, "bounds": []}', "version 99"),
    ('{"schema": "tunelab.bounds", "version": 1, "bounds": [{"kind": "gpu", "value": 1}]}',
     "malformed"),
    ('{"schema": "tunelab.bounds", "version": 1, "bounds": [{"kind": "gemm", "value": -1}]}',
     "malformed"),
])
def test_a_broken_profile_is_one_line_naming_the_file(tmp_path: Path, text: str, needle: str):
    (tmp_path / "abc123.json").write_text(text)
    with pytest.raises(TunelabError, match=needle) as info:
        load_profile("abc123", tmp_path)
    assert str(tmp_path) in str(info.value) and "\n" not in str(info.value)


def test_median_of_ignores_what_is_not_a_rate():
    assert median_of([3.0, 1.0, math.nan, 2.0, -1.0, 0.0]) == 2.0
    assert median_of([1.0, 4.0]) == 2.5
    assert math.isnan(median_of([math.nan]))
