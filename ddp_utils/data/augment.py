"""Image augmentations for detection: letterbox, HSV, flips, mixup (the mosaic and perspective: ``warp.py``).

Every random choice comes from an explicit ``rng: np.random.Generator``, so a sample's
augmentation is a function of its seed alone (see ``ddp_utils.seed.derive_seed``), never of
global state, the worker that drew it or the rank. Boxes are pixel ``xyxy`` here; labels
are ``[n, 5]`` arrays of (class, x1, y1, x2, y2). Hyperparameter names are YOLOv5's.
"""

from __future__ import annotations

import cv2
import numpy as np

from .warp import PAD_COLOR


def letterbox(
    im: np.ndarray,
    new_shape: int | tuple[int, int] = 640,
    color: tuple[int, int, int] = PAD_COLOR,
    auto: bool = True,
    scaleFill: bool = False,  # noqa: N803 (YOLOv5's keyword)
    scaleup: bool = True,
    stride: int = 32,
    *,
    scale_fill: bool | None = None,
) -> tuple[np.ndarray, tuple[float, float], tuple[float, float]]:
    """Resize keeping the aspect ratio and pad to ``new_shape`` (h, w); YOLOv5's arguments, in its order.

    Args:
        im: HWC image.
        new_shape: target (h, w), or one int for a square.
        color: padding colour.
        auto: pad only to the next multiple of ``stride`` (minimum rectangle).
        scaleFill: stretch to ``new_shape`` without padding (``scale_fill`` is the same).
        scaleup: allow enlarging; False only shrinks (better val mAP).
        stride: the model's largest stride, for ``auto``.

    Returns:
        (image, (ratio_w, ratio_h), (pad_w, pad_h)) where the pads are per side.

    Examples:
        >>> out, ratio, pad = letterbox(np.zeros((200, 100, 3), np.uint8), 64, auto=False)
        >>> out.shape, ratio, pad
        ((64, 64, 3), (0.32, 0.32), (16.0, 0.0))
    """
    img = im
    scale_fill = scaleFill if scale_fill is None else scale_fill
    h, w = img.shape[:2]
    (new_w, new_h), ratio, pad, (top, bottom, left, right) = letterbox_geometry(
        (h, w), new_shape, auto, scale_fill, scaleup, stride
    )
    if (new_w, new_h) != (w, h):
        img = cv2.resize(img, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    if top or bottom or left or right:
        img = cv2.copyMakeBorder(img, top, bottom, left, right, cv2.BORDER_CONSTANT, value=color)
    return img, ratio, pad


def letterbox_geometry(
    shape: tuple[int, int],
    new_shape: int | tuple[int, int] = 640,
    auto: bool = True,
    scale_fill: bool = False,
    scaleup: bool = True,
    stride: int = 32,
) -> tuple[tuple[int, int], tuple[float, float], tuple[float, float], tuple[int, int, int, int]]:
    """What :func:`letterbox` does to an image of ``shape`` (h, w), without the image.

    Returns:
        ((new_w, new_h) the resized image, (ratio_w, ratio_h), (pad_w, pad_h) per side,
        (top, bottom, left, right) the padding in whole pixels).

    Examples:
        >>> letterbox_geometry((200, 100), 64, auto=False)
        ((32, 64), (0.32, 0.32), (16.0, 0.0), (0, 0, 16, 16))
    """
    h, w = shape
    if isinstance(new_shape, int):
        new_shape = (new_shape, new_shape)
    r = min(new_shape[0] / h, new_shape[1] / w)
    if not scaleup:
        r = min(r, 1.0)
    ratio = (r, r)
    new_w, new_h = round(w * r), round(h * r)
    dw, dh = new_shape[1] - new_w, new_shape[0] - new_h
    if auto:
        dw, dh = dw % stride, dh % stride
    elif scale_fill:
        dw, dh = 0, 0
        new_w, new_h = new_shape[1], new_shape[0]
        ratio = (new_shape[1] / w, new_shape[0] / h)
    dw, dh = dw / 2, dh / 2
    borders = (round(dh - 0.1), round(dh + 0.1), round(dw - 0.1), round(dw + 0.1))
    return (new_w, new_h), ratio, (dw, dh), borders


def augment_hsv(img: np.ndarray, hgain: float, sgain: float, vgain: float, rng: np.random.Generator) -> None:
    """Jitter hue, saturation and value of a BGR image in place by random gains.

    Each of H, S and V is multiplied by a gain drawn from ``1 +- gain``, saturating at 255;
    a hue pushed past OpenCV's 180 wraps round the colour circle (``HSV2BGR`` reads hue
    modulo 180), so the three gains are one diagonal ``cv2.transform``, several times
    faster than per-channel lookup tables.

    Examples:
        >>> im = np.full((4, 4, 3), 100, np.uint8)
        >>> augment_hsv(im, 0.0, 0.0, 0.0, np.random.default_rng(0)); int(im[0, 0, 0])
        100
        >>> im = np.full((4, 4, 3), (0, 0, 200), np.uint8)  # pure red: V 200, S 255
        >>> value_gain = 1 + 0.5 * np.random.default_rng(0).uniform(-1, 1, 3)[2]
        >>> augment_hsv(im, 0.0, 0.0, 0.5, np.random.default_rng(0))
        >>> im[0, 0].tolist() == [0, 0, round(200 * value_gain)]
        True
    """
    if not (hgain or sgain or vgain):
        return
    gains = rng.uniform(-1, 1, 3) * (hgain, sgain, vgain) + 1
    hsv = cv2.cvtColor(img, cv2.COLOR_BGR2HSV)
    cv2.transform(hsv, np.diag(gains).astype(np.float32), dst=hsv)
    cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR, dst=img)


