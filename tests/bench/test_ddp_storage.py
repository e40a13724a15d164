"""The ddp benchmark's input pipeline without training: make-data (sizes, seeds, layouts),
the dataset index and its errors, batches with bytes counted and checked against the
kernel's /proc counts, cold reads, corrupt and truncated samples, the read limit, accelerator
profiles, and the AU accounting."""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tunelab.bench.ddp.cache import drop_file_pages
from tunelab.bench.ddp.dataset import MANIFEST, index_dataset, shard_plan
from tunelab.bench.ddp.makedata import (
    IMAGENET_MEAN_BYTES,
    MakeDataConfig,
    jpeg_target_bytes,
    make_dataset,
    volume_shape,
)
from tunelab.bench.ddp.metrics import RankRecord, RunAccount, StepRecord, summarize
from tunelab.bench.ddp.profiles import Profile, find_profile, load_profiles, write_profile
from tunelab.errors import WorkloadError

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 ImageNet-like JPEGs at a tenth of the real size, 3 classes."""
    root = tmp_path_factory.mktemp("ds") / "img"
    make_dataset(MakeDataConfig(str(root), "imagenet", 24, classes=3, scale=0.1, jobs=2))
    return root


def test_make_data_images_follow_the_drawn_sizes_and_the_seed(images: Path,
                                                               tmp_path: Path) -> None:
    from PIL import Image

    index = index_dataset(images)
    assert (index.layout, index.samples, len({e.label for e in index.entries})) == (
        "jpeg-folder", 24, 3)
    for e in index.entries:
        i = int(e.path.rsplit("_", 1)[1].split(".")[0])
        target = jpeg_target_bytes(0, i, 0.1)
        assert 0.85 * target <= e.size <= 1.15 * target  # one re-encode corrects a miss
        with Image.open(index.path(e)) as im:
            assert im.format == "JPEG"
    # the law's mean is MLPerf Storage's record length; the same seed makes the same bytes
    import numpy as np

    draws = np.array([jpeg_target_bytes(1, i) for i in range(4000)])
    assert draws.mean() == pytest.approx(IMAGENET_MEAN_BYTES, rel=0.05)
    again = tmp_path / "again"
    make_dataset(MakeDataConfig(str(again), "imagenet", 5, classes=3, scale=0.1, jobs=1))
    first = sorted(index.entries, key=lambda e: e.path)[0]
    assert (again / first.path).read_bytes() == (images / first.path).read_bytes()
    # without the manifest the scan finds the same dataset
    (again / MANIFEST).unlink()
    assert index_dataset(again).samples == 5


def test_make_data_shards_and_volumes(tmp_path: Path) -> None:
    shards = make_dataset(MakeDataConfig(str(tmp_path / "sh"), "imagenet", 10, layout="shards",
                                         shard_samples=4, scale=0.05))
    assert [e.samples for e in shards.entries] == [4, 4, 2]
    with tarfile.open(shards.path(shards.entries[0])) as tar:
        assert tar.getnames()[:2] == ["00000000.jpg", "00000000.cls"]
    vols = make_dataset(MakeDataConfig(str(tmp_path / "v"), "unet3d", 2, layout="npz",
                                       scale=1e-4))
    import numpy as np

    with np.load(vols.path(vols.entries[0])) as z:
        d, h, w = volume_shape(0, 0, 1e-4)
        assert z["x"].shape == (1, d, h, w) and z["x"].dtype == np.float32
        assert z["y"].dtype == np.uint8 and set(np.unique(z["y"])) <= {0, 1, 2}
    assert vols.entries[0].size == pytest.approx(5 * d * h * w, abs=1024)  # + npz headers


def test_make_data_cli_prints_progress_lines_without_a_terminal(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "tunelab.bench.ddp", "make-data",
                           str(tmp_path / "d"), "--samples", "6", "--sample-scale", "0.05",
                           "--classes", "2"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "make-data: 6/6 samples (100%)" in proc.stderr
    assert "6 samples (jpeg-folder)" in proc.stdout
    again = subprocess.run([sys.executable, "-m", "tunelab.bench.ddp", "make-data",
                            str(tmp_path / "d"), "--samples", "6"],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"ddp make-data: error: {tmp_path / 'd'} exists and is not an empty "
        "directory; choose a new one"]


def test_make_data_refusals_are_one_line_and_leave_nothing_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Field test: a file system out of inodes made the class folders' mkdir raise a
    traceback; a disk too small was refused as "about 0.0 GB needed, 0.0 GB free" after the
    directory had been made, and that empty directory stayed."""
    import errno
    import shutil
    from collections import namedtuple


    real_mkdir = Path.mkdir

    def no_inodes(self: Path, *args: object, **kwargs: object) -> None:
        if self.name == "n00000003":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        real_mkdir(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", no_inodes)
    target = tmp_path / "full"
    with pytest.raises(WorkloadError, match=r"^cannot create .*n00000003: No space left on "
                                            r"device$"):
        make_dataset(MakeDataConfig(str(target), "imagenet", 8, classes=5, scale=0.01))
    assert not target.exists()
    kept = tmp_path / "kept"  # an empty directory the user made is kept, and left empty
    kept.mkdir()
    with pytest.raises(WorkloadError, match="n00000003"):
        make_dataset(MakeDataConfig(str(kept), "imagenet", 8, classes=5, scale=0.01))
    assert kept.is_dir() and not any(kept.iterdir())
    monkeypatch.setattr(Path, "mkdir", real_mkdir)

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(3_145_728, 0, 3_145_728))
    small = tmp_path / "small"
    with pytest.raises(WorkloadError, match=r"^about 3\.2 MB needed, 3\.1 MB free on the disk "
                                            r"of .*small; make fewer samples$"):
        make_dataset(MakeDataConfig(str(small), "imagenet", 25))
    assert not small.exists()


