"""``--decode gpu``'s parts that run on a CPU (issue 27): a batch of files crosses from a
loader process as one buffer; RandomResizedCrop's boxes drawn for a batch at once fit and
follow torchvision's rule; the batched crop-resize-flip computes what ``F.interpolate`` does
image by image; the decode-ahead thread hands batches over in order, at most ``limit``,
raises a loader's error where that batch was due, and stops when closed — with real loader
processes and epochs turning over inside the thread."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import pytest

from tunelab.bench.ddp.config import DDPConfig
from tunelab.bench.ddp.data import LoaderFailure, make_source
from tunelab.bench.ddp.gpudecode import DecodeAhead, UndecodableImages, crop_boxes, resize_crops
from tunelab.bench.ddp.makedata import MakeDataConfig, make_dataset
from tunelab.bench.ddp.models import ModelSpec
from tunelab.bench.ddp.samples import Batch, Decoder, Encoded

torch = pytest.importorskip("torch")
F = pytest.importorskip("torch.nn.functional")
Image = pytest.importorskip("PIL.Image")


def resize_each(images: list[Any], boxes: Any, flips: Any, size: int) -> Any:
    """The reference: each image cropped, resized by ``F.interpolate`` and flipped alone."""
    out = []
    for img, (top, left, h, w), flip in zip(images, boxes.tolist(), flips.tolist(),
                                            strict=True):
        patch = img[:, top:top + h, left:left + w].unsqueeze(0).float()
        patch = F.interpolate(patch, size=(size, size), mode="bilinear", align_corners=False)
        if flip:
            patch = patch.flip(-1)
        out.append(patch[0].round_().clamp_(0, 255).to(torch.uint8))
    return torch.stack(out)


def _images(seed: int, shapes: list[tuple[int, int]]) -> list[Any]:
    gen = torch.Generator().manual_seed(seed)
    # smooth content with noise, as photographs: interpolation has something to do
    out = []
    for h, w in shapes:
        ramp = torch.linspace(0, 200, w)[None, None, :] + torch.linspace(0, 50, h)[None, :, None]
        noise = torch.randint(0, 40, (3, h, w), generator=gen)
        out.append((ramp + noise).clamp(0, 255).to(torch.uint8))
    return out


def test_crop_boxes_fit_every_image_and_follow_torchvisions_rule() -> None:
    sizes = torch.tensor([[375, 500], [500, 375], [64, 1000], [1000, 64], [7, 7]] * 400)
    boxes = crop_boxes(sizes, torch.Generator().manual_seed(1))
    assert boxes.shape == (2000, 4) and boxes.dtype == torch.long
    top, left, h, w = boxes.unbind(1)
    height, width = sizes.unbind(1)
    assert bool(((top >= 0) & (left >= 0) & (h > 0) & (w > 0)).all())
    assert bool(((top + h <= height) & (left + w <= width)).all())
    # no try fits a 64 x 1000 strip most of the time: the central crop of aspect 4/3 then
    strip = boxes[2::5]
    central = (strip == torch.tensor([0, 457, 64, 85])).all(dim=1)
    assert 0.5 < float(central.float().mean()) < 1.0
    # the crops' areas and aspects are distributed as torchvision's RandomResizedCrop's
    from tunelab.bench.ddp.models import import_torchvision

    rrc = import_torchvision().transforms.RandomResizedCrop
    torch.manual_seed(2)
    img = Image.new("RGB", (500, 375))
    ref = torch.tensor([rrc.get_params(img, (0.08, 1.0), (3 / 4, 4 / 3)) for _ in range(2000)])
    ours = crop_boxes(torch.tensor([[375, 500]] * 2000), torch.Generator().manual_seed(3))
    for b in (ref, ours):
        assert bool((b[:, 2] <= 375).all() and (b[:, 3] <= 500).all())
    area = [float((b[:, 2] * b[:, 3]).float().mean()) / (375 * 500) for b in (ref, ours)]
    aspect = [float((b[:, 3] / b[:, 2]).log().mean()) for b in (ref, ours)]
    assert abs(area[0] - area[1]) < 0.03 and abs(aspect[0] - aspect[1]) < 0.03


@pytest.mark.parametrize("size", [32, 224])
def test_the_batched_crop_resize_flip_is_interpolate_image_by_image(size: int) -> None:
    shapes = [(375, 500), (500, 375), (120, 90), (7, 7), (333, 333), (64, 300)]
    images = _images(size, shapes)
    boxes = crop_boxes(torch.tensor(shapes), torch.Generator().manual_seed(size))
    boxes[3] = torch.tensor([1, 2, 5, 4])  # upscaled: a 5 x 4 crop to size x size
    boxes[4] = torch.tensor([0, 0, 333, 333])  # the whole image
    flips = torch.tensor([True, False, True, False, True, True])
    got = resize_crops(images, boxes, flips, size)
    want = resize_each(images, boxes, flips, size)
    assert got.shape == (6, 3, size, size) and got.dtype == torch.uint8
    diff = (got.int() - want.int()).abs()
    assert int(diff.max()) <= 1  # float rounding, rarely
    assert float((diff == 0).float().mean()) > 0.995
    # a flipped image is the mirror of its unflipped crop
    same = resize_crops(images[:1], boxes[:1], torch.tensor([False]), size)
    assert torch.equal(got[0], same[0].flip(-1))


def _fake_batches(n: int, fail_at: int | None = None) -> tuple[Any, list[int]]:
    calls: list[int] = []

    def fetch() -> tuple[Batch, float]:
        i = len(calls)
        calls.append(i)
        if i == fail_at:
            raise LoaderFailure(f"data-loader process 0 of worker 0 (pid 1) died at batch {i}")
        return Batch(torch.tensor([i]), torch.tensor([i]), {"batch": i}), 0.25 * (i == 0)

    return fetch, calls


def _identity(x: Any, size: int, device: Any, generator: Any) -> Any:
    return x


def test_decode_ahead_hands_over_in_order_up_to_its_limit() -> None:
    fetch, calls = _fake_batches(100)
    ahead = DecodeAhead(fetch, 8, torch.device("cpu"), seed=0, limit=5, decode=_identity)
    got = [ahead.next() for _ in range(5)]
    assert [int(x) for x, _, _, _ in got] == [0, 1, 2, 3, 4]
    assert [info["batch"] for _, _, info, _ in got] == [0, 1, 2, 3, 4]
    assert [drop for *_, drop in got] == [0.25, 0, 0, 0, 0]
    with pytest.raises(RuntimeError, match="has handed over all 5 batches"):
        ahead.next()  # one more than planned: said, not waited for
    ahead.close()
    assert calls == [0, 1, 2, 3, 4]  # never a batch past the run's last


def test_decode_ahead_says_why_its_thread_could_not_start() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA stream starts here: the failure is made on a CPU-only machine")
    fetch, calls = _fake_batches(100)
    ahead = DecodeAhead(fetch, 8, torch.device("cuda"), seed=0, limit=5, decode=_identity)
    try:
        with pytest.raises(RuntimeError):  # no CUDA stream without CUDA: raised, not a hang
            ahead.next()
    finally:
        ahead.close()
    assert calls == []


def test_decode_ahead_raises_a_loaders_error_where_its_batch_was_due() -> None:
    fetch, calls = _fake_batches(100, fail_at=2)
    ahead = DecodeAhead(fetch, 8, torch.device("cpu"), seed=0, limit=10, decode=_identity)
    assert [int(ahead.next()[0]) for _ in range(2)] == [0, 1]
    for _ in range(2):  # and again if asked again
        with pytest.raises(LoaderFailure, match="died at batch 2"):
            ahead.next()
    ahead.close()
    assert calls == [0, 1, 2]


def test_decode_ahead_stops_when_closed_with_its_queue_full() -> None:
    fetch, calls = _fake_batches(100)
    ahead = DecodeAhead(fetch, 8, torch.device("cpu"), seed=0, limit=1000, depth=2,
                        decode=_identity)
    ahead.next()
    deadline = time.monotonic() + 30
    while len(calls) < 3 and time.monotonic() < deadline:  # one handed over, two queued
        time.sleep(0.01)
    ahead.close()  # (waits up to 10 s for the thread)
    assert not ahead._thread.is_alive()
    assert len(calls) <= 4


def _pil_decode(encoded: Encoded, size: int, device: Any, generator: Any) -> Any:
    """--decode gpu's decode with Pillow in place of nvJPEG (the CPU wheels have none),
    refusing what Pillow cannot decode as decode_batch does."""
    import numpy as np

    images, bad = [], []
    for i, f in enumerate(encoded.files()):
        try:
            with Image.open(io.BytesIO(f.numpy().tobytes())) as im:
                images.append(torch.from_numpy(np.asarray(im.convert("RGB"))
                                               .transpose(2, 0, 1).copy()))
        except OSError as exc:
            bad.append((i, f"RuntimeError: {exc}"))
    if bad:
        raise UndecodableImages(bad)
    if not images:
        return torch.zeros((0, 3, size, size), dtype=torch.uint8)
    sizes = torch.tensor([img.shape[1:] for img in images])
    boxes = crop_boxes(sizes, generator)
    return resize_crops(images, boxes, torch.rand(len(images), generator=generator) < 0.5,
                        size)


def test_the_gpu_decode_path_through_real_loaders_turns_epochs_in_its_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tunelab.bench.ddp import gpudecode

    root = tmp_path / "img"
    make_dataset(MakeDataConfig(str(root), "imagenet", 12, classes=3, scale=0.05, jobs=1))
    monkeypatch.setattr(gpudecode, "decode_batch", _pil_decode)
    # --decode gpu needs a GPU: the configuration is built here without that check
    cfg = DDPConfig(model="resnet18", image_size=32, batch_size=4, data=f"files:{root}",
                    loader_workers=2, prefetch=2, cache="warm", decode="gpu", device="cpu",
                    warmup=1, steps=6)
    spec = ModelSpec("resnet18", (3, 32, 32), "classify", classes=3)
    status = tmp_path / "status"
    status.mkdir()
    source = make_source(cfg, spec, torch.device("cpu"), 0, 1, str(status))
    try:
        for _ in range(7):  # 3 batches an epoch: epochs 0, 1 and the first of 2
            x, y, info = source.next_batch()
            assert x.shape == (4, 3, 32, 32) and x.dtype == torch.uint8 and y.shape == (4,)
            assert info["samples"] == 4 and info["bytes"] > 0
        assert source.summary()["epochs"] == 3
    finally:
        source.close()


def _gpu_decode_source(root: Path, tmp_path: Path, on_corrupt: str) -> Any:
    cfg = DDPConfig(model="resnet18", image_size=32, batch_size=4, data=f"files:{root}",
                    loader_workers=1, prefetch=2, cache="warm", decode="gpu", device="cpu",
                    warmup=1, steps=2, on_corrupt=on_corrupt)
    spec = ModelSpec("resnet18", (3, 32, 32), "classify", classes=3)
    status = tmp_path / f"status-{on_corrupt}"
    status.mkdir()
    return make_source(cfg, spec, torch.device("cpu"), 0, 1, str(status))


def test_files_the_gpu_cannot_decode_are_skipped_and_named_or_fail_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As with --decode on: a file that is no JPEG at all is named by its loader; one that
    starts as a JPEG but the GPU's decoder refuses (truncated) is found in its batch, left
    out, counted and named; --on-corrupt fail stops the run naming it."""
    from tunelab.bench.ddp import gpudecode
    from tunelab.bench.ddp.dataset import index_dataset

    root = tmp_path / "img"
    make_dataset(MakeDataConfig(str(root), "imagenet", 12, classes=3, scale=0.05, jobs=1))
    index = index_dataset(str(root))
    paths = [index.path(e) for e in index.entries]
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    Path(paths[1]).write_bytes(png.getvalue())  # no JPEG at all
    Path(paths[2]).write_bytes(Path(paths[2]).read_bytes()[:400])  # truncated
    monkeypatch.setattr(gpudecode, "decode_batch", _pil_decode)
    source = _gpu_decode_source(root, tmp_path, "skip")
    try:
        batches = [source.next_batch() for _ in range(3)]  # the epoch: 12 files
        for x, y, info in batches:
            assert x.shape == (info["samples"], 3, 32, 32) and y.shape == (info["samples"],)
            assert info["samples"] + info["corrupt"] == 4
        assert sum(info["corrupt"] for _, _, info in batches) == 2
        names = source.summary()["corrupt_files"]
        assert len(names) == 2
        assert any(paths[1] in n and "not a JPEG file" in n for n in names), names
        assert any(paths[2] in n and "undecodable on the GPU" in n for n in names), names
    finally:
        source.close()
    Path(paths[1]).write_bytes(Path(paths[3]).read_bytes())  # only the truncated one left
    source = _gpu_decode_source(root, tmp_path, "fail")
    try:
        with pytest.raises(LoaderFailure, match=rf"corrupt sample {paths[2]} \(undecodable "
                                                r"on the GPU: .*\(--on-corrupt fail\)"):
            for _ in range(3):
                source.next_batch()
    finally:
        source.close()


