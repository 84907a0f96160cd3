"""Finding images, verifying images and labels, and the label cache, on real files."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import pickle
import shutil
import subprocess
import zipfile
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from ddp_utils.data import label_scan
from ddp_utils.data import labels as labels_module
from ddp_utils.data.labels import (
    IMG_FORMATS,
    find_images,
    img2label_paths,
    label_cache_path,
    load_labels,
)
from ddp_utils.log import LOGGER
from tests.data.test_decoder_text import DECODER_KINDS, write_decoder_kinds
from tests.multiproc import describe, launch, records


def write_image(path: Path, width: int = 48, height: int = 40, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
    assert cv2.imwrite(str(path), img)
    return path


def write_label(im_path: Path, text: str) -> Path:
    lb_path = Path(img2label_paths([str(im_path)])[0])
    lb_path.parent.mkdir(parents=True, exist_ok=True)
    lb_path.write_text(text)
    return lb_path


GOOD = "0 0.5 0.5 0.2 0.3\n1 0.25 0.25 0.1 0.1\n"


@pytest.fixture
def log_records():
    """Records of the ddp_utils logger, captured on the logger itself (set_logging stops propagation)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    level = LOGGER.level
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.DEBUG)
    yield records
    LOGGER.removeHandler(handler)
    LOGGER.setLevel(level)


@pytest.fixture
def dataset(tmp_path: Path) -> dict[str, Path]:
    """A split of good images and every kind of bad one, keyed by role."""
    images = tmp_path / "ds" / "images" / "train"
    files: dict[str, Path] = {}

    def add(name: str, label: str | None, **kwargs) -> Path:
        path = write_image(images / name, **kwargs)
        if label is not None:
            write_label(path, label)
        files[name.split(".")[0]] = path
        return path

    add("good.jpg", GOOD)
    add("good_png.png", "2 0.5 0.5 1.0 1.0\n")
    add("missing_label.jpg", None)
    add("empty_label.jpg", "\n  \n")
    add("duplicates.jpg", "0 0.5 0.5 0.2 0.2\n0 0.5 0.5 0.2 0.2\n1 0.1 0.1 0.1 0.1\n")
    add("segment.jpg", "3 0.1 0.2 0.5 0.1 0.4 0.7 0.2 0.6\n")
    add("wrong_columns.jpg", "0 0.5 0.5 0.2\n")
    add("six_columns.jpg", "0 0.5 0.5 0.2 0.2 0.1\n")
    add("out_of_range.jpg", "0 0.5 1.2 0.2 0.2\n")
    add("negative_class.jpg", "-1 0.5 0.5 0.2 0.2\n")
    add("non_numeric.jpg", "0 0.5 abc 0.2 0.2\n")
    add("tiny.png", GOOD, width=8, height=8)
    truncated = add("truncated.jpg", GOOD, width=64, height=64)
    truncated.write_bytes(truncated.read_bytes()[:-200])  # a cut-off download
    trailing = add("trailing_bytes.jpg", GOOD)
    trailing.write_bytes(trailing.read_bytes() + b"\x00" * 16)  # complete, with junk after the end marker
    broken_png = add("broken_png.png", GOOD)
    broken_png.write_bytes(broken_png.read_bytes()[:-30])
    garbage = add("garbage.jpg", GOOD)
    garbage.write_bytes(os.urandom(500))
    return files


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.name.endswith(".cache")}


def test_img_formats_are_lower_case_extensions() -> None:
    assert set(IMG_FORMATS) == {"bmp", "jpeg", "jpg", "png", "tif", "tiff", "webp"}


def test_find_images_directory_list_and_mixed(tmp_path: Path) -> None:
    a = write_image(tmp_path / "d" / "a.JPG")
    b = write_image(tmp_path / "d" / "sub" / "b.png")
    (tmp_path / "d" / "notes.txt").write_text("not an image list: ignored inside a directory\n")
    (tmp_path / "d" / "c.gif").write_bytes(b"GIF89a")
    assert find_images(tmp_path / "d") == sorted([str(a), str(b)])

    other = write_image(tmp_path / "e" / "x.jpeg")
    listing = tmp_path / "list.txt"
    listing.write_text(f"./d/a.JPG\n\n{other}\nd/sub/b.png\n")
    assert find_images(listing) == sorted([str(a), str(b), str(other)])
    assert find_images([tmp_path / "d", str(other), listing]) == sorted([str(a), str(b), str(other)])


