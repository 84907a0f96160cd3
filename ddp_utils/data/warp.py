"""The mosaic and the random perspective: each image warped once, straight into the output.

The mosaic never builds YOLOv5's 2x canvas: the placement of each tile and the random
perspective are composed into one matrix per tile, and each tile is warped straight into
its part of the final image. Every random choice comes from an explicit
``rng: np.random.Generator``. Boxes are pixel ``xyxy``; labels are ``[n, 5]`` arrays of
(class, x1, y1, x2, y2). Hyperparameter names are YOLOv5's. The numbers (the transform, where
tiles and boxes land) live in :mod:`ddp_utils.data.geometry`, shared with the device path's recipes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import cv2
import numpy as np

from .geometry import (
    _zoom_and_shift,
    box_candidates,
    lands_in,
    mosaic_labels,
    mosaic_layout,
    perspective_labels,
    perspective_matrix,
    tile_placement,
    transform_boxes,
)

PAD_COLOR = (114, 114, 114)


def _warp_into(dst: np.ndarray, src: np.ndarray, m: np.ndarray) -> None:
    # Warp only over the part of dst that src lands on: a tile covers a quarter of the
    # output, so this costs one output's worth of pixels for all four tiles together. Always
    # warpAffine, even for a plain zoom and shift: cv2.resize placed at a whole pixel was 1.6x
    # faster but put the pixels up to 1 px (on average 1 - zoom px) off their boxes.
    h, w = src.shape[:2]
    corners = np.array([[0, 0, 1], [w, 0, 1], [0, h, 1], [w, h, 1]], np.float64) @ m.T
    xy = corners[:, :2] / corners[:, 2:3]
    x0, y0 = np.floor(xy.min(0)).astype(int) - 1
    x1, y1 = np.ceil(xy.max(0)).astype(int) + 1
    x0, y0 = max(x0, 0), max(y0, 0)
    x1, y1 = min(x1, dst.shape[1]), min(y1, dst.shape[0])
    if x1 <= x0 or y1 <= y0:
        return
    shift = np.array([[1, 0, -x0], [0, 1, -y0], [0, 0, 1]], np.float64)
    local = shift @ m
    roi = dst[y0:y1, x0:x1]
    size = (x1 - x0, y1 - y0)
    if m[2, 0] or m[2, 1]:
        cv2.warpPerspective(src, local, size, dst=roi, borderMode=cv2.BORDER_TRANSPARENT)
    else:
        cv2.warpAffine(src, local[:2], size, dst=roi, borderMode=cv2.BORDER_TRANSPARENT)


def _place_tile(
    dst: np.ndarray,
    img: np.ndarray,
    affine: tuple[float, float, float, float],
    size: tuple[int, int],
    crop: tuple[int, int, int, int],
    offset: tuple[int, int],
) -> None:
    # _warp_into(dst, *_tile_source(...)) for a zoom-and-shift m = ((a, 0, tx), (0, b, ty)), affine = (a, tx, b, ty),
    # in floats: the same matrix (m @ shift @ place, summed in the same order) and the same region, without a dozen
    # small numpy arrays per tile
    (h, w), (x1b, y1b, x2b, y2b), (dx, dy) = size, crop, offset
    a, tx, b, ty = affine
    rows, cols = img.shape[:2]
    if (rows, cols) == (h, w):
        src, sx, px, sy, py = img[y1b:y2b, x1b:x2b], 1.0, float(x1b), 1.0, float(y1b)
    else:
        sx, sy = w / cols, h / rows
        c1, r1 = int(x1b / sx), int(y1b / sy)
        src = img[r1 : min(math.ceil(y2b / sy), rows), c1 : min(math.ceil(x2b / sx), cols)]
        px, py = sx * (c1 + 0.5) - 0.5, sy * (r1 + 0.5) - 0.5
    ax, bx = a * sx, a * px + (a * dx + tx)  # the tile's pixel u lands at ax * u + bx
    ay, by = b * sy, b * py + (b * dy + ty)
    x0, y0 = max(math.floor(bx) - 1, 0), max(math.floor(by) - 1, 0)
    x1 = min(math.ceil(ax * src.shape[1] + bx) + 1, dst.shape[1])
    y1 = min(math.ceil(ay * src.shape[0] + by) + 1, dst.shape[0])
    if x1 > x0 and y1 > y0:
        local = np.array(((ax, 0.0, bx - x0), (0.0, ay, by - y0)))
        cv2.warpAffine(src, local, (x1 - x0, y1 - y0), dst=dst[y0:y1, x0:x1], borderMode=cv2.BORDER_TRANSPARENT)


def warp_tiles(
    out: np.ndarray,
    images: Sequence[np.ndarray | Callable[[], np.ndarray]],
    sizes: Sequence[tuple[int, int]],
    centre: tuple[int, int],
    affine: tuple[float, float, float, float],
    s2: int,
) -> list[tuple[int, int]]:
    """Warp a mosaic's four tiles into ``out`` when its transform only zooms and shifts.

    The image part of :func:`mosaic4` for the usual hyp (no rotation, shear or perspective),
    also used by the loader's batches (``mosaic_batch.py``).

    Args:
        out: the output image, [h, w, 3], already filled with the padding.
        images: the four tiles (or functions returning them, called only when the tile shows).
        sizes: the (h, w) each tile stands for.
        centre: the mosaic's centre (xc, yc) on the ``s2`` x ``s2`` canvas.
        affine: (a, tx, b, ty): canvas pixel (x, y) lands at (a * x + tx, b * y + ty) of ``out``; a, b > 0.
        s2: the canvas side, twice the mosaic's ``imgsz``.

    Returns:
        Each tile's offset (dx, dy): its pixel (x, y) is the canvas's (x + dx, y + dy).
    """
    (xc, yc), (a, tx, b, ty) = centre, affine
    height, width = out.shape[:2]
    offsets = []
    for k, img in enumerate(images):
        h, w = sizes[k]
        x1a, y1a, x1b, y1b, x2b, y2b = tile_placement(k, xc, yc, h, w, s2)
        dx, dy = x1a - x1b, y1a - y1b
        x2a, y2a = x1a + x2b - x1b, y1a + y2b - y1b
        # lands_in for a zoom and a shift, in floats
        if (
            x2b > x1b
            and y2b > y1b
            and a * x2a + tx > 0
            and b * y2a + ty > 0
            and a * x1a + tx < width
            and b * y1a + ty < height
        ):
            _place_tile(out, img() if callable(img) else img, affine, (h, w), (x1b, y1b, x2b, y2b), (dx, dy))
        offsets.append((dx, dy))
    return offsets


def random_perspective(
    img: np.ndarray,
    labels: np.ndarray,
    rng: np.random.Generator,
    degrees: float = 10.0,
    translate: float = 0.1,
    scale: float = 0.1,
    shear: float = 10.0,
    perspective: float = 0.0,
    area_thr: float = 0.1,
) -> tuple[np.ndarray, np.ndarray]:
    """Randomly rotate, scale, shear, translate and tilt an image and its boxes.

    Args:
        img: HWC image; the output has the same size.
        labels: [n, 5] (class, x1, y1, x2, y2) in pixels.
        rng: the random generator.

    Returns:
        (image, labels) with boxes clipped and degenerate ones dropped.
    """
    h, w = img.shape[:2]
    m, zoom = perspective_matrix(rng, (w, h), (w, h), degrees, translate, scale, shear, perspective)
    if (m != np.eye(3)).any():
        out = np.full_like(img, PAD_COLOR[0])
        _warp_into(out, img, m)
        img = out
    return img, perspective_labels(labels, m, zoom, w, h, area_thr)


def _tile_source(
    img: np.ndarray, h: int, w: int, x1b: int, y1b: int, x2b: int, y2b: int
) -> tuple[np.ndarray, np.ndarray]:
    # The part of img that covers [x1b, x2b) x [y1b, y2b) of its (h, w) version, and the
    # matrix from that part's pixels to the (h, w) version's.
    rows, cols = img.shape[:2]
    if (rows, cols) == (h, w):
        place = np.array([[1, 0, x1b], [0, 1, y1b], [0, 0, 1]], np.float64)
        return img[y1b:y2b, x1b:x2b], place
    sx, sy = w / cols, h / rows
    c1, r1 = int(x1b / sx), int(y1b / sy)
    c2, r2 = min(math.ceil(x2b / sx), cols), min(math.ceil(y2b / sy), rows)
    # pixel centres map as cv2.resize maps them: x' + 0.5 = s * (x + 0.5)
    place = np.array([[sx, 0, sx * (c1 + 0.5) - 0.5], [0, sy, sy * (r1 + 0.5) - 0.5], [0, 0, 1]], np.float64)
    return img[r1:r2, c1:c2], place


def mosaic4(
    images: Sequence[np.ndarray | Callable[[], np.ndarray]],
    labels: Sequence[np.ndarray],
    imgsz: int,
    rng: np.random.Generator,
    hyp: Mapping[str, float],
    sizes: Sequence[tuple[int, int]] | None = None,
    border: Sequence[int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Four images around a random centre, with the random perspective, in one warp per tile.

    Equivalent to placing the tiles on a ``2 * imgsz`` canvas and warping that canvas to
    ``imgsz`` (YOLOv5's mosaic then random_perspective), without the canvas. With
    ``sizes``, the images may come straight from the decoder: the resize to each tile's
    size is folded into the same warp (bilinear, no antialiasing: a tile shrunk to half or
    less shows fine texture as grain, so ``YoloDataset`` resizes first, as YOLOv5 does); and
    an image may be a function that returns it, called only when its tile lands in the output
    (at high zoom some tiles fall wholly outside it, and are never decoded).

    Args:
        images: four HWC images, long side about ``imgsz`` (read-only views are fine),
            or functions returning them (then ``sizes`` is needed).
        labels: four [n, 5] (class, x1, y1, x2, y2) arrays in pixels of each tile's size.
        imgsz: output side.
        rng: the random generator.
        hyp: degrees, translate, scale, shear, perspective.
        sizes: the (h, w) each image stands for (its long side resized to ``imgsz``);
            None: the images' own shapes.
        border: YOLOv5's ``mosaic_border`` (y, x): the centre is drawn from
            ``[-border, 2 * imgsz + border]`` and the output is ``2 * imgsz + 2 * border``
            on each side; None: ``imgsz // 2`` inwards, an ``imgsz`` square.

    Returns:
        (image [imgsz, imgsz, 3] (with the default border), labels [m, 5] in output pixels).
    """
    s2 = 2 * imgsz
    (xc, yc), m, zoom, (out_h, out_w) = mosaic_layout(imgsz, rng, hyp, border)
    out = np.full((out_h, out_w, 3), PAD_COLOR[0], dtype=np.uint8)
    if sizes is None:
        sizes = [img.shape[:2] for img in images]
    if _zoom_and_shift(m):  # the usual hyp: each tile's matrix and where it lands in a few float operations
        affine = (float(m[0, 0]), float(m[0, 2]), float(m[1, 1]), float(m[1, 2]))
        offsets = warp_tiles(out, images, sizes, (xc, yc), affine, s2)
    else:
        offsets = []
        for k, img in enumerate(images):
            h, w = sizes[k]
            x1a, y1a, x1b, y1b, x2b, y2b = tile_placement(k, xc, yc, h, w, s2)
            dx, dy = x1a - x1b, y1a - y1b
            if x2b > x1b and y2b > y1b and lands_in(m, x1a, y1a, x1a + x2b - x1b, y1a + y2b - y1b, out_w, out_h):
                src, place = _tile_source(img() if callable(img) else img, h, w, x1b, y1b, x2b, y2b)
                shift = np.array([[1, 0, dx], [0, 1, dy], [0, 0, 1]], np.float64)
                _warp_into(out, src, m @ shift @ place)
            offsets.append((dx, dy))
    return out, mosaic_labels(labels, offsets, m, zoom, s2, (out_h, out_w))


__all__ = [
    "PAD_COLOR",
    "box_candidates",
    "lands_in",
    "mosaic4",
    "mosaic_labels",
    "mosaic_layout",
    "perspective_labels",
    "perspective_matrix",
    "random_perspective",
    "tile_placement",
    "transform_boxes",
    "warp_tiles",
]