def test_a_cold_or_kept_cache_served_from_memory_is_said_to_measure_memory() -> None:
    """Field test: --cache cold on a tmpfs said 'cold: … drop_caches = 1 …; measured: 0.0%
    of the bytes read came from the device' and nothing else; --cache keep on a dataset of
    0.37 GB on a 24 GB host measured the page cache without a word of MLPerf Storage's rule
    (a dataset 5 x the host's memory)."""
    from tunelab.bench.ddp.cache import measured_note

    gb = 10**9
    cold = measured_note("cold", 0.0, int(0.37 * gb), 24 * gb)
    assert cold is not None and cold.startswith("only 0% of the bytes read came from the device")
    assert "memory's, not the storage's" in cold and "tmpfs" in cold
    keep = measured_note("keep", 0.02, int(0.37 * gb), 24 * gb)
    assert keep is not None and "--cache keep" in keep and "MLPerf Storage asks for 5 x" in keep
    assert "(0.37 GB) is 0.015 x this host's memory (24.0 GB)" in keep
    # what a storage figure needs: no note
    assert measured_note("cold", 1.02, gb, 24 * gb) is None
    assert measured_note("keep", 0.97, 200 * gb, 24 * gb) is None
    assert measured_note("warm", 0.0, gb, 24 * gb) is None  # memory on purpose
    assert measured_note("cold", math.nan, gb, 24 * gb) is None  # nothing counted


def test_the_read_limit_group_is_removed_once_killed_workers_have_left_it() -> None:
    """Field test: the launcher's rmdir of the read limit's cgroup came right after the
    workers were SIGKILLed, while they were still leaving the group (EBUSY): it stayed. The
    removal now tries again for a bounded time."""
    import errno

    from tunelab.bench.ddp.iolimit import remove_group

    class _Group:
        def __init__(self, busy: int) -> None:
            self.busy = busy

        def rmdir(self) -> None:
            if self.busy:
                self.busy -= 1
                raise OSError(errno.EBUSY, "Device or resource busy")

    assert remove_group(_Group(3), wait_s=5.0)  # type: ignore[arg-type]
    assert not remove_group(_Group(10**6), wait_s=0.2)  # type: ignore[arg-type]

    class _Gone:
        def rmdir(self) -> None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory")

    assert remove_group(_Gone())  # type: ignore[arg-type]