def test_find_images_survives_a_symlink_loop(tmp_path: Path) -> None:
    a = write_image(tmp_path / "d" / "sub" / "a.jpg")
    (tmp_path / "d" / "sub" / "loop").symlink_to(tmp_path / "d")
    assert find_images(tmp_path / "d") == [str(a)]


def test_find_images_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        find_images(tmp_path / "nowhere", prefix="train: ")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no images in .*empty"):
        find_images(tmp_path / "empty")


def test_label_paths_follow_the_images_labels_rule() -> None:
    im = f"{os.sep}data{os.sep}images{os.sep}x{os.sep}images{os.sep}train{os.sep}a.b.jpg"
    assert img2label_paths([im]) == [f"{os.sep}data{os.sep}images{os.sep}x{os.sep}labels{os.sep}train{os.sep}a.b.txt"]
    cache = label_cache_path([im])
    assert cache.parent == Path(f"{os.sep}data{os.sep}images{os.sep}x{os.sep}labels")
    assert cache.name == "train.ddp.cache"


def test_bad_files_are_reported_by_file_and_skipped(dataset: dict[str, Path], log_records) -> None:
    root = dataset["good"].parents[2]
    before = snapshot(root)
    im_files = find_images(root / "images" / "train")
    result = load_labels(im_files, workers=2)

    kept = {Path(p).stem for p in result.im_files}
    assert kept == {
        "good",
        "good_png",
        "missing_label",
        "empty_label",
        "duplicates",
        "segment",
        "trailing_bytes",
    }
    bad = set(dataset) - kept
    assert result.counts["corrupt"] == len(bad)
    assert result.counts["missing"] == 1 and result.counts["empty"] == 1
    assert result.counts["found"] == len(kept) - 2
    for name in bad:
        assert any(f"{name}." in m for m in result.messages), f"no message names {name}: {result.messages}"
        assert any(f"{name}." in r.getMessage() and r.levelno == logging.WARNING for r in log_records)
    for name, words in {
        "wrong_columns": "4 columns",
        "six_columns": "6 columns",
        "out_of_range": "outside 0-1",
        "negative_class": "class -1",
        "non_numeric": "abc",
        "tiny": "below 10",
        "truncated": "corrupt image",
    }.items():
        assert any(f"{name}." in m and words in m for m in result.messages), (name, result.messages)
    assert snapshot(root) == before, "verification must not modify the user's files"
    summary = [r.getMessage() for r in log_records if "images (scan" in r.getMessage()]
    assert summary and f"{len(kept) - 2} found, 1 missing, 1 empty, {len(bad)} corrupt" in summary[0]

    # in the same process (a val split of the same images, as coco128's) the list is not given again
    log_records.clear()
    assert load_labels(im_files).messages == result.messages
    assert not [r for r in log_records if "truncated." in r.getMessage()]
    assert any("images (cache" in r.getMessage() and f"{len(bad)} corrupt" in r.getMessage() for r in log_records)

    # from the cache in another process (a later run), the same report, repeated at INFO: only the scan warns
    log_records.clear()
    labels_module._REPORTED.clear()  # what a new process starts with
    assert load_labels(im_files).messages == result.messages
    problems = [r for r in log_records if "truncated." in r.getMessage()]
    assert problems and all(r.levelno == logging.INFO for r in problems)

    by_name = {Path(p).stem: i for i, p in enumerate(result.im_files)}
    np.testing.assert_allclose(result.labels[by_name["good"]], np.loadtxt(io.StringIO(GOOD), ndmin=2))
    assert result.labels[by_name["missing_label"]].shape == (0, 5)
    assert result.labels[by_name["empty_label"]].shape == (0, 5)
    assert result.labels[by_name["good"]].dtype == np.float32
    assert tuple(result.shapes[by_name["good"]]) == (48, 40)
    assert result.shapes.dtype == np.int64 and result.shapes.shape == (len(kept), 2)
    assert result.label_files[by_name["good"]].endswith(f"labels{os.sep}train{os.sep}good.txt")


