"""The label cache: a scan's result kept beside the labels, versioned, hashed and pickle-free.

The cache (``labels/train.ddp.cache``, see :func:`ddp_utils.data.labels.label_cache_path`)
is an ``.npz`` of plain arrays plus a JSON header holding a format version and a hash of
the paths, sizes and modification times of every image and label. It is loaded with
``allow_pickle=False``, so a stale, truncated or foreign file (YOLOv5's own pickled
``.cache`` included) is rebuilt, never executed. Where the directory is read-only the
result is kept in memory for the life of the process instead.

:func:`ddp_utils.data.labels.load_labels` is the one user of these functions.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..files import mkstemp_shared
from ..log import LOGGER

CACHE_VERSION = 1
CACHE_SUFFIX = ".ddp.cache"  # not YOLOv5's ".cache": both tools can keep their own cache side by side
_MEMORY_CACHE: dict[str, tuple[str, dict]] = {}  # cache path -> (hash, arrays) for read-only datasets


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


def _files_hash(im_files: Sequence[str], label_files: Sequence[str]) -> str:
    digest = hashlib.sha256(f"ddp_utils labels v{CACHE_VERSION}\n".encode())
    for path in (*im_files, *label_files):
        try:
            st = os.stat(path)
            digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError:
            digest.update(f"{path}\0-\n".encode())
    return digest.hexdigest()


def _pack(result: dict) -> dict[str, np.ndarray]:
    """Flatten a scan result to plain numeric arrays and a JSON header."""
    labels, segments = result["labels"], result["segments"]
    polygons = [p for per_image in segments for p in per_image]
    header = {k: result[k] for k in ("version", "hash", "im_files", "label_files", "counts", "messages")}
    return {
        "header": np.frombuffer(json.dumps(header).encode(), np.uint8),
        "labels": np.concatenate(labels, 0) if labels else np.zeros((0, 5), np.float32),
        "label_counts": np.array([len(lb) for lb in labels], np.int64),
        "shapes": np.asarray(result["shapes"], np.int64).reshape(-1, 2),
        "segment_counts": np.array([len(s) for s in segments], np.int64),
        "polygon_lengths": np.array([len(p) for p in polygons], np.int64),
        "points": np.concatenate(polygons, 0).astype(np.float32) if polygons else np.zeros((0, 2), np.float32),
    }


def _unpack(arrays: dict[str, np.ndarray]) -> dict:
    header = json.loads(arrays["header"].tobytes().decode())
    n = len(header["im_files"])
    label_counts, segment_counts = arrays["label_counts"], arrays["segment_counts"]
    shapes = arrays["shapes"]
    if not (len(label_counts) == len(segment_counts) == len(shapes) == len(header["label_files"]) == n):
        raise ValueError("cache arrays disagree in length")
    boxes, points, lengths = arrays["labels"], arrays["points"], arrays["polygon_lengths"]
    if (
        boxes.ndim != 2
        or boxes.shape[1] != 5
        or label_counts.sum() != len(boxes)
        or points.ndim != 2
        or points.shape[1] != 2
        or lengths.sum() != len(points)
        or segment_counts.sum() != len(lengths)
        or shapes.ndim != 2
        or shapes.shape[1] != 2
    ):
        raise ValueError("cache arrays have inconsistent shapes")
    labels = np.split(arrays["labels"].astype(np.float32), np.cumsum(label_counts)[:-1]) if n else []
    polygons = np.split(arrays["points"].astype(np.float32), np.cumsum(arrays["polygon_lengths"])[:-1])
    if not len(arrays["polygon_lengths"]):
        polygons = []
    segments, start = [], 0
    for count in segment_counts:
        segments.append(polygons[start : start + count])
        start += count
    return {**header, "labels": [lb.reshape(-1, 5) for lb in labels], "shapes": shapes, "segments": segments}


def _read_cache(cache_path: Path, expected_hash: str) -> dict | None:
    """The cached result when the file is ours, current and intact; None otherwise."""
    try:
        with np.load(cache_path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
        result = _unpack(arrays)
    except FileNotFoundError:
        return None
    except Exception as exc:  # truncated, random bytes, a pickle, object arrays, a foreign layout
        LOGGER.info(f"{cache_path}: not a usable label cache, rebuilding ({_describe(exc)})")
        return None
    if result.get("version") != CACHE_VERSION or result.get("hash") != expected_hash:
        LOGGER.info(f"{cache_path}: label cache is out of date, rebuilding")
        return None
    return result


def _write_cache(cache_path: Path, result: dict) -> bool:
    """Write the cache atomically; False (and one warning) when the directory is read-only."""
    buffer = io.BytesIO()
    np.savez(buffer, **_pack(result))
    tmp = None
    try:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = mkstemp_shared(cache_path.parent, prefix=f".{cache_path.name}.")
        with os.fdopen(fd, "wb") as f:
            f.write(buffer.getbuffer())
        os.replace(tmp, cache_path)
        return True
    except OSError as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if str(cache_path) not in _MEMORY_CACHE:
            LOGGER.warning(
                f"{cache_path.parent}: cannot write the label cache ({_describe(exc)}); "
                "keeping it in memory for this process"
            )
        _MEMORY_CACHE[str(cache_path)] = (result["hash"], result)
        return False