def test_dataset_errors_name_the_directory(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="no such directory"):
        index_dataset(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(WorkloadError, match="no samples found"):
        index_dataset(tmp_path / "empty")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.jpg").write_bytes(b"x")
    (mixed / "b.npz").write_bytes(b"x")
    with pytest.raises(WorkloadError, match=r"mixes layouts \(1 jpeg-folder, 1 npz-volumes\)"):
        index_dataset(mixed)


def _batch(root: Path, **kw: object) -> tuple[object, object]:
    from tunelab.bench.ddp.data import decoder_ready
    from tunelab.bench.ddp.samples import Decoder, FileSamples

    index = index_dataset(root)
    decoder = Decoder("images", 32, 64, True)
    decoder_ready(decoder)  # imports first, as a worker does before its loaders start
    return index, FileSamples(index, decoder, bool(kw.get("fail", False)))


def test_bytes_read_agree_with_proc_io_within_5_percent_on_cold_reads(images: Path) -> None:
    index, ds = _batch(images)
    paths = index.paths()  # type: ignore[attr-defined]
    # one read first, so what the first batch pages in besides the samples (code the decoder
    # maps on first use) is not counted as the dataset's
    ds.__getitems__(list(range(len(paths))))  # type: ignore[attr-defined]
    drop_file_pages(paths)
    batch = ds.__getitems__(list(range(len(paths))))  # type: ignore[attr-defined]
    info = batch.info
    assert batch.x.shape == (24, 3, 32, 32) and batch.x.dtype == torch.uint8
    assert info["bytes"] == index.bytes  # type: ignore[attr-defined]
    assert info["rchar"] == pytest.approx(info["bytes"], rel=0.05)
    # cold: the device delivered them; each file rounds up to whole 4 KiB pages, and an inode
    # block evicted meanwhile by a concurrent drop_caches (root, other work) is one more
    assert info["bytes"] * 0.95 <= info["device_bytes"] <= info["bytes"] + 2 * 4096 * len(paths)
    warm = ds.__getitems__(list(range(len(paths)))).info  # type: ignore[attr-defined]
    assert warm["device_bytes"] < 0.05 * warm["bytes"]  # now from the page cache


def test_a_batch_asks_the_device_for_all_its_cold_files_at_once(images: Path) -> None:
    from tunelab.bench.ddp.samples import thread_io, will_need

    index, ds = _batch(images)
    paths = index.paths()  # type: ignore[attr-defined]
    ds.__getitems__(list(range(len(paths))))  # type: ignore[attr-defined]
    drop_file_pages(paths)
    before = thread_io()
    if before is None:
        pytest.skip("no per-thread I/O accounting in this kernel")
    will_need(paths + [str(images / "no-such-file.jpg")])  # a missing file: left to the read
    after = thread_io()
    assert after is not None
    # every file's pages were requested from the device, and no byte was read by a read call
    # (the batch's reads then find them in the page cache: one deep queue, not one at a time)
    assert after[1] - before[1] >= 0.95 * index.bytes  # type: ignore[attr-defined]
    assert after[0] - before[0] < 4096
    batch = ds.__getitems__(list(range(len(paths)))).info  # type: ignore[attr-defined]
    assert batch["bytes"] == index.bytes  # type: ignore[attr-defined]


def test_a_corrupt_jpeg_is_skipped_counted_and_named_or_fails(images: Path,
                                                              tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "c"
    shutil.copytree(images, root)
    index = index_dataset(root)
    bad = index.path(index.entries[3])
    Path(bad).write_bytes(b"\xff\xd8not a jpeg at all")
    (root / MANIFEST).unlink()
    _, ds = _batch(root)
    batch = ds.__getitems__([2, 3, 4])  # type: ignore[attr-defined]
    assert batch.info["samples"] == 2 and batch.x.shape[0] == 2
    assert batch.info["corrupt"] == 1 and bad in batch.info["corrupt_files"][0]
    _, strict = _batch(root, fail=True)
    assert bad in strict.__getitems__([3]).info["fatal"]  # type: ignore[attr-defined]


def test_truncated_shard_is_indexed_short_and_counted_when_read(tmp_path: Path) -> None:
    import multiprocessing as mp

    from tunelab.bench.ddp.samples import Decoder, ShardStream

    made = make_dataset(MakeDataConfig(str(tmp_path / "sh"), "imagenet", 8, layout="shards",
                                       shard_samples=4, scale=0.05))
    cut = made.path(made.entries[1])
    data = Path(cut).read_bytes()
    Path(cut).write_bytes(data[: len(data) // 2])
    index = index_dataset(tmp_path / "sh")  # the manifest's size no longer matches: a scan
    assert index.entries[1].samples < 4
    assert any("damaged after" in n and cut in n for n in index.notes)
    plan, steps = shard_plan(index, 0, 0, 1, 0, 2)
    assert steps == (4 // 2) + index.entries[1].samples // 2
    epoch = mp.Value("i", 0)
    stream = ShardStream(made, Decoder("images", 32, 64, True), 2,
                         {0: [[0, 1]]}, epoch, False)  # the manifest still says 4 in shard 1
    batches = list(stream)
    readable = 4 + index.entries[1].samples
    assert [b.info["samples"] for b in batches] == [2] * (readable // 2) + [readable % 2]
    assert sum(b.info["corrupt"] for b in batches) == 4 - index.entries[1].samples
    assert any(cut in n for b in batches for n in b.info["corrupt_files"])
    assert sum(b.info["bytes"] for b in batches) == Path(made.path(made.entries[0])).stat(
    ).st_size + len(data) // 2


def test_volumes_are_cropped_or_padded_to_the_patch() -> None:
    import numpy as np

    from tunelab.bench.ddp.samples import Decoder

    buf = io.BytesIO()
    x = np.ones((1, 70, 40, 200), dtype=np.float32)
    np.savez(buf, x=x, y=x.astype(np.uint8))
    vx, vy = Decoder("volumes", 224, 64, True)(buf.getvalue(), -1)
    assert vx.shape == (1, 64, 64, 64) and vy.shape == (64, 64, 64)
    assert float(vx.sum()) == 64 * 40 * 64  # 40 rows of data, the rest zero padding
    blank_x, _ = Decoder("volumes", 224, 64, False)(b"anything", -1)
    assert blank_x.shape == (1, 64, 64, 64) and float(blank_x.abs().sum()) == 0


def test_read_limit_that_cannot_be_applied_says_why_in_one_line(tmp_path: Path) -> None:
    from tunelab.bench.ddp.iolimit import read_limit

    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    d = shm / f"tunelab-test-{os.getpid()}"
    d.mkdir()
    try:
        with pytest.raises(WorkloadError) as exc, read_limit(10e6, str(d)):
            pass
    finally:
        d.rmdir()
    text = str(exc.value)
    assert text.startswith("--read-limit cannot be applied: ")
    assert "tmpfs" in text and "no block device" in text and "\n" not in text


def test_read_limit_throttles_cold_reads_to_the_rate(tmp_path: Path) -> None:
    """A child process under --read-limit 20MB/s reads a cold 8 MB file at about 20 MB/s."""
    from tunelab.bench.ddp.iolimit import find_mechanism

    if os.geteuid() != 0:
        pytest.skip("the block-I/O throttle needs root")
    try:
        find_mechanism()
    except WorkloadError as exc:
        pytest.skip(f"no throttle here: {exc}")
    f = tmp_path / "blob"
    f.write_bytes(os.urandom(8 << 20))
    os.sync()
    code = f"""
import os, sys, time
from tunelab.bench.ddp.cache import drop_file_pages
from tunelab.bench.ddp.iolimit import read_limit
with read_limit(20e6, {str(tmp_path)!r}) as line:
    drop_file_pages([{str(f)!r}])
    t = time.perf_counter()
    n = len(open({str(f)!r}, 'rb', buffering=0).readall())
    print(n / (time.perf_counter() - t) / 1e6, line)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    rate, line = proc.stdout.split(" ", 1)
    assert 8 <= float(rate) <= 25, proc.stdout   # set 20 MB/s (a first burst may pass)
    assert "limited to 20 MB/s by cgroup" in line


def test_profiles_have_sources_and_unknown_names_list_the_known(tmp_path: Path) -> None:
    table = load_profiles(tmp_path / "none.yaml")
    a100 = find_profile("resnet50/a100/b400", table)
    assert (a100.step_s, a100.kind) == (0.435, "measured") and "MLPerf Storage" in a100.source
    assert find_profile("unet3d/b200/b7", table).kind == "derived"
    assert all(p.source for p in table)
    with pytest.raises(WorkloadError) as exc:
        find_profile("resnet50/tpu9/b400", table)
    assert "resnet50/a100/b400/mixed" in str(exc.value) and "unet3d/h100/b7/mixed" in str(
        exc.value)
    with pytest.raises(WorkloadError, match="several precisions match"):
        find_profile("resnet50/v100/b64", table)
    user = tmp_path / "mine.yaml"
    write_profile(Profile("resnet50", "a100", "mixed", 400, 0.5, "measured", "my lab"), user)
    assert find_profile("resnet50/a100/b400", load_profiles(user)).step_s == 0.5


@pytest.mark.slow
def test_calibrate_measures_the_cpu_and_writes_a_profile_emulate_can_use(tmp_path: Path
                                                                          ) -> None:
    out = tmp_path / "acc.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "tunelab", "bench", "ddp", "calibrate", "--model", "resnet18",
         "--batch", "2", "--image-size", "32", "--steps", "2", "--warmup", "0",
         "--device", "cpu", "--name", "This CPU", "--output", str(out)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == "use it with --compute emulate:resnet18/this-cpu/b2/fp32"
    (mine,) = [p for p in load_profiles(out) if p.accelerator == "this-cpu"]
    assert mine.kind == "measured" and mine.batch == 2 and 0 < mine.step_s < 60
    assert "tunelab bench ddp calibrate on " in mine.source and "input 3x32x32" in mine.source
    assert find_profile("resnet18/this-cpu/b2", load_profiles(out)) == mine
    bad = subprocess.run(
        [sys.executable, "-m", "tunelab", "bench", "ddp", "calibrate", "--model", "vgg",
         "--output", str(out)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "ddp calibrate: error: --model: unknown value 'vgg'; choose one of resnet18, resnet50, "
        "leopard, unet3d"]


def _step(step: float, data: float, compute: float, comm: float, **kw: int) -> StepRecord:
    return StepRecord(step_s=step, compute_s=compute, allreduce_s=comm, exposed_s=comm,
                      other_s=0.0, bytes=8, data_s=data, samples=4, **kw)


def test_au_accounting_adds_up_and_labels_input_bound_runs() -> None:
    run = RunAccount(run_s=2.0, compute_s=1.2, wait_s=0.6, drop_s=0.0, first_wait_s=0.3,
                     shutdown_s=0.1, read_bytes=400, rchar=400, device_bytes=380)
    slow = RankRecord(0, 0, 1.0, (_step(0.5, 0.15, 0.3, 0.04, read_bytes=200, rchar=200,
                                        device_bytes=190),) * 2, run)
    fast = RankRecord(1, 0, 1.0, (_step(0.5, 0.01, 0.3, 0.18, read_bytes=200, rchar=200,
                                        device_bytes=190),) * 2, run)
    s = summarize([slow, fast], 8)
    assert s.au + s.comm_frac + s.wait_frac + s.overhead_frac == pytest.approx(1.0)
    assert s.au_min == pytest.approx(0.3 / 0.5)  # compute / step: the all-reduce beside it
    assert s.comm_frac == pytest.approx((0.04 + 0.18) / 2 / 0.5)
    assert s.input_frac == pytest.approx(0.3) and s.input_bound
    assert s.read_Bps == 800 and s.device_share == pytest.approx(0.95)
    assert s.au_run == pytest.approx(0.6) and s.first_wait_s == 0.3
    quiet = summarize([RankRecord(0, 0, 1.0, (_step(0.5, 0.02, 0.47, 0.0),) * 2)], 4)
    assert not quiet.input_bound and quiet.overhead_s == pytest.approx(0.01)