@pytest.mark.parametrize("workers", [1, 4])
def test_an_image_pil_warns_about_is_kept_and_named_once_by_the_scan_not_by_pils_text(
    tmp_path: Path, capfd, log_records, monkeypatch, workers: int
) -> None:
    # PIL (the scan's decoder for what the headers do not settle) printed its UserWarning raw, once per place
    paths = write_decoder_kinds(tmp_path / "images" / "train")
    monkeypatch.setattr(label_scan, "threads_pay", lambda *times: True)  # with 4: all but 64 verified in threads
    warned = [paths["tiff_exif"]]
    for i in range(80):  # the same warning from many files, not only a place's first
        warned.append(paths["tiff_exif"].with_name(f"tiff_exif_{i:02d}.tif"))
        warned[-1].write_bytes(paths["tiff_exif"].read_bytes())
    sound = [p for k, p in paths.items() if k.startswith("plain") or k in DECODER_KINDS and k != "tiff_exif"]
    capfd.readouterr()
    result = load_labels([str(p) for p in sound + warned], workers=workers)
    assert len(result.im_files) == len(sound + warned) and result.counts["corrupt"] == 0  # every one kept
    expected = [f"{p}: decoded with a warning (PIL: {DECODER_KINDS['tiff_exif'][2]}); kept" for p in warned]
    assert sorted(result.messages) == sorted(expected), result.messages  # once each; nothing of the others
    shown = [r.getMessage() for r in log_records if r.levelno == logging.WARNING and "decoded with" in r.getMessage()]
    assert len(shown) == 30 and set(shown) <= set(expected)  # the scan's usual report: the first 30, then a count
    err = capfd.readouterr().err
    assert "Warning" not in err and "warnings.warn" not in err, err  # PIL's own text: "UserWarning: Truncated..."


def test_duplicates_dropped_with_a_warning(dataset: dict[str, Path]) -> None:
    result = load_labels([str(dataset["duplicates"]), str(dataset["good"])])
    labels = result.labels[result.im_files.index(str(dataset["duplicates"]))]
    np.testing.assert_allclose(labels, [[0, 0.5, 0.5, 0.2, 0.2], [1, 0.1, 0.1, 0.1, 0.1]])
    assert result.counts["duplicates"] == 1
    assert any("duplicates.txt" in m and "duplicate" in m for m in result.messages)


def test_polygons_become_boxes(dataset: dict[str, Path], tmp_path: Path) -> None:
    mixed = write_image(dataset["good"].parent / "mixed.jpg")
    write_label(mixed, "0 0.5 0.5 0.2 0.2\n1 0.1 0.1 0.3 0.1 0.3 0.3\n")
    result = load_labels([str(dataset["segment"]), str(mixed)], cache_path=tmp_path / "c.cache")
    assert [Path(p).stem for p in result.im_files] == ["mixed", "segment"]  # sorted
    seg = result.labels[1]
    np.testing.assert_allclose(seg, [[3, 0.3, 0.4, 0.4, 0.6]], atol=1e-6)  # x 0.1-0.5, y 0.1-0.7
    assert len(result.segments[1]) == 1
    np.testing.assert_allclose(result.segments[1][0], [[0.1, 0.2], [0.5, 0.1], [0.4, 0.7], [0.2, 0.6]])
    np.testing.assert_allclose(result.labels[0], [[0, 0.5, 0.5, 0.2, 0.2], [1, 0.2, 0.2, 0.2, 0.2]], atol=1e-6)
    assert [len(s) for s in result.segments[0]] == [4, 3]  # a box row keeps its place as a 4-corner polygon
    again = load_labels([str(dataset["segment"]), str(mixed)], cache_path=tmp_path / "c.cache")
    assert again.cache_loaded
    for a, b in zip(again.segments[0] + again.segments[1], result.segments[0] + result.segments[1]):
        np.testing.assert_array_equal(a, b)


def test_exif_rotation_swaps_width_and_height(tmp_path: Path) -> None:
    path = tmp_path / "images" / "r.jpg"
    path.parent.mkdir(parents=True)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees when displayed
    Image.new("RGB", (60, 30), (10, 20, 30)).save(path, exif=exif.tobytes())
    result = load_labels([str(path)])
    decoded = cv2.imread(str(path))
    assert tuple(result.shapes[0]) == (decoded.shape[1], decoded.shape[0]) == (30, 60)


