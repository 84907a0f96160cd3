"""An offline synthetic detection dataset: coloured shapes on textured backgrounds.

Each class is one shape in one colour (a red circle, a green square, ...), so both cues
tell the classes apart and a small model trained on a CPU learns them in minutes.
Images are real JPEGs of a few hundred pixels with varying aspect; objects are drawn at
random places and sizes, later ones may partly cover earlier ones. Everything follows
from the seed: the same seed gives byte-identical labels and the same images.

``data/shapes.yaml`` names :func:`generate` as its ``download``, so ``check_dataset``
makes the dataset on first use; tests call :func:`make_shapes_dataset` directly.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from ..log import LOGGER

# BGR colours far apart from each other and from the grey backgrounds.
SHAPE_COLOURS: dict[str, tuple[int, int, int]] = {
    "circle": (40, 40, 220),
    "square": (40, 190, 40),
    "triangle": (220, 90, 30),
    "star": (30, 215, 235),
    "cross": (200, 40, 200),
}
DEFAULT_CLASSES = ("circle", "square", "triangle", "star")
_SPLITS = ("train", "val")
_MAX_COVERED = 0.35  # an object may hide at most this share of an earlier one


def _polygon(shape: str, x0: float, y0: float, side: float) -> np.ndarray:
    """Vertices of a shape whose bounding square has its top-left at (x0, y0)."""
    cx, cy, r = x0 + side / 2, y0 + side / 2, side / 2
    if shape == "circle":
        angles = np.arange(48) * (2 * np.pi / 48)
        pts = np.stack([cx + r * np.cos(angles), cy + r * np.sin(angles)], 1)
    elif shape == "square":
        pts = [(x0, y0), (x0 + side, y0), (x0 + side, y0 + side), (x0, y0 + side)]
    elif shape == "triangle":
        pts = [(cx, y0), (x0 + side, y0 + side * 0.87), (x0, y0 + side * 0.87)]
    elif shape == "star":
        angles = -np.pi / 2 + np.arange(10) * np.pi / 5
        radii = np.where(np.arange(10) % 2 == 0, r, r * 0.45)
        pts = np.stack([cx + radii * np.cos(angles), cy + radii * np.sin(angles)], 1)
    elif shape == "cross":
        a, b = side / 3, 2 * side / 3
        offsets = [(a, 0), (b, 0), (b, a), (side, a), (side, b), (b, b), (b, side), (a, side), (a, b), (0, b), (0, a)]
        pts = [(x0 + dx, y0 + dy) for dx, dy in [*offsets, (a, a)]]
    else:
        raise ValueError(f"unknown shape {shape!r}: choose from {', '.join(SHAPE_COLOURS)}")
    return np.round(np.asarray(pts, np.float64)).astype(np.int32)


def _background(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """A grey-ish base, blotches of colour a few dozen pixels wide, and per-pixel grain (uint8 throughout)."""
    base = rng.uniform(70, 170) + rng.uniform(-12, 12, 3)
    coarse = np.clip(base + rng.normal(0, 22, (height // 32 + 2, width // 32 + 2, 3)), 0, 255).astype(np.uint8)
    texture = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_CUBIC)
    grain = np.frombuffer(rng.bytes(height * width * 3), np.uint8).reshape(height, width, 3) & 31
    return cv2.subtract(cv2.add(texture, grain), np.full_like(texture, 16))  # saturating: grain of +/-16


def _covers_too_much(box: np.ndarray, boxes: list[np.ndarray]) -> bool:
    for other in boxes:
        iw = min(box[2], other[2]) - max(box[0], other[0])
        ih = min(box[3], other[3]) - max(box[1], other[1])
        if iw > 0 and ih > 0 and iw * ih > _MAX_COVERED * (other[2] - other[0]) * (other[3] - other[1]):
            return True
    return False


def _draw_image(
    rng: np.random.Generator, size: tuple[int, int], classes: Sequence[str], max_objects: int
) -> tuple[np.ndarray, list[str]]:
    """One image and its YOLO label lines."""
    width, height = (int(v) for v in rng.integers(size[0], size[1] + 1, 2))
    img = _background(rng, width, height)
    boxes: list[np.ndarray] = []
    lines = []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        cls = int(rng.integers(len(classes)))
        side = rng.uniform(0.12, 0.35) * min(width, height)
        for _attempt in range(10):
            x0, y0 = rng.uniform(0, width - side - 1), rng.uniform(0, height - side - 1)
            pts = _polygon(classes[cls], x0, y0, side)
            box = np.concatenate([pts.min(0), pts.max(0) + 1])  # pixel edges: the last column is inside
            if not _covers_too_much(box, boxes):
                break
        else:
            continue
        colour = np.clip(np.array(SHAPE_COLOURS[classes[cls]]) + rng.integers(-25, 26, 3), 0, 255)
        cv2.fillPoly(img, [pts], colour.tolist(), cv2.LINE_AA)
        boxes.append(box)
        xc, yc = (box[0] + box[2]) / 2 / width, (box[1] + box[3]) / 2 / height
        bw, bh = (box[2] - box[0]) / width, (box[3] - box[1]) / height
        lines.append(f"{cls} {xc:.6f} {yc:.6f} {bw:.6f} {bh:.6f}")
    return img, lines


def _write_dataset(
    tmp: Path, n_train: int, n_val: int, size: tuple[int, int], seed: int, classes: Sequence[str], max_objects: int
) -> None:
    """Both splits and the manifest into ``tmp``: the content, apart from make_shapes_dataset's safe renaming."""
    for split_id, (split, count) in enumerate(zip(_SPLITS, (n_train, n_val))):
        (tmp / "images" / split).mkdir(parents=True)
        (tmp / "labels" / split).mkdir(parents=True)
        for i in range(count):
            rng = np.random.default_rng(np.random.SeedSequence([seed, split_id, i]))
            img, lines = _draw_image(rng, size, classes, max_objects)
            ok, jpeg = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])
            if not ok:
                raise RuntimeError(f"{tmp}: OpenCV could not encode image {i} of {split}")
            (tmp / "images" / split / f"{i:06d}.jpg").write_bytes(jpeg.tobytes())
            (tmp / "labels" / split / f"{i:06d}.txt").write_text("\n".join(lines) + "\n")
    manifest = {"n_train": n_train, "n_val": n_val, "size": list(size), "seed": seed, "classes": list(classes)}
    (tmp / "shapes.json").write_text(json.dumps(manifest, indent=1) + "\n")