def mixup(
    img: np.ndarray, labels: np.ndarray, img2: np.ndarray, labels2: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Blend two same-size images with a Beta(32, 32) weight and keep both label sets.

    Examples:
        >>> a, b = np.zeros((2, 2, 3), np.uint8), np.full((2, 2, 3), 200, np.uint8)
        >>> im, lab = mixup(a, np.zeros((1, 5)), b, np.ones((2, 5)), np.random.default_rng(0))
        >>> lab.shape, 50 < int(im[0, 0, 0]) < 150
        ((3, 5), True)
    """
    r = rng.beta(32.0, 32.0)
    blended = (img.astype(np.float32) * r + img2.astype(np.float32) * (1 - r)).astype(np.uint8)
    return blended, np.concatenate((labels, labels2), 0)


def flip_lr(img: np.ndarray, boxes_xywhn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror left-right; boxes are normalised (xc, yc, w, h) [n, 4].

    Examples:
        >>> _, b = flip_lr(np.zeros((2, 4, 3), np.uint8), np.array([[0.25, 0.5, 0.1, 0.1]]))
        >>> b.tolist()
        [[0.75, 0.5, 0.1, 0.1]]
    """
    boxes = boxes_xywhn.copy()
    boxes[:, 0] = 1 - boxes[:, 0]
    return cv2.flip(img, 1), boxes  # cv2.flip: ~100x faster than copying a numpy view


def flip_ud(img: np.ndarray, boxes_xywhn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror up-down; boxes are normalised (xc, yc, w, h) [n, 4]."""
    boxes = boxes_xywhn.copy()
    boxes[:, 1] = 1 - boxes[:, 1]
    return cv2.flip(img, 0), boxes


def scale_boxes_hw(boxes: np.ndarray, ratio: tuple[float, float], pad: tuple[float, float]) -> np.ndarray:
    """Apply a letterbox's (ratio_w, ratio_h) and (pad_w, pad_h) to pixel xyxy boxes."""
    out = boxes.astype(np.float32, copy=True)
    out[:, [0, 2]] = out[:, [0, 2]] * ratio[0] + pad[0]
    out[:, [1, 3]] = out[:, [1, 3]] * ratio[1] + pad[1]
    return out


__all__ = [
    "augment_hsv",
    "flip_lr",
    "flip_ud",
    "letterbox",
    "letterbox_geometry",
    "mixup",
    "scale_boxes_hw",
]
