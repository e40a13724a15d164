"""The measurements themselves at bounded sizes: GEMM, triad and storage reads give rates,
the precision choice is made at run time, the plan refuses what cannot be measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunelab.bounds import compute
from tunelab.bounds.compute import gemm_rates, precisions_for, triad_rates
from tunelab.bounds.disk import read_rates, resident_share
from tunelab.bounds.measure import make_plan, measure
from tunelab.errors import TunelabError


def test_gemm_and_triad_give_positive_rates_with_their_method():
    g = gemm_rates("fp32", n=128, threads=1, repeats=3, seconds=5)
    assert len(g.samples) == 3 and all(s > 0 for s in g.samples)
    assert "128^3 fp32" in g.method and "1 thread" in g.method
    t = triad_rates(elements=1 << 16, threads=1, repeats=4, seconds=5)
    assert len(t.samples) == 4 and all(s > 0 for s in t.samples)
    assert "65,536 float64" in t.method


def test_numpy_gemm_runs_in_a_child_with_its_blas_threads_set():
    r = compute._numpy_gemm_child(64, 1, 2, 5.0)
    assert r is not None and len(r.samples) == 2 and all(s > 0 for s in r.samples)
    assert r.method == "numpy.matmul 64^3 fp32, 1 thread of its BLAS"


def test_the_fp32_bound_is_the_faster_library(monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("torch")
    fast = compute.Rates((1e15, 1e15), "numpy.matmul 64^3 fp32, 1 thread of its BLAS")
    monkeypatch.setattr(compute, "_numpy_gemm_child", lambda *a: fast)
    r = gemm_rates("fp32", n=64, threads=1, repeats=2, seconds=5)
    assert r.samples == fast.samples and "; torch.matmul: " in r.method
    assert gemm_rates("fp32", n=64, threads=1, repeats=2, seconds=5,
                      numpy_too=False).method.startswith("torch.matmul")
    slow = compute.Rates((1.0, 1.0), fast.method)
    monkeypatch.setattr(compute, "_numpy_gemm_child", lambda *a: slow)
    assert gemm_rates("fp32", n=64, threads=1, repeats=2, seconds=5).method.startswith("torch")
    monkeypatch.setattr(compute, "_numpy_gemm_child", lambda *a: None)  # the child failed
    assert gemm_rates("fp32", n=64, threads=1, repeats=2, seconds=5).method.startswith("torch")


def test_bf16_is_kept_only_when_a_trial_at_run_time_finds_it_fast_enough():
    fast, why = precisions_for("cpu", 1, trial=lambda threads: (True, 1.8))
    assert fast == ["fp32", "bf16"] and why == []
    slow, why = precisions_for("cpu", 1, trial=lambda threads: (False, 0.03))
    assert slow == ["fp32"] and "0.03x the fp32 rate" in why[0]
    gpu, why = precisions_for("cuda", None, trial=lambda threads: pytest.fail("no trial"))
    assert gpu == ["fp32", "tf32", "bf16", "fp16"] and why == []


def test_the_plan_takes_the_device_from_one_capability_check(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(compute, "cuda_available", lambda: False)
    cpu = make_plan(quick=True)
    assert cpu.device == "cpu" and cpu.gemm_n == 2048 and cpu.threads == (compute.cpu_threads(),)
    assert "storage" not in cpu.kinds  # no directory named: nothing to read
    with pytest.raises(TunelabError, match="no CUDA device"):
        make_plan(quick=True, device="cuda")
    monkeypatch.setattr(compute, "cuda_available", lambda: True)
    gpu = make_plan(quick=False)
    assert gpu.device == "cuda" and gpu.gemm_n == 8192 and gpu.triad_elements == 1 << 28
    assert make_plan(quick=True, device="cpu").device == "cpu"


@pytest.mark.parametrize("kwargs, needle", [
    ({"kinds": ["gpu"]}, "unknown bound kind 'gpu'; valid: gemm, memory, link, storage"),
    ({"device": "tpu"}, "unknown device"),
    ({"stacks": ["infiniband"]}, "unknown link stack"),
    ({"sizes": [0]}, "--sizes"),
    ({"ranks": 1}, "at least 2 ranks"),
    ({"threads": [0]}, "--threads"),
    ({"kinds": ["storage"]}, "needs --storage DIR"),
    ({"storage": [Path("/nonexistent")]}, "is not a directory"),
    ({"hostfile": Path("/nonexistent")}, "does not exist"),
])
def test_the_plan_refuses_what_cannot_be_measured(kwargs: dict, needle: str):
    with pytest.raises(TunelabError, match=needle):
        make_plan(quick=True, **kwargs)


def test_storage_reads_cold_and_warm_and_makes_up_a_small_directory(tmp_path: Path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.bin").write_bytes(b"x" * 300_000)
    (tmp_path / "b.bin").write_bytes(b"y" * 200_000)
    r = read_rates(tmp_path, nbytes=3 << 20, repeats=2)
    assert r.files == 3 and r.nbytes == 3 << 20  # two files and a scratch file
    assert r.scratch == (3 << 20) - 500_000
    assert len(r.cold) == 2 and len(r.warm) == 2 and min(r.cold + r.warm) > 0
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.bin", "b.bin", "sub"]
    assert r.resident is None or 0.0 <= r.resident <= 1.0
    big = read_rates(tmp_path, nbytes=100_000, repeats=1)
    assert big.scratch == 0 and big.files == 1
    with pytest.raises(TunelabError, match="is not a directory"):
        read_rates(tmp_path / "b.bin", nbytes=1)


def test_resident_share_sees_pages_read_into_the_cache(tmp_path: Path):
    f = tmp_path / "f.bin"
    f.write_bytes(b"z" * (1 << 20))
    f.read_bytes()
    share = resident_share([f])
    assert share is None or share > 0.5


def test_measure_fills_a_profile_with_notes_for_what_could_not_run(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    plan = make_plan(quick=True, kinds=["memory", "storage", "link"], threads=[1],
                     storage=[tmp_path], storage_bytes=1 << 20, stacks=["mpi-ob1"])
    plan = type(plan)(**{**plan.__dict__, "triad_elements": 1 << 16})
    monkeypatch.setattr("shutil.which", lambda name: None)  # no mpirun here
    said: list[str] = []
    p = measure(plan, say=said.append)
    kinds = [b.kind for b in p.bounds]
    assert kinds == ["memory", "storage", "storage"]
    assert [b.variant.get("cache") for b in p.bounds[1:]] == ["cold", "warm"]
    assert any("mpirun is not installed" in n for n in p.notes)
    assert p.machine["cpu_model"] and len(p.fingerprint) == 12 and len(p.loadavg) == 2
    assert said and said[0].startswith("memory triad")


def test_a_storage_directory_that_cannot_be_read_keeps_the_other_bounds(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A directory smaller than the bytes asked for, where no scratch file can be written
    (a read-only mount), ended the whole run: the triad measured before it was lost and
    nothing was kept. It is now a note, as a link stack that cannot run is."""
    from tunelab.errors import TunelabError

    good, bad = tmp_path / "good", tmp_path / "ro"
    good.mkdir()
    bad.mkdir()
    plan = make_plan(quick=True, kinds=["memory", "storage"], threads=[1],
                     storage=[bad, good], storage_bytes=1 << 20)
    plan = type(plan)(**{**plan.__dict__, "triad_elements": 1 << 16})
    import tunelab.bounds.disk as disk

    real = disk.read_rates

    def read_rates(directory: Path, **kw: object):  # type: ignore[no-untyped-def]
        if Path(directory) == bad:
            raise TunelabError(f"cannot write a scratch file in {bad}: Read-only file system")
        return real(directory, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(disk, "read_rates", read_rates)
    p = measure(plan)
    assert [b.kind for b in p.bounds] == ["memory", "storage", "storage"]
    assert any(n.startswith(f"storage {bad}: not measured (cannot write a scratch file")
               for n in p.notes)


def test_bounds_measured_while_others_took_the_cores_say_so(tmp_path: Path):
    """A quick profile taken while other work held the 2 cores gave fp32 GEMM 64-75
    GFLOP/s (221 when quiet): a real ResNet-18 then ran at 1.96 of it, and nothing said the
    bound was the odd one. The noise watch now marks such bounds, in the profile and the
    views."""
    from tunelab.bounds.profile import Bound
    from tunelab.noise import NoiseSample

    class Busy:
        def start(self) -> None:
            return None

        def stop(self, before: None) -> NoiseSample:
            return NoiseSample(2.0, "0-1", 0.64, 0.3, 0.0, None, 3.8, 3.9, None, None, True,
                               "others took 64% of cores 0-1")

    plan = make_plan(quick=True, kinds=["memory"], threads=[1])
    plan = type(plan)(**{**plan.__dict__, "triad_elements": 1 << 16})
    p = measure(plan, watch=Busy())  # type: ignore[arg-type]
    (b,) = p.bounds
    assert b.disturbed == "others took 64% of cores 0-1"
    assert Bound.from_dict(b.to_dict()).disturbed == b.disturbed
    assert any(n.startswith("memory: measured while others took 64% of cores 0-1: these "
                            "bounds may be low") for n in p.notes)
    from tunelab.report.bounds import bounds_view
    from tunelab.report.output import render

    assert "BUSY: measured while others took 64%" in render(bounds_view(p), "text")
