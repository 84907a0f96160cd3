"""Reading, resizing and caching images: RAM (one shared copy per node) and disk (.npy)."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from ddp_utils.data import image_cache, images
from ddp_utils.data.image_cache import DiskImageCache, SharedImageCache, normalize_cache
from ddp_utils.data.images import load_image, resized_shape
from ddp_utils.data.loader import create_dataloader
from tests.data.conftest import WarningLines
from tests.data.test_decoder_text import DECODER_KINDS, UNDECODABLE, write_decoder_kinds
from tests.data.test_headers import EXTRANEOUS, write_jpeg_kinds
from tests.multiproc import REPO_ROOT, describe, launch, records


def write_images(directory: Path, sizes: list[tuple[int, int]], seed: int = 0) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    files = []
    for i, (h, w) in enumerate(sizes):
        base = rng.integers(0, 255, (h // 8 + 1, w // 8 + 1, 3)).astype(np.uint8)
        img = cv2.resize(base, (w, h), interpolation=cv2.INTER_LINEAR)
        path = directory / f"{i:03d}.jpg"
        cv2.imwrite(str(path), img)
        files.append(str(path))
    return files


def shapes_of(files: list[str], imgsz: int) -> np.ndarray:
    return np.array([resized_shape(*cv2.imread(f).shape[:2], imgsz) for f in files])


def test_load_image_resizes_long_side(tmp_path):
    (f,) = write_images(tmp_path, [(120, 200)])
    img, (h0, w0), (h, w) = load_image(f, 100)
    assert (h0, w0) == (120, 200) and (h, w) == (60, 100) == img.shape[:2]
    assert img.dtype == np.uint8 and img.shape[2] == 3


def test_load_image_interpolation_depends_on_augment(tmp_path):
    (f,) = write_images(tmp_path, [(120, 200)])
    area, _, _ = load_image(f, 50, augment=False)
    linear, _, _ = load_image(f, 50, augment=True)
    raw = cv2.imread(f)
    np.testing.assert_array_equal(area, cv2.resize(raw, (50, 30), interpolation=cv2.INTER_AREA))
    np.testing.assert_array_equal(linear, cv2.resize(raw, (50, 30), interpolation=cv2.INTER_LINEAR))


def test_unreadable_image_names_the_file(tmp_path):
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"not an image")
    with pytest.raises(ValueError, match="broken.jpg"):
        load_image(bad, 64)
    with pytest.raises(FileNotFoundError, match="missing.jpg"):
        load_image(tmp_path / "missing.jpg", 64)


def _jpeg(path: Path, orientation: int = 1, **save) -> Path:
    from PIL import Image

    pixels = cv2.GaussianBlur(np.random.default_rng(orientation).integers(0, 256, (37, 61, 3), np.uint8), (0, 0), 2)
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    Image.fromarray(pixels).save(path, "JPEG", exif=exif, **save)
    return path


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("decoder", ["simplejpeg", "opencv"])
def test_read_image_gives_opencvs_upright_pixels(tmp_path, monkeypatch, orientation, decoder):
    if decoder == "opencv":
        monkeypatch.setattr(images, "simplejpeg", None)
    elif images.simplejpeg is None:
        pytest.skip("simplejpeg not installed")
    path = _jpeg(tmp_path / "a.jpg", orientation)
    expected = cv2.imread(str(path), cv2.IMREAD_COLOR)
    assert expected.shape[:2] == ((61, 37) if orientation >= 5 else (37, 61))  # OpenCV turned it
    np.testing.assert_array_equal(images.read_image(path), expected)


@pytest.mark.parametrize("save", [{"subsampling": 0}, {"progressive": True}, {"quality": 30}])
def test_read_image_matches_opencv_on_other_jpegs(tmp_path, save):
    path = _jpeg(tmp_path / "a.jpg", **save)
    np.testing.assert_array_equal(images.read_image(path), cv2.imread(str(path), cv2.IMREAD_COLOR))


def test_damaged_jpeg_goes_to_opencv(tmp_path):
    path = _jpeg(tmp_path / "a.jpg")
    path.write_bytes(path.read_bytes()[:-300])  # cut off: simplejpeg's lenient decode keeps OpenCV's pixels
    expected = cv2.imread(str(path), cv2.IMREAD_COLOR)
    np.testing.assert_array_equal(images.read_image(path), expected)
    with pytest.raises(FileNotFoundError, match="missing.jpg"):
        images.read_image(tmp_path / "missing.jpg")


@pytest.mark.parametrize(
    ("kind", "libjpeg"), [("overwritten", EXTRANEOUS), ("truncated", "Premature end of JPEG file")]
)
def test_a_damaged_jpeg_is_named_once_with_opencvs_pixels_and_nothing_raw(tmp_path, capfd, said, kind, libjpeg):
    path = write_jpeg_kinds(tmp_path)[kind]
    expected = cv2.imread(str(path), cv2.IMREAD_COLOR)  # today's pixels (OpenCV prints libjpeg's text here)
    capfd.readouterr()
    for _ in range(3):
        np.testing.assert_array_equal(images.read_image(path), expected)
    tile = load_image(path, 32, augment=True)[0]
    np.testing.assert_array_equal(tile, cv2.resize(expected, (32, 24), interpolation=cv2.INTER_LINEAR))
    assert "JPEG" not in capfd.readouterr().err  # libjpeg's own text never reaches stderr
    lines = [line for line in said if str(path) in line]
    assert len(lines) == 1 and lines[0].startswith(f"{path}: damaged JPEG data (libjpeg: "), lines
    assert libjpeg in lines[0] and lines[0].endswith("; the CPU decoder's pixels are used")
    assert images.image_noted(str(path))


@pytest.mark.parametrize("kind", ["progressive", "grey", "cmyk", "rgb_coded", "rotated"])
def test_sound_jpegs_of_every_kind_decode_silently_as_opencv_does(tmp_path, capfd, said, kind):
    path = write_jpeg_kinds(tmp_path)[kind]
    expected = cv2.imread(str(path), cv2.IMREAD_COLOR)
    np.testing.assert_array_equal(images.read_image(path), expected)
    assert capfd.readouterr().err == "" and not said and not images.image_noted(str(path))


@pytest.mark.parametrize("kind", sorted(DECODER_KINDS))
def test_an_image_its_decoder_warns_about_is_named_once_with_opencvs_pixels_and_nothing_raw(
    tmp_path, capfd, said, kind
):
    # libpng's and libtiff's own words (through OpenCV's C code, on stderr) at every decode, before
    path, words = write_decoder_kinds(tmp_path)[kind], DECODER_KINDS[kind][1]
    expected = cv2.imread(str(path), cv2.IMREAD_COLOR)
    capfd.readouterr()
    for _ in range(3):
        np.testing.assert_array_equal(images.read_image(path), expected)
    np.testing.assert_array_equal(load_image(path, 32)[0], cv2.resize(expected, (32, 24), interpolation=cv2.INTER_AREA))
    lines = [line for line in said if str(path) in line]
    assert len(lines) == 1 and lines[0].startswith(f"{path}: decoded with a warning ("), said
    assert words in lines[0] and lines[0].endswith("; the CPU decoder's pixels are used"), lines
    err = capfd.readouterr().err.splitlines()  # the logger's one line; nothing of the decoder's own
    assert all(line.startswith(f"{path}: decoded with a warning (") for line in err) and len(err) <= 1, err
    assert images.image_noted(str(path))


@pytest.mark.parametrize("kind", sorted(UNDECODABLE))
def test_an_image_opencv_cannot_decode_raises_naming_the_file_and_the_decoders_words(tmp_path, capfd, said, kind):
    path, words = write_decoder_kinds(tmp_path)[kind], UNDECODABLE[kind][1]
    capfd.readouterr()
    with pytest.raises(ValueError, match="corrupt or unsupported format") as raised:
        images.read_image(path)
    assert str(raised.value).startswith(f"cannot decode image {path}: ") and words in str(raised.value)
    assert capfd.readouterr().err == "" and not said


@pytest.mark.parametrize("kind", ["plain_png", "plain_tif", "plain_webp", "plain_bmp"])
def test_sound_images_of_other_formats_decode_silently_as_opencv_does(tmp_path, capfd, said, kind):
    path = write_decoder_kinds(tmp_path)[kind]
    expected = cv2.imread(str(path), cv2.IMREAD_COLOR)
    capfd.readouterr()
    np.testing.assert_array_equal(images.read_image(path), expected)
    assert capfd.readouterr().err == "" and not said and not images.image_noted(str(path))


def _notes_in_child(before_fork: str, after_fork: str, new: str, parent_noted, results) -> None:
    handler = WarningLines()
    images.LOGGER.addHandler(handler)
    images.note_bad_image(new, "first met here")
    images.note_bad_image(new, "met again")
    parent_noted.wait(30)
    images.note_bad_image(before_fork, "said by the parent before the fork")
    images.note_bad_image(after_fork, "said by the parent since")
    results.put((images.image_noted(before_fork), images.image_noted(after_fork), handler.lines))


@pytest.mark.timeout(60)
def test_note_bad_image_says_it_once_for_a_process_and_its_forked_workers(tmp_path, said):
    import multiprocessing

    before, after, new = (str(tmp_path / f"{name}.jpg") for name in ("before", "after", "new"))
    images.note_bad_image(before, "a progressive JPEG")
    images.note_bad_image(before, "a progressive JPEG")
    context = multiprocessing.get_context("fork")
    results, parent_noted = context.Queue(), context.Event()
    child = context.Process(target=_notes_in_child, args=(before, after, new, parent_noted, results))
    child.start()  # a loader worker: forked before the training process meets ``after``
    images.note_bad_image(after, "the device could not decode it")
    parent_noted.set()
    knew_before, knew_after, said_in_child = results.get(timeout=30)
    child.join(30)
    assert child.exitcode == 0 and knew_before and knew_after
    assert said_in_child == [f"{new}: first met here; the CPU decoder's pixels are used"]  # once, in the worker
    assert images.image_noted(new)  # the worker's note reached the parent
    images.note_bad_image(new, "met in the parent later")
    assert said == [
        f"{before}: a progressive JPEG; the CPU decoder's pixels are used",
        f"{after}: the device could not decode it; the CPU decoder's pixels are used",
    ]


def test_normalize_cache_rejects_unknown_modes():
    assert normalize_cache(True) == "ram" and normalize_cache("RAM") == "ram" and normalize_cache(None) is None
    with pytest.raises(ValueError, match="'gpu'"):
        normalize_cache("gpu")


def test_shared_cache_matches_decoding_and_pickles_without_data(tmp_path):
    files = write_images(tmp_path, [(100, 160), (160, 90), (64, 64)])
    shapes = shapes_of(files, 96)
    cache = SharedImageCache.build(files, shapes, 96)
    assert cache is not None and Path(cache.path).is_file()
    assert cache.path.startswith("/dev/shm") or cache.path.startswith(os.path.realpath("/tmp"))
    for i, f in enumerate(files):
        np.testing.assert_array_equal(cache[i], load_image(f, 96)[0])
        assert not cache[i].flags.writeable
    blob = pickle.dumps(cache)
    assert len(blob) < 2000 < cache.nbytes  # path and index only, not the pixels
    clone = pickle.loads(blob)
    np.testing.assert_array_equal(clone[1], cache[1])


def test_shared_cache_falls_back_to_disk_when_shm_is_small(tmp_path, monkeypatch, ddp_log):
    files = write_images(tmp_path, [(80, 80), (60, 90)])
    real = image_cache.disk_free
    monkeypatch.setattr(image_cache, "disk_free", lambda d: 64 if str(d) == "/dev/shm" else real(d))
    monkeypatch.setattr(image_cache, "_job_id", lambda: f"test-fallback-{os.getpid()}")
    cache = SharedImageCache.build(files, shapes_of(files, 64), 64)
    assert cache is not None and not cache.path.startswith("/dev/shm")
    assert "too small" in ddp_log.text
    np.testing.assert_array_equal(cache[0], load_image(files[0], 64)[0])
    os.unlink(cache.path)


def test_shared_cache_refuses_when_memory_is_short(tmp_path, monkeypatch, ddp_log):
    files = write_images(tmp_path, [(80, 80)])
    monkeypatch.setattr(image_cache, "mem_available", lambda: 1000)
    assert SharedImageCache.build(files, shapes_of(files, 64), 64) is None
    assert "not caching images in RAM" in ddp_log.text


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_shared_cache_file_removed_at_exit(tmp_path):
    files = write_images(tmp_path, [(50, 50)])
    code = (
        "import sys, numpy as np; from ddp_utils.data.image_cache import SharedImageCache;"
        f"c = SharedImageCache.build([{files[0]!r}], np.array([[50, 50]]), 50); print(c.path)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    path = out.stdout.strip()
    assert out.returncode == 0 and path, out.stderr
    assert not Path(path).exists()


class _CacheReader(torch.utils.data.Dataset):
    def __init__(self, cache):
        self.cache = cache

    def __len__(self):
        return len(self.cache)

    def __getitem__(self, i):
        return int(self.cache[i].sum(dtype=np.int64))


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_shared_cache_in_spawned_workers(tmp_path):
    files = write_images(tmp_path, [(40, 60), (60, 40), (50, 50)])
    cache = SharedImageCache.build(files, shapes_of(files, 48), 48)
    expected = [int(cache[i].sum(dtype=np.int64)) for i in range(3)]
    for context in ("spawn", "fork"):
        loader = torch.utils.data.DataLoader(
            _CacheReader(cache), batch_size=None, num_workers=1, multiprocessing_context=context
        )
        assert [int(v) for v in loader] == expected, context


def test_disk_cache_written_reused_and_invalidated(tmp_path):
    files = write_images(tmp_path, [(100, 160), (160, 90)])
    shapes = shapes_of(files, 64)
    cache = DiskImageCache(files, shapes, 64)
    assert cache.build() == 2
    assert all(Path(p).is_file() for p in cache.npy_files)
    assert not list(tmp_path.glob(".*.tmp"))
    np.testing.assert_array_equal(cache[0], load_image(files[0], 64)[0])
    assert DiskImageCache(files, shapes, 64).build() == 0
    time.sleep(0.01)
    write_images(tmp_path, [(100, 160)], seed=9)  # the first image changes
    again = DiskImageCache(files, shapes, 64)
    assert again.build() == 1
    np.testing.assert_array_equal(again[0], load_image(files[0], 64)[0])


def test_disk_cache_repairs_a_truncated_file(tmp_path):
    files = write_images(tmp_path, [(64, 64)])
    cache = DiskImageCache(files, shapes_of(files, 32), 32)
    cache.build()
    Path(cache.npy_files[0]).write_bytes(b"\x93NUMPY")
    np.testing.assert_array_equal(cache[0], load_image(files[0], 32)[0])


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_ram_cache_one_copy_per_node(tmp_path):
    """Two processes on one node hold ONE copy of the decoded images between them.

    Measured per process (see ``data_scenarios.ram_cache_pss``): the cache file's pages,
    shared, sum to one buffer over both processes; and neither the builder (rank 0) nor
    the follower (rank 1) grew its private anonymous memory by more than a fifth of the
    buffer, so a private copy anywhere, in either, fails. And no second file holds it.
    """
    from ddp_utils.data.synthetic import make_shapes_dataset

    root = make_shapes_dataset(tmp_path / "shapes", 40, 0, size=(480, 640))
    workers = launch("tests.workers.data_scenarios:ram_cache_pss", nprocs=2, timeout=100, args=(str(root), "640"))
    assert all(w.returncode == 0 for w in workers), describe(workers)
    recs = records(workers)
    assert recs[0]["path"] == recs[1]["path"] and recs[0]["checksum"] == recs[1]["checksum"]
    assert recs[0]["touched"] == 40
    buffer_kib = recs[0]["nbytes"] / 1024
    assert buffer_kib > 20_000  # big enough to stand out from the noise
    mapped = sum(r["mapping_pss_kib"] for r in recs)
    assert 0.9 * buffer_kib < mapped < 1.1 * buffer_kib, (mapped, buffer_kib)  # one copy, split in two
    for role, r in zip(("builder", "follower"), recs):
        assert r["anon_delta_kib"] < 0.2 * buffer_kib, (role, r["anon_delta_kib"], buffer_kib)
    stem = Path(recs[0]["path"]).name.split(".")[0]
    assert not list(Path(recs[0]["path"]).parent.glob(f"{stem}.*"))  # one file, removed when its builder left


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ram_cache_builder_keeps_no_decode_buffers(tmp_path):
    """The builder decoding with 16 threads, as on a 16-core host, keeps no private copy.

    glibc's malloc gives each decoding thread an arena that kept its freed image-sized
    blocks resident, ~2.5 MB a thread: with 16 threads three quarters of this buffer again,
    private to the builder (issue 12's "2.0x" on a GPU host). The cache now decodes into
    the shared buffer and anonymous mappings it hands back.
    """
    from ddp_utils.data.synthetic import make_shapes_dataset

    root = make_shapes_dataset(tmp_path / "shapes", 40, 0, size=(480, 640))
    (worker,) = launch("tests.workers.data_scenarios:ram_cache_builder", nprocs=1, timeout=100, args=(str(root),))
    assert worker.returncode == 0, describe([worker])
    (rec,) = records([worker])
    buffer_kib = rec["nbytes"] / 1024
    assert buffer_kib > 20_000
    assert rec["anon_delta_kib"] < 0.2 * buffer_kib, (rec["anon_delta_kib"], buffer_kib)


def test_buffers_of_dead_jobs_are_removed(tmp_path, monkeypatch):
    files = write_images(tmp_path / "img", [(40, 40)])
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(image_cache, "_SHM_DIR", shm)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = shm / f"ddp_utils_images_0123456789abcdef0123.{dead.stdout.strip()}.bin"
    orphan.write_bytes(b"x" * 100)
    alive = shm / f"ddp_utils_images_0123456789abcdef0124.{os.getpid()}.bin"
    alive.write_bytes(b"x" * 100)
    cache = SharedImageCache.build(files, shapes_of(files, 32), 32)
    assert cache is not None and Path(cache.path).parent == shm
    assert not orphan.exists() and alive.exists()


_LOADER_RUN = """
import sys
from ddp_utils.data.loader import create_dataloader
from tests.workers.data_scenarios import HYP

images = sys.argv[1]
for augment_on, augment in (("workers", False), ("device", True)):  # letterboxed: every image every epoch
    loader, _ = create_dataloader(images, 64, 2, 32, hyp=dict(HYP, mosaic=0.0), augment=augment, workers=2,
                                  shuffle=augment, augment_on=augment_on)
    for epoch in range(3):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_training_loader_names_each_odd_jpeg_once_and_prints_no_libjpeg_text(tmp_path):
    # both paths, 2 workers, 3 epochs: the damaged JPEG decoded in the workers is named once (libjpeg printed its
    # text at every decode), the cut-off one once by the label scan, and each JPEG the device's batched decode does
    # not take once, by the device path's planning workers; stderr holds nothing else about them
    images_dir = tmp_path / "images" / "train"
    kinds = write_jpeg_kinds(images_dir)
    for i in range(4):
        (images_dir / f"plain{i}.jpg").write_bytes(kinds["baseline"].read_bytes())
    run = subprocess.run(
        [sys.executable, "-c", _LOADER_RUN, str(images_dir)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=150
    )
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert not [line for line in lines if "JPEG" in line and not line.startswith(str(images_dir))], run.stderr
    for kind, why in {
        "overwritten": "damaged JPEG data (libjpeg: Corrupt JPEG data: ",
        "truncated": "corrupt image, skipped",
        "progressive": "a progressive JPEG, which nvJPEG's batched decode (the device path on a GPU) does not take",
        "grey": "a greyscale JPEG, which",
        "cmyk": "a CMYK (4-component) JPEG, which",
        "rgb_coded": "an RGB-coded (not YCbCr) JPEG, which",
    }.items():
        named = [line for line in lines if line.startswith(f"{kinds[kind]}: ")]
        assert len(named) == 1 and why in named[0], (kind, run.stderr)
        assert kind != "overwritten" or EXTRANEOUS in named[0]
    for kind in ("baseline", "rotated"):
        assert not [line for line in lines if line.startswith(f"{kinds[kind]}: ")], run.stderr


def _decoder_dataset(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    """Images of every kind a decoder speaks about, sound ones, and two the scan rejects (cut short)."""
    images_dir = tmp_path / "images" / "train"
    kinds = write_decoder_kinds(images_dir)
    kinds.pop("no_iend").unlink()  # PIL reads it, OpenCV does not: the scan would keep what the loader cannot read
    return images_dir, kinds


def _assert_each_named_once_and_nothing_raw(err: str, kinds: dict[str, Path], images_dir: Path) -> None:
    lines = err.splitlines()
    for kind, path in kinds.items():
        named = [line for line in lines if line.startswith(f"{path}: ")]
        if kind in DECODER_KINDS:  # by the scan (PIL's words) or by the loader's decoder (OpenCV's), once
            words = DECODER_KINDS[kind][2] or DECODER_KINDS[kind][1]
            assert len(named) == 1 and "decoded with a warning (" in named[0] and words in named[0], (kind, err)
        elif kind in UNDECODABLE:
            assert len(named) == 1 and "corrupt image, skipped" in named[0], (kind, err)
        else:
            assert not named, (kind, err)
    raw = [line for line in lines if not line.startswith(str(images_dir)) and re.search(RAW_DECODER_TEXT, line)]
    assert not raw, err


RAW_DECODER_TEXT = r"libpng|TIFF|\[ ?(WARN|ERROR)|Warning|EXIF|Truncated|Read Error"


@pytest.mark.timeout(120)
def test_a_loaders_workers_name_each_image_a_decoder_warns_about_once_and_print_no_decoder_text(tmp_path, capfd):
    # 2 forked workers, 2 epochs: the workers' stderr is this test's (capfd), where libpng's and libtiff's words
    # came at every decode
    from ddp_utils.log import set_logging

    set_logging(-1)  # the library's lines on stderr, as train.py has them (pytest's log capture stays in this process)
    images_dir, kinds = _decoder_dataset(tmp_path)
    capfd.readouterr()
    loader, dataset = create_dataloader(images_dir, 64, 2, 32, workers=2)
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert sum(len(batch[0]) for batch in loader) == len(dataset.im_files) == len(kinds) - len(UNDECODABLE) + 1
    _assert_each_named_once_and_nothing_raw(capfd.readouterr().err, kinds, images_dir)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_training_loader_on_either_path_names_each_image_a_decoder_warns_about_once_and_prints_no_decoder_text(
    tmp_path,
):
    # a process of its own, as train.py: both paths (the device path decodes these formats on the CPU too), 2
    # workers, 3 epochs; its whole stderr holds one line per file a decoder warned about or the scan skipped
    images_dir, kinds = _decoder_dataset(tmp_path)
    run = subprocess.run(
        [sys.executable, "-c", _LOADER_RUN, str(images_dir)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=150
    )
    assert run.returncode == 0, run.stderr
    _assert_each_named_once_and_nothing_raw(run.stderr, kinds, images_dir)
