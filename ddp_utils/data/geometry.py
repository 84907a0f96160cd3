"""Where a mosaic's tiles and a warp's boxes land: the numbers of ``warp.py``'s augmentations, without pixels.

The random transform (:func:`perspective_matrix`), a mosaic's layout (:func:`mosaic_layout`,
:func:`tile_placement`) and the labels that come out (:func:`mosaic_labels`,
:func:`perspective_labels`) are what both routes to a training image share: the workers' OpenCV
path (``warp.py``) and the recipes of the device path (``device/recipes.py``), so the two make the same
draws and the same boxes. Boxes are pixel ``xyxy``; labels are ``[n, 5]`` arrays of
(class, x1, y1, x2, y2). Hyperparameter names are YOLOv5's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import cv2
import numpy as np


def box_candidates(
    before: np.ndarray,
    after: np.ndarray,
    wh_thr: float = 2,
    ar_thr: float = 100,
    area_thr: float = 0.1,
    eps: float = 1e-16,
) -> np.ndarray:
    """Which boxes survive an augmentation: wide and tall enough, not too thin, enough area kept.

    Args:
        before: [n, 4] xyxy before, scaled by the augmentation's zoom.
        after: [n, 4] xyxy after.

    Returns:
        [n] bool mask.

    Examples:
        >>> box_candidates(np.array([[0, 0, 10, 10.]]), np.array([[0, 0, 10, 1.]])).tolist()
        [False]
    """
    w1, h1 = before[:, 2] - before[:, 0], before[:, 3] - before[:, 1]
    w2, h2 = after[:, 2] - after[:, 0], after[:, 3] - after[:, 1]
    aspect = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > wh_thr) & (h2 > wh_thr) & (w2 * h2 / (w1 * h1 + eps) > area_thr) & (aspect < ar_thr)


def perspective_matrix(
    rng: np.random.Generator,
    in_size: tuple[int, int],
    out_size: tuple[int, int],
    degrees: float = 0.0,
    translate: float = 0.0,
    scale: float = 0.0,
    shear: float = 0.0,
    perspective: float = 0.0,
) -> tuple[np.ndarray, float]:
    """Draw a random 3x3 transform mapping an image of ``in_size`` (w, h) onto ``out_size``.

    Centre, perspective, rotate and scale, shear, then translate to the output's centre
    (plus a random shift of up to ``translate`` of the output size).

    Returns:
        (M 3x3 float64, the drawn zoom factor).
    """
    p0, p1 = rng.uniform(-perspective, perspective, 2).tolist()
    angle = rng.uniform(-degrees, degrees)
    zoom = rng.uniform(1 - scale, 1 + scale)
    shears = rng.uniform(-shear, shear, 2)
    tx = rng.uniform(0.5 - translate, 0.5 + translate) * out_size[0]
    ty = rng.uniform(0.5 - translate, 0.5 + translate) * out_size[1]
    cx, cy = in_size[0] / 2, in_size[1] / 2
    if p0 == p1 == angle == 0 and not shears.any():
        # Only a zoom and a shift (the usual hyp): each entry of the product below is then at most one
        # product plus one sum, rounded twice as the BLAS rounds it summing in order, so these floats equal
        # it bit for bit (tests/data/test_warp_fast_path.py) and spare a dozen small numpy arrays per
        # sample. Otherwise the product itself: its fused multiply-adds are the BLAS's to choose.
        return np.array(((zoom, 0.0, tx - zoom * cx), (0.0, zoom, ty - zoom * cy), (0.0, 0.0, 1.0))), zoom
    rotate = cv2.getRotationMatrix2D(center=(0, 0), angle=angle, scale=zoom)
    k0, k1 = np.tan(np.deg2rad(shears)).tolist()
    centre = np.eye(3)
    centre[0, 2], centre[1, 2] = -cx, -cy
    persp = np.eye(3)
    persp[2, 0], persp[2, 1] = p0, p1
    rot = np.eye(3)
    rot[:2] = rotate
    shr = np.eye(3)
    shr[0, 1], shr[1, 0] = k0, k1
    shift = np.eye(3)
    shift[0, 2], shift[1, 2] = tx, ty
    return shift @ shr @ rot @ persp @ centre, zoom


def transform_boxes(boxes: np.ndarray, m: np.ndarray, width: int, height: int) -> np.ndarray:
    """Map xyxy boxes through a 3x3 transform (all 4 corners) and clip to the image.

    Examples:
        >>> shift = np.array([[1, 0, 5], [0, 1, 0], [0, 0, 1.]])
        >>> transform_boxes(np.array([[0, 0, 10, 10.]]), shift, 12, 12).tolist()
        [[5.0, 0.0, 12.0, 10.0]]
    """
    n = len(boxes)
    if n == 0:
        return boxes.reshape(0, 4).astype(np.float32)
    if _zoom_and_shift(m):  # corners stay corners: map the two and clip
        out = np.empty((n, 4), np.float32)
        # np.clip's arithmetic by its two ufuncs: np.clip wraps them in Python at a few microseconds a call
        np.minimum(np.maximum(boxes[:, 0::2] * m[0, 0] + m[0, 2], 0), width, out=out[:, 0::2])
        np.minimum(np.maximum(boxes[:, 1::2] * m[1, 1] + m[1, 2], 0), height, out=out[:, 1::2])
        return out
    corners = np.ones((n * 4, 3))
    corners[:, :2] = boxes[:, [0, 1, 2, 3, 0, 3, 2, 1]].reshape(n * 4, 2)  # x1y1, x2y2, x1y2, x2y1
    corners = corners @ m.T
    if m[2, 0] or m[2, 1]:
        corners = corners[:, :2] / corners[:, 2:3]
    xy = corners[:, :2].reshape(n, 8)
    x, y = xy[:, 0::2], xy[:, 1::2]
    out = np.stack([x.min(1), y.min(1), x.max(1), y.max(1)], 1)
    out[:, [0, 2]] = out[:, [0, 2]].clip(0, width)
    out[:, [1, 3]] = out[:, [1, 3]].clip(0, height)
    return out.astype(np.float32)


def _zoom_and_shift(m: np.ndarray) -> bool:
    # m only zooms (by positive factors) and shifts: the whole transform unless the hyp asks
    # for rotation, shear or perspective; then where a rectangle lands is four multiplications
    return bool(m[0, 1] == 0 and m[1, 0] == 0 and m[2, 0] == 0 and m[2, 1] == 0 and m[0, 0] > 0 and m[1, 1] > 0)


def _filter_boxes(labels: np.ndarray, before: np.ndarray, after: np.ndarray, zoom: float, area_thr: float):
    keep = box_candidates(before * zoom, after, area_thr=area_thr)
    out = labels[keep].copy()
    out[:, 1:5] = after[keep]
    return out


def perspective_labels(
    labels: np.ndarray, m: np.ndarray, zoom: float, width: int, height: int, area_thr: float = 0.1
) -> np.ndarray:
    """The labels :func:`random_perspective` keeps for the transform ``m`` (and its drawn ``zoom``).

    Args:
        labels: [n, 5] (class, x1, y1, x2, y2) in pixels of the input.
        m: the 3x3 transform, input pixels to output pixels.
        zoom: the zoom factor drawn with ``m``.
        width: the output's width.
        height: the output's height.
        area_thr: least share of a box's (zoomed) area that must stay.

    Returns:
        [m, 5] labels in output pixels, boxes clipped, degenerate ones dropped.

    Examples:
        >>> perspective_labels(np.array([[0, 2, 2, 8, 8.]]), np.eye(3), 1.0, 10, 10).tolist()
        [[0.0, 2.0, 2.0, 8.0, 8.0]]
    """
    after = transform_boxes(labels[:, 1:5], m, width, height)
    return _filter_boxes(labels, labels[:, 1:5], after, zoom, area_thr)


def tile_placement(k: int, xc: int, yc: int, h: int, w: int, s2: int) -> tuple[int, int, int, int, int, int]:
    """Where tile ``k`` (0-3: top left, top right, bottom left, bottom right) of (h, w) sits on the mosaic's canvas.

    Returns:
        (x1a, y1a, x1b, y1b, x2b, y2b): the canvas pixel where the tile's kept part starts, and that part
        of the tile (its crop, in the tile's pixels). Its offset on the canvas is ``(x1a - x1b, y1a - y1b)``.

    Examples:
        >>> tile_placement(3, 10, 10, 4, 6, 16)
        (10, 10, 0, 0, 6, 4)
    """
    if k == 0:  # top left: bottom-right corner at the centre
        x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
        x1b, y1b = w - (x2a - x1a), h - (y2a - y1a)
    elif k == 1:  # top right
        x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, s2), yc
        x1b, y1b = 0, h - (y2a - y1a)
    elif k == 2:  # bottom left
        x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(s2, yc + h)
        x1b, y1b = w - (x2a - x1a), 0
    else:  # bottom right
        x1a, y1a, x2a, y2a = xc, yc, min(xc + w, s2), min(s2, yc + h)
        x1b, y1b = 0, 0
    return x1a, y1a, x1b, y1b, x1b + (x2a - x1a), y1b + (y2a - y1a)


def lands_in(m: np.ndarray, x0: float, y0: float, x1: float, y1: float, width: int, height: int) -> bool:
    """Whether the rectangle [x0, x1] x [y0, y1], mapped by ``m``, reaches into the width x height output.

    Its bounding box does: a rotated corner that only grazes the output still counts.

    Examples:
        >>> lands_in(np.eye(3), 20, 20, 30, 30, 10, 10)
        False
    """
    if _zoom_and_shift(m):
        sx, tx, sy, ty = m[0, 0], m[0, 2], m[1, 1], m[1, 2]  # a zoom and a shift: the common case, in floats
        return bool(sx * x1 + tx > 0 and sy * y1 + ty > 0 and sx * x0 + tx < width and sy * y0 + ty < height)
    corners = np.array([[x0, y0, 1], [x1, y0, 1], [x0, y1, 1], [x1, y1, 1]], np.float64) @ m.T
    xy = corners[:, :2] / corners[:, 2:3]
    (left, top), (right, bottom) = xy.min(0), xy.max(0)
    return bool(right > 0 and bottom > 0 and left < width and top < height)


def mosaic_layout(
    imgsz: int, rng: np.random.Generator, hyp: Mapping[str, float], border: Sequence[int] | None = None
) -> tuple[tuple[int, int], np.ndarray, float, tuple[int, int]]:
    """A mosaic's random draws, in :func:`mosaic4`'s order: its centre on the canvas, then its transform.

    Args:
        imgsz: the mosaic's size.
        rng: the random generator.
        hyp: degrees, translate, scale, shear, perspective.
        border: YOLOv5's ``mosaic_border`` (y, x), as :func:`mosaic4` takes it.

    Returns:
        ((xc, yc) on the ``2 * imgsz`` canvas, M 3x3 canvas to output pixels, the drawn zoom, (out_h, out_w)).

    Examples:
        >>> (xc, yc), m, zoom, size = mosaic_layout(64, np.random.default_rng(0), {"scale": 0.5})
        >>> 32 <= xc < 96 and 32 <= yc < 96, size
        (True, (64, 64))
    """
    s, s2 = imgsz, 2 * imgsz
    by, bx = (-(s // 2), -(s // 2)) if border is None else (int(border[0]), int(border[1]))
    out_h, out_w = (s, s) if border is None else (s2 + 2 * by, s2 + 2 * bx)
    xc = int(rng.uniform(-bx, s2 + bx))  # x first: the order the draws have always had
    yc = int(rng.uniform(-by, s2 + by))
    m, zoom = perspective_matrix(
        rng,
        (s2, s2),
        (out_w, out_h),
        hyp.get("degrees", 0.0),
        hyp.get("translate", 0.0),
        hyp.get("scale", 0.0),
        hyp.get("shear", 0.0),
        hyp.get("perspective", 0.0),
    )
    return (xc, yc), m, zoom, (out_h, out_w)


def mosaic_labels(
    labels: Sequence[np.ndarray],
    offsets: Sequence[tuple[int, int]],
    m: np.ndarray,
    zoom: float,
    s2: int,
    out_size: tuple[int, int],
) -> np.ndarray:
    """The labels of a mosaic: each tile's placed on the canvas, clipped to it, then through ``m``, filtered.

    Args:
        labels: four [n, 5] (class, x1, y1, x2, y2) arrays in pixels of each tile.
        offsets: each tile's (dx, dy) on the canvas (:func:`tile_placement`).
        m: the canvas-to-output transform (:func:`mosaic_layout`).
        zoom: its zoom.
        s2: the canvas side.
        out_size: the output's (h, w).

    Returns:
        [m, 5] labels in output pixels.
    """
    placed = [
        lab + np.array((0, dx, dy, dx, dy), lab.dtype) if len(lab) else lab for lab, (dx, dy) in zip(labels, offsets)
    ]
    canvas_labels = np.concatenate(placed, 0) if placed else np.zeros((0, 5), np.float32)
    corners = canvas_labels[:, 1:5]
    np.minimum(np.maximum(corners, 0, out=corners), s2, out=corners)  # np.clip(corners, 0, s2), in place
    after = transform_boxes(canvas_labels[:, 1:5], m, out_size[1], out_size[0])
    return _filter_boxes(canvas_labels, canvas_labels[:, 1:5], after, zoom, 0.1)


__all__ = [
    "box_candidates",
    "lands_in",
    "mosaic_labels",
    "mosaic_layout",
    "perspective_labels",
    "perspective_matrix",
    "tile_placement",
    "transform_boxes",
]
