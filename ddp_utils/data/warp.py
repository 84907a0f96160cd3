"""The mosaic and the random perspective: each image warped once, straight into the output.

The mosaic never builds YOLOv5's 2x canvas: the placement of each tile and the random
perspective are composed into one matrix per tile, and each tile is warped straight into
its part of the final image. Every random choice comes from an explicit
``rng: np.random.Generator``. Boxes are pixel ``xyxy``; labels are ``[n, 5]`` arrays of
(class, x1, y1, x2, y2). Hyperparameter names are YOLOv5's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import cv2
import numpy as np

PAD_COLOR = (114, 114, 114)


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


def _filter_boxes(labels: np.ndarray, before: np.ndarray, after: np.ndarray, zoom: float, area_thr: float):
    keep = box_candidates(before * zoom, after, area_thr=area_thr)
    out = labels[keep].copy()
    out[:, 1:5] = after[keep]
    return out


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


def lands_in(m: np.ndarray, x0: float, y0: float, x1: float, y1: float, width: int, height: int) -> bool:
    """Whether the rectangle [x0, x1] x [y0, y1], mapped by ``m``, reaches into the width x height output.

    Its bounding box does: a rotated corner that only grazes the output still counts.

    Examples:
        >>> lands_in(np.eye(3), 20, 20, 30, 30, 10, 10)
        False
    """
    if _zoom_and_shift(m):
        sx, tx, sy, ty = m[0, 0], m[0, 2], m[1, 1], m[1, 2]  # a zoom and a shift: the common case, in floats
        return sx * x1 + tx > 0 and sy * y1 + ty > 0 and sx * x0 + tx < width and sy * y0 + ty < height
    corners = np.array([[x0, y0, 1], [x1, y0, 1], [x0, y1, 1], [x1, y1, 1]], np.float64) @ m.T
    xy = corners[:, :2] / corners[:, 2:3]
    (left, top), (right, bottom) = xy.min(0), xy.max(0)
    return bool(right > 0 and bottom > 0 and left < width and top < height)


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