def test_an_encoded_batch_without_some_files_keeps_the_others_and_their_names() -> None:
    files = [b"\xff\xd8\xffa", b"\xff\xd8\xffbb", b"\xff\xd8\xffccc"]
    data = torch.frombuffer(bytearray(b"".join(files)), dtype=torch.uint8)
    enc = Encoded(data, (4, 9, 15), ("a.jpg", "b.jpg", "c.jpg"))
    rest = enc.without({1})
    assert [bytes(f.numpy()) for f in rest.files()] == [files[0], files[2]]
    assert rest.names == ("a.jpg", "c.jpg") and rest.name(1) == "c.jpg"
    assert enc.without({0, 1, 2}).files() == []
    assert Encoded(data, (4, 9, 15)).name(2) == "file 3 of the batch"


def test_a_batch_of_files_crosses_from_a_loader_process_as_one_buffer(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from tunelab.bench.ddp.dataset import index_dataset
    from tunelab.bench.ddp.handover import pack, unpack
    from tunelab.bench.ddp.samples import FileSamples

    make_dataset(MakeDataConfig(str(tmp_path / "img"), "imagenet", 6, classes=2, scale=0.05,
                                jobs=1))
    index = index_dataset(str(tmp_path / "img"))
    dataset = FileSamples(index, Decoder("images", 32, 128, False, encoded=True), False)
    loader = DataLoader(dataset, batch_sampler=[[0, 1, 2], [3, 4, 5]], collate_fn=pack,
                        num_workers=1)
    files = [Path(index.path(index.entries[i])).read_bytes() for i in range(6)]
    for k, batch in enumerate(loader):
        batch = unpack(batch)
        assert isinstance(batch.x, Encoded) and batch.x.data.dtype == torch.uint8
        assert [bytes(f.numpy()) for f in batch.x.files()] == files[3 * k:3 * k + 3]
        assert batch.y.shape == (3,) and batch.info["samples"] == 3
        assert batch.info["bytes"] == sum(map(len, files[3 * k:3 * k + 3]))
    empty = Encoded(torch.zeros(0, dtype=torch.uint8), ())
    assert empty.files() == []


def test_decode_batch_end_to_end_where_torchvision_decodes_jpeg(tmp_path: Path) -> None:
    """The whole of decode_batch on the CPU where torchvision's own JPEG decoder loads (the
    GPU image's wheels; not the CPU wheels here): nvJPEG's call with ``device="cpu"``."""
    from tunelab.bench.ddp.gpudecode import _tiny_jpeg, decode_batch
    from tunelab.bench.ddp.models import import_torchvision

    import_torchvision()
    from torchvision.io import decode_jpeg

    try:
        decode_jpeg([torch.frombuffer(bytearray(_tiny_jpeg()), dtype=torch.uint8)])
    except RuntimeError as exc:
        pytest.skip(f"torchvision cannot decode JPEG here ({str(exc)[:60]})")
    make_dataset(MakeDataConfig(str(tmp_path / "img"), "imagenet", 5, classes=2, scale=0.05,
                                jobs=1))
    files = [torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8)
             for p in sorted((tmp_path / "img").rglob("*.JPEG"))]
    x = decode_batch(Encoded.join(files), 48, torch.device("cpu"),
                     torch.Generator().manual_seed(0))
    assert x.shape == (5, 3, 48, 48) and x.dtype == torch.uint8 and int(x.max()) > 0
    files[3] = files[3][:300]  # truncated: the batch fails, the file is found
    with pytest.raises(UndecodableImages) as bad:
        decode_batch(Encoded.join(files), 48, torch.device("cpu"))
    assert [i for i, _ in bad.value.bad] == [3] and "RuntimeError" in bad.value.bad[0][1]