def test_cache_written_loaded_and_invalidated(dataset: dict[str, Path]) -> None:
    im_files = [str(dataset[k]) for k in ("good", "good_png", "missing_label", "duplicates")]
    first = load_labels(im_files)
    assert first.cache_written and not first.cache_loaded
    assert first.cache_path == label_cache_path(im_files) and first.cache_path.is_file()
    second = load_labels(im_files)
    assert second.cache_loaded and not second.cache_written
    assert second.im_files == first.im_files and second.counts == first.counts and second.messages == first.messages
    for a, b in zip(first.labels, second.labels):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(first.shapes, second.shapes)

    # a label's content changes
    lb = Path(first.label_files[0])
    lb.write_text(GOOD + "2 0.7 0.7 0.1 0.1\n")
    third = load_labels(im_files)
    assert not third.cache_loaded and len(third.labels[0]) == 3

    # only a modification time changes: a same-size rewrite that the hash must still see
    assert load_labels(im_files).cache_loaded
    st = os.stat(dataset["good_png"])
    os.utime(dataset["good_png"], ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    assert not load_labels(im_files).cache_loaded

    # a label file appears where there was none
    assert load_labels(im_files).cache_loaded
    write_label(dataset["missing_label"], "1 0.5 0.5 0.5 0.5\n")
    fourth = load_labels(im_files)
    assert not fourth.cache_loaded and fourth.counts["missing"] == 0


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _object_array_npz(path: Path) -> None:
    with open(path, "wb") as f:
        np.savez(f, header=np.array([{"version": 1}], dtype=object))


@pytest.mark.parametrize(
    "kind", ["random", "pickle", "yolov5_npy", "object_npz", "truncated", "foreign_zip", "old", "inconsistent"]
)
def test_tampered_cache_is_rebuilt_not_trusted(dataset: dict[str, Path], tmp_path: Path, kind: str) -> None:
    im_files = [str(dataset["good"]), str(dataset["duplicates"])]
    cache = load_labels(im_files).cache_path
    good_bytes = cache.read_bytes()
    marker = tmp_path / "exploited"
    if kind == "random":
        cache.write_bytes(os.urandom(4096))
    elif kind == "pickle":
        cache.write_bytes(pickle.dumps({"labels": _Exploit(marker)}))
    elif kind == "yolov5_npy":  # what YOLOv5 writes: np.save of a dict, a pickle inside .npy
        with open(cache, "wb") as f:
            np.save(f, np.array({"hash": "x", "exploit": _Exploit(marker)}, dtype=object), allow_pickle=True)
    elif kind == "object_npz":
        _object_array_npz(cache)
    elif kind == "truncated":
        cache.write_bytes(good_bytes[: len(good_bytes) // 2])
    elif kind == "foreign_zip":
        with zipfile.ZipFile(cache, "w") as zf:
            zf.writestr("header.npy", b"not an array")
    elif kind == "old":
        arrays = dict(np.load(cache, allow_pickle=False))
        header = bytes(arrays["header"]).replace(b'"version": 1', b'"version": 0')
        arrays["header"] = np.frombuffer(header, np.uint8)
        with open(cache, "wb") as f:
            np.savez(f, **arrays)
    elif kind == "inconsistent":  # current header and hash, arrays that do not fit it
        arrays = dict(np.load(cache, allow_pickle=False))
        arrays["labels"] = arrays["labels"][:, :4]
        with open(cache, "wb") as f:
            np.savez(f, **arrays)
    result = load_labels(im_files)
    assert not marker.exists(), "loading the cache executed code"
    assert not result.cache_loaded and result.cache_written
    assert result.counts["found"] == 2 and result.counts["duplicates"] == 1
    assert load_labels(im_files).cache_loaded, "the rebuilt cache is used next time"


@contextlib.contextmanager
def read_only(directory: Path):
    """Make a directory unwritable, also for root (chattr +i), or skip the test."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(0o755)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(directory)]).returncode != 0:
        pytest.skip("cannot make a directory read-only for root here (no chattr +i)")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)


def test_read_only_dataset_keeps_the_cache_in_memory(dataset: dict[str, Path], log_records) -> None:
    im_files = [str(dataset["good"]), str(dataset["segment"])]
    cache = label_cache_path(im_files)
    labels_module._MEMORY_CACHE.pop(str(cache), None)
    with read_only(cache.parent):
        first = load_labels(im_files)
        second = load_labels(im_files)
    assert not first.cache_written and not first.cache_loaded
    assert second.cache_loaded and not second.cache_written
    assert not cache.exists() and not list(cache.parent.glob(".*tmp"))
    warnings = [r for r in log_records if "cannot write the label cache" in r.getMessage()]
    assert len(warnings) == 1 and str(cache.parent) in warnings[0].getMessage()
    np.testing.assert_array_equal(first.labels[0], second.labels[0])


def test_no_usable_images_is_an_error(dataset: dict[str, Path]) -> None:
    with pytest.raises(FileNotFoundError, match="no usable images"):
        load_labels([str(dataset["garbage"]), str(dataset["truncated"])])


HEADER_CASES = [(kind, 1) for kind in ("gray_jpeg", "png", "rgba_png", "webp", "bmp", "tiff")] + [
    (kind, orientation) for kind in ("jpeg", "progressive") for orientation in range(1, 9)
]


@pytest.mark.parametrize(("kind", "orientation"), HEADER_CASES)
def test_header_sizes_agree_with_a_full_decode(tmp_path: Path, kind: str, orientation: int) -> None:
    """The fast header read gives what decoding the image (EXIF applied) gives."""
    from PIL import ImageOps

    mode = {"gray_jpeg": "L", "rgba_png": "RGBA"}.get(kind, "RGB")
    image = Image.new(mode, (70, 33))
    path = tmp_path / "images" / f"x.{ {'progressive': 'jpg', 'gray_jpeg': 'jpg', 'rgba_png': 'png'}.get(kind, kind) }"
    path.parent.mkdir(parents=True)
    exif = Image.Exif()
    exif[0x0112] = orientation
    exif[0x010E] = "a description long enough to push the frame header further along " * 40
    options = {"progressive": True} if kind == "progressive" else {}
    if kind in ("jpeg", "progressive"):
        options["exif"] = exif.tobytes()
    image.save(path, **options)
    with Image.open(path) as im:
        expected = ImageOps.exif_transpose(im).size
    assert labels_module._image_size(str(path)) == (expected, "")  # "": the decoder warned about nothing


def test_coordinates_within_the_tolerance_are_clipped(tmp_path: Path) -> None:
    im = write_image(tmp_path / "images" / "a.jpg")
    write_label(im, "0 1.0005 0.5 0.2 0.2\n1 -0.0004 0.5 0.1 0.1\n")
    nan = write_image(tmp_path / "images" / "nan.jpg")
    write_label(nan, "0 nan 0.5 0.2 0.2\n")
    result = load_labels([str(im), str(nan)])
    np.testing.assert_allclose(result.labels[0][:, 1], [1.0, 0.0])
    assert result.im_files == [str(im)]
    assert any("nan.txt" in m and "non-finite" in m for m in result.messages)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_first_process_of_the_node_builds_the_cache_the_others_read_it(dataset: dict[str, Path]) -> None:
    workers = launch(
        "tests.workers.data_config_scenarios:labels_once_per_node",
        nprocs=2,
        timeout=120,
        args=(str(dataset["good"].parent),),
    )
    assert all(w.returncode == 0 for w in workers), describe(workers)
    by_rank = {r["rank"]: r for r in records(workers)}
    assert by_rank[0]["written"] and not by_rank[0]["loaded"], describe(workers)
    assert by_rank[1]["loaded"] and not by_rank[1]["written"], describe(workers)
    assert by_rank[0]["n"] == by_rank[1]["n"] == 7


@pytest.mark.parametrize("slow_files", [False, True])
def test_scan_uses_threads_only_when_the_files_keep_it_waiting(slow_files: bool) -> None:
    # the decision, not the time: threads verify the rest exactly when waiting for files dominated the probe
    import threading
    import time

    pairs = [(f"im{i}.jpg", f"lb{i}.txt") for i in range(200)]
    threads = set()

    def verify(pair):
        threads.add(threading.get_ident())
        if slow_files:  # a network file system: the time goes to waiting, not to the CPU
            time.sleep(0.002)
        else:  # local cached files: parsing, all CPU
            end = time.thread_time() + 0.001
            while time.thread_time() < end:
                pass
        return pair

    assert list(label_scan.verified(pairs, verify, workers=8)) == pairs  # in order either way
    assert (threads != {threading.get_ident()}) is slow_files


def test_threads_pay_only_for_time_spent_waiting_for_files():
    assert label_scan.threads_pay(wall=1.0, cpu=0.1, queued=0.0)  # waiting for a network file system
    assert not label_scan.threads_pay(wall=1.0, cpu=0.6, queued=0.0)  # parsing: CPU work
    assert not label_scan.threads_pay(wall=1.0, cpu=0.1, queued=0.85)  # a busy machine kept it queued for a CPU


def test_another_nodes_scan_lists_its_problems_at_info_so_the_job_log_has_each_once(
    dataset: dict[str, Path], log_records, monkeypatch: pytest.MonkeyPatch
) -> None:
    # node 1's first process (global rank 1 of 2, one process per node) scans its own copy of the data
    launcher = {"RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "1"}
    for name, value in launcher.items():
        monkeypatch.setenv(name, value)
    result = load_labels(find_images(dataset["good"].parent), workers=1)
    assert not result.cache_loaded and result.counts["corrupt"] > 0
    assert any("truncated." in m for m in result.messages)
    warned = [r.getMessage() for r in log_records if r.levelno >= logging.WARNING]
    assert warned == [], warned  # rank 0's scan warns about each file; this one lists them at INFO (not shown)