def make_shapes_dataset(
    root: str | Path,
    n_train: int,
    n_val: int,
    size: tuple[int, int] = (256, 384),
    seed: int = 0,
    classes: Sequence[str] = DEFAULT_CLASSES,
    max_objects: int = 6,
) -> Path:
    """Write a synthetic dataset: ``root/images/{train,val}/*.jpg`` and ``root/labels/{train,val}/*.txt``.

    The dataset is built in a temporary directory beside ``root`` and renamed into place
    at the end, so an interrupted run never leaves a dataset that looks complete.

    Args:
        root: the dataset directory; it must not exist yet, or be empty.
        n_train: images in the train split.
        n_val: images in the val split.
        size: smallest and largest image side in pixels; width and height are drawn apart.
        seed: the dataset's seed; each image has its own stream, so splits of different
            sizes share their first images.
        classes: shape names (keys of :data:`SHAPE_COLOURS`), in class-id order.
        max_objects: most objects per image (at least one each).

    Returns:
        ``root`` as a Path.

    Examples:
        >>> import tempfile, pathlib
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     root = make_shapes_dataset(pathlib.Path(tmp) / "shapes", n_train=2, n_val=1)
        ...     sorted(p.name for p in (root / "images" / "train").iterdir())
        ['000000.jpg', '000001.jpg']
    """
    root = Path(root)
    size = (int(size[0]), int(size[1])) if isinstance(size, Sequence) else (int(size), int(size))
    if not 32 <= size[0] <= size[1]:
        raise ValueError(f"size={size}: give (smallest side, largest side), both at least 32 pixels")
    unknown = [c for c in classes if c not in SHAPE_COLOURS]
    if unknown or not classes:
        raise ValueError(f"classes {unknown or list(classes)}: choose from {', '.join(SHAPE_COLOURS)}")
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(f"{root}: already exists and is not empty; remove it to generate the shapes dataset")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.parent / f".{root.name}.partial-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        _write_dataset(tmp, n_train, n_val, size, seed, classes, max_objects)
        if root.is_dir():
            root.rmdir()  # empty, checked above
        os.rename(tmp, root)
    except OSError:
        if root.is_dir() and (root / "shapes.json").is_file():
            return root  # another process (a second node on a shared disk) finished first
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    LOGGER.info(f"shapes: wrote {n_train} train and {n_val} val images to {root}")
    return root


def generate(data: dict[str, Any]) -> None:
    """Make the dataset a data yaml describes: the ``download`` generator of ``data/shapes.yaml``.

    Reads ``path`` (absolute, as ``check_dataset`` resolves it), ``names`` (shape names in
    class order) and the optional keys ``n_train`` (256), ``n_val`` (64), ``size``
    ([256, 384]), ``seed`` (0) and ``max_objects`` (6).

    Args:
        data: the resolved data dict.
    """
    names = data.get("names", dict(enumerate(DEFAULT_CLASSES)))
    classes = [names[k] for k in sorted(names)] if isinstance(names, dict) else list(names)
    make_shapes_dataset(
        Path(data["path"]),
        n_train=int(data.get("n_train", 256)),
        n_val=int(data.get("n_val", 64)),
        size=data.get("size", (256, 384)),
        seed=int(data.get("seed", 0)),
        classes=classes,
        max_objects=int(data.get("max_objects", 6)),
    )
