"""Find images, verify them and their YOLO labels, and load them through the label cache.

A dataset in the YOLO format keeps ``images/`` and ``labels/`` side by side: the label of
``.../images/train/a.jpg`` is ``.../labels/train/a.txt``, one ``class xc yc w h`` row per
object, normalised to 0-1. Rows with more columns are polygons (``class x1 y1 x2 y2 ...``)
and become their bounding boxes.

Verification reads each image's header and checks that the file is complete (a JPEG
must end with its end-of-image marker, a PNG with its IEND chunk; other
formats are decoded), so a truncated download is caught without decoding every image.
Problems are reported by file and the image is left out; an image the decoder warns about
but decodes is kept, and its warning is reported by file in one line (never as PIL's raw
warning text); the user's files are never modified.

The result is cached beside the labels (``labels/train.ddp.cache``); the cache's format,
hash, reading and writing live in :mod:`ddp_utils.data.label_cache`.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import PIL
from PIL import Image

from ..distributed import is_main_process
from ..log import LOGGER
from .decoder_text import caught_warnings, decoder_summary
from .headers import ORIENTATION_TAG, TRANSPOSED_ORIENTATIONS, fast_image_size
from .images import mark_noted
from .label_cache import (
    _MEMORY_CACHE,
    CACHE_SUFFIX,
    _describe,
    _files_hash,
    _read_cache,
    _write_cache,
)
from .label_scan import scan

IMG_FORMATS = ("bmp", "jpeg", "jpg", "png", "tif", "tiff", "webp")
MIN_IMAGE_SIDE = 10
COORD_TOLERANCE = 1e-3  # rounding in label exporters puts coordinates a hair outside 0-1
_PIL_FORMATS = {"jpeg", "mpo", "png", "bmp", "tiff", "webp"}


@dataclass
class LabelSet:
    """The verified images of a dataset and their labels.

    Attributes:
        im_files: verified images (corrupt ones dropped), sorted absolute paths.
        label_files: the label file of each image (it may not exist: no objects).
        labels: float32 [n, 5] per image: class, xc, yc, w, h normalised; [0, 5] without objects.
        shapes: int64 [N, 2]: (width, height) of each image as decoded, EXIF orientation applied.
        segments: normalised polygons [k, 2] per object when the label file has polygons, else [].
        counts: "found", "missing", "empty", "corrupt" images and "duplicates" rows dropped.
        messages: one line per problem, naming the file.
        cache_path: where the cache lives (or would live).
        cache_loaded: the result came from the cache (on disk or, for a read-only dataset, memory).
        cache_written: a new cache file was written.
    """

    im_files: list[str]
    label_files: list[str]
    labels: list[np.ndarray]
    shapes: np.ndarray
    segments: list[list[np.ndarray]]
    counts: dict[str, int] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)
    cache_path: Path | None = None
    cache_loaded: bool = False
    cache_written: bool = False


def _is_image(path: str) -> bool:
    return path.rpartition(".")[2].lower() in IMG_FORMATS


def _images_in_dir(directory: Path) -> list[str]:
    found = []
    seen = set()
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:  # a symlink loop, or two links to one folder
            dirnames.clear()
            continue
        seen.add(real)
        found.extend(os.path.join(dirpath, name) for name in filenames if _is_image(name))
    return found


def _images_in_list(list_file: Path) -> list[str]:
    base = list_file.parent
    found = []
    for line in list_file.read_text().splitlines():
        line = line.strip()
        if line and _is_image(line):
            path = Path(line).expanduser()
            found.append(str(path if path.is_absolute() else base / path))
    return found


def find_images(source: str | Path | Sequence[str | Path], prefix: str = "") -> list[str]:
    """List the images of a dataset split: a directory, a .txt list of paths, an image, or a list of these.

    Directories are searched recursively; lines of a .txt list that are relative paths
    resolve against the list's directory. Extensions match case-insensitively.

    Args:
        source: one source or a list of them.
        prefix: put in front of error messages (e.g. ``"train: "``).

    Returns:
        Sorted, de-duplicated absolute paths.

    Raises:
        FileNotFoundError: a source does not exist, or no images were found; names the path.

    Examples:
        >>> import tempfile, pathlib
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = (pathlib.Path(tmp) / "a.JPG").touch(), (pathlib.Path(tmp) / "notes.md").touch()
        ...     [pathlib.Path(p).name for p in find_images(tmp)]
        ['a.JPG']
    """
    sources = [source] if isinstance(source, (str, Path)) else list(source)
    found: list[str] = []
    for item in sources:
        path = Path(item).expanduser()
        if path.is_dir():
            found.extend(_images_in_dir(path))
        elif path.is_file() and path.suffix.lower() == ".txt":
            found.extend(_images_in_list(path))
        elif path.is_file() and _is_image(path.name):
            found.append(str(path))
        else:
            raise FileNotFoundError(f"{prefix}{path}: no such directory, image list (.txt) or image")
    im_files = sorted({os.path.abspath(p) for p in found})
    if not im_files:
        where = ", ".join(str(s) for s in sources)
        raise FileNotFoundError(f"{prefix}no images in {where} (looked for {', '.join(IMG_FORMATS)})")
    return im_files


def img2label_paths(im_files: Sequence[str]) -> list[str]:
    """Map image paths to label paths: the last ``/images/`` becomes ``/labels/``, the suffix ``.txt``.

    Examples:
        >>> img2label_paths(["/data/coco/images/train/a.jpg"])
        ['/data/coco/labels/train/a.txt']
    """
    images, labels = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    out = []
    for im_file in im_files:
        head, sep, tail = im_file.rpartition(images)
        path = head + labels + tail if sep else im_file
        out.append(os.path.splitext(path)[0] + ".txt")
    return out


def label_cache_path(im_files: Sequence[str], source: str | Path | Sequence[str | Path] | None = None) -> Path:
    """The cache file for these images, named by the split's ``source`` so that two splits never share one.

    A directory (or no ``source``): beside its labels directory, ``labels/train.ddp.cache``. A ``.txt``
    list: beside the list, ``train2017.txt`` -> ``train2017.ddp.cache`` (where YOLOv5 keeps its
    ``.cache``). Anything else (an image, several sources): ``labels/train.<hash of the sources>.ddp.cache``.
    A directory and a list of some of its images then keep a cache each, instead of rebuilding one
    whenever the other was used last.

    Examples:
        >>> label_cache_path(["/data/coco/images/train/a.jpg"]).as_posix()
        '/data/coco/labels/train.ddp.cache'
        >>> label_cache_path(["/data/coco/images/train/a.jpg"], "/data/coco/train2017.txt").as_posix()
        '/data/coco/train2017.ddp.cache'
        >>> label_cache_path(["/data/coco/images/train/a.jpg"], ["/data/a.txt", "/data/b"]).name[:6]
        'train.'
    """
    if not im_files:
        raise ValueError("label_cache_path: no image files given")
    labels_dir = Path(img2label_paths([im_files[0]])[0]).parent
    sources = [] if source is None else [source] if isinstance(source, (str, Path)) else list(source)
    if len(sources) == 1 and Path(sources[0]).suffix.lower() == ".txt":
        listed = Path(sources[0]).expanduser()
        return listed.with_name(listed.stem + CACHE_SUFFIX)
    if len(sources) > 1 or (sources and not Path(sources[0]).expanduser().is_dir()):
        names = "\n".join(os.path.abspath(Path(s).expanduser()) for s in sources)
        key = hashlib.sha256(names.encode()).hexdigest()[:8]
        return labels_dir.parent / f"{labels_dir.name}.{key}{CACHE_SUFFIX}"
    return labels_dir.parent / (labels_dir.name + CACHE_SUFFIX)


# --- verification of one image and its label -----------------------------------------------------


def _image_size(im_file: str) -> tuple[tuple[int, int], str]:
    """((width, height) as decoded, what the decoder warned about or ""), after checking that the file is a
    complete image."""
    fast = fast_image_size(im_file)
    said = ""
    if fast is not None:
        width, height, orientation = fast
    else:
        with caught_warnings(os.path.dirname(PIL.__file__)) as pil, Image.open(im_file) as im:
            fmt = (im.format or "").lower()
            if fmt not in _PIL_FORMATS:
                raise ValueError(f"unsupported image format {im.format}")
            width, height = im.size
            orientation = im.getexif().get(ORIENTATION_TAG, 1) if fmt != "png" else 1
            im.load()  # PIL raises on a truncated file; OpenCV would only warn
        said = decoder_summary(pil.text)
    if orientation in TRANSPOSED_ORIENTATIONS:
        width, height = height, width
    return (width, height), said


def _parse_label(lb_file: str) -> tuple[np.ndarray, list[np.ndarray], str]:
    """Read a label file: (boxes [n, 5], polygons, status) or raise ValueError naming the line."""
    try:
        with open(lb_file, "rb") as f:  # bytes: float() takes them, and no text decoder to set up
            content = f.read()
    except FileNotFoundError:
        return np.zeros((0, 5), np.float32), [], "missing"
    rows = [line.split() for line in content.splitlines()]
    rows = [row for row in rows if row]
    if not rows:
        return np.zeros((0, 5), np.float32), [], "empty"
    boxes = _plain_boxes(rows)
    if boxes is not None:
        return boxes, [], "found"
    return _parse_rows([[v.decode(errors="replace") for v in row] for row in rows])


def _plain_boxes(rows: list[list[bytes]]) -> np.ndarray | None:
    """The common case, all rows valid 5-column boxes, checked in a few passes; None sends the file
    to :func:`_parse_rows`, which finds the line at fault or reads polygons."""
    if any(len(row) != 5 for row in rows):
        return None
    try:
        values = [float(v) for row in rows for v in row]
    except ValueError:
        return None
    if not all(map(math.isfinite, values)):
        return None
    if not all(c >= 0 and c.is_integer() for c in values[0::5]):
        return None
    low, high = -COORD_TOLERANCE, 1 + COORD_TOLERANCE
    outside = False
    for k in range(1, 5):
        smallest, largest = min(values[k::5]), max(values[k::5])
        if smallest < low or largest > high:
            return None
        outside = outside or smallest < 0 or largest > 1
    boxes = np.array(values, np.float32).reshape(-1, 5)
    if outside:  # within the tolerance: pull back to 0-1
        boxes[:, 1:] = boxes[:, 1:].clip(0, 1)
    return boxes


def _parse_rows(rows: list[list[str]]) -> tuple[np.ndarray, list[np.ndarray], str]:
    """Read rows one by one: boxes, polygons (converted to boxes), and errors that name the line."""
    boxes = np.empty((len(rows), 5), np.float32)
    polygons: list[np.ndarray] = []
    has_polygons = any(len(row) > 5 for row in rows)
    for i, row in enumerate(rows):
        n = len(row)
        if n != 5 and (n < 7 or n % 2 == 0):
            raise ValueError(f"line {i + 1}: {n} columns, expected 5 (class xc yc w h) or an odd count >= 7 (polygon)")
        try:
            values = np.array(row, np.float32)
        except ValueError:
            bad = next(v for v in row if not _is_number(v))
            raise ValueError(f"line {i + 1}: non-numeric value {bad!r}") from None
        if not np.isfinite(values).all():
            raise ValueError(f"line {i + 1}: non-finite value")
        cls = values[0]
        if cls < 0 or cls != int(cls):
            raise ValueError(f"line {i + 1}: class {row[0]} is not a non-negative integer")
        coords = values[1:]
        if coords.min() < -COORD_TOLERANCE or coords.max() > 1 + COORD_TOLERANCE:
            raise ValueError(f"line {i + 1}: coordinates outside 0-1 ({row[1:]})")
        coords = coords.clip(0, 1)
        if n == 5:
            boxes[i] = values[0], *coords
            if has_polygons:
                xc, yc, w, h = coords
                polygons.append(
                    np.array(
                        [
                            [xc - w / 2, yc - h / 2],
                            [xc + w / 2, yc - h / 2],
                            [xc + w / 2, yc + h / 2],
                            [xc - w / 2, yc + h / 2],
                        ],
                        np.float32,
                    )
                )
        else:
            polygon = coords.reshape(-1, 2)
            (x0, y0), (x1, y1) = polygon.min(0), polygon.max(0)
            boxes[i] = cls, (x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0
            polygons.append(polygon)
    return boxes, polygons, "found"


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _verify(pair: tuple[str, str]) -> tuple:
    """Check one image and its label; returns (status, boxes, polygons, shape, duplicates, message)."""
    im_file, lb_file = pair
    try:
        shape, said = _image_size(im_file)
        if min(shape) < MIN_IMAGE_SIDE:
            raise ValueError(f"image size {shape[0]}x{shape[1]} is below {MIN_IMAGE_SIDE} pixels")
    except Exception as exc:
        return "corrupt", None, None, None, 0, f"{im_file}: corrupt image, skipped ({_describe(exc)})"
    try:
        boxes, polygons, status = _parse_label(lb_file)
    except (ValueError, OSError) as exc:
        return "corrupt", None, None, None, 0, f"{lb_file}: bad label, image skipped ({_describe(exc)})"
    duplicates, message = 0, ""
    if said:  # the scan's line is the file's one: the loader's decoders stay quiet about it in this process tree
        message = f"{im_file}: decoded with a warning (PIL: {said}); kept"
        mark_noted(im_file)
    if len(boxes) > 1 and len({row.tobytes() for row in boxes}) < len(boxes):
        _, first = np.unique(boxes, axis=0, return_index=True)
        if len(first) < len(boxes):
            keep = np.sort(first)
            duplicates = len(boxes) - len(keep)
            boxes = boxes[keep]
            polygons = [polygons[k] for k in keep] if polygons else polygons
            message = "\n".join(filter(None, [message, f"{lb_file}: {duplicates} duplicate label row(s) removed"]))
    return status, boxes, polygons, shape, duplicates, message


_REPORTED: set[tuple[str, str]] = set()  # (cache path, files hash) whose problems this process has listed


def _report(messages: list[str], level: int, limit: int = 30) -> None:
    for message in messages[:limit]:
        LOGGER.log(level, message)
    if len(messages) > limit:
        LOGGER.log(level, f"... and {len(messages) - limit} more problems (LabelSet.messages has them all)")


def _log_result(result: dict, n_images: int, cache_path: Path, files_hash: str, loaded: bool, prefix: str) -> None:
    """The log of a load, apart from load_labels: who warns and who stays quiet is a policy of its own."""
    counts, messages = result["counts"], result["messages"]
    # The process that scanned warns; processes reading its cache (the other ranks of a
    # node, later runs) repeat the list at INFO, which only the main process shows. Every node's
    # first process scans its own copy of the data: only global rank 0's list warns, so a job's
    # log names each problem once, not once per node (LabelSet.messages has every node's). Within a
    # process the list is given once: a val split of train's images (coco128's) does not repeat it.
    if (str(cache_path), files_hash) not in _REPORTED:
        _report(messages, logging.WARNING if not loaded and is_main_process() else logging.INFO)
        _REPORTED.add((str(cache_path), files_hash))
    source = "cache" if loaded else "scan"
    LOGGER.info(
        f"{prefix}{n_images} images ({source} {cache_path}): {counts['found']} found, "
        f"{counts['missing']} missing, {counts['empty']} empty, {counts['corrupt']} corrupt, "
        f"{counts['duplicates']} duplicate rows removed"
    )


def load_labels(
    im_files: Sequence[str],
    cache_path: str | Path | None = None,
    prefix: str = "",
    workers: int = 8,
) -> LabelSet:
    """Verify images and labels, or load the result from a current cache.

    It does no distributed synchronisation itself: wrap the call in
    ``torch_distributed_zero_first(local_rank)`` so that each node's first process
    builds the cache and the others load it.

    Args:
        im_files: image paths (e.g. from :func:`find_images`).
        cache_path: the cache file; None puts it beside the labels (:func:`label_cache_path`).
        prefix: put in front of log lines and messages (e.g. ``"train: "``).
        workers: threads that verify files when the file system makes them wait (``label_scan.verified``).

    Returns:
        A :class:`LabelSet` of the verified images.

    Raises:
        FileNotFoundError: no image list was given, or not one image survived verification.
    """
    im_files = sorted(os.path.abspath(p) for p in im_files)
    if not im_files:
        raise FileNotFoundError(f"{prefix}load_labels: no image files given")
    label_files = img2label_paths(im_files)
    cache_path = Path(cache_path) if cache_path is not None else label_cache_path(im_files)
    files_hash = _files_hash(im_files, label_files)

    loaded, written = True, False
    memory = _MEMORY_CACHE.get(str(cache_path))
    result = memory[1] if memory is not None and memory[0] == files_hash else _read_cache(cache_path, files_hash)
    if result is None:
        loaded = False
        result = scan(im_files, label_files, _verify, prefix, workers, desc=f"{prefix}scanning {cache_path.parent}")
        result["hash"] = files_hash
        written = _write_cache(cache_path, result)

    _log_result(result, len(im_files), cache_path, files_hash, loaded, prefix)
    if not result["im_files"]:
        raise FileNotFoundError(f"{prefix}no usable images among {len(im_files)} under {cache_path.parent}")
    return LabelSet(
        im_files=list(result["im_files"]),
        label_files=list(result["label_files"]),
        labels=list(result["labels"]),
        shapes=np.asarray(result["shapes"], np.int64).reshape(-1, 2),
        segments=[list(s) for s in result["segments"]],
        counts=dict(result["counts"]),
        messages=list(result["messages"]),
        cache_path=cache_path,
        cache_loaded=loaded,
        cache_written=written,
    )
