"""Box-format conversions under YOLOv5's names, shared by ``data/`` and ``yolo/``.

At the bottom of the package: imports only NumPy and torch. Every conversion takes a torch
tensor or a NumPy array of boxes in its last dimension and returns a new object of the same
kind; :func:`clip_boxes` works in place, as YOLOv5's does, and also returns the boxes.

``xywh``: centre x, centre y, width, height; ``xyxy``: top-left and bottom-right corners;
a trailing ``n`` means normalised to the image's width and height.
"""

from __future__ import annotations

from typing import Union

import numpy as np
import torch

Boxes = Union[torch.Tensor, np.ndarray]


def _copy(x: Boxes) -> Boxes:
    return x.clone() if isinstance(x, torch.Tensor) else np.copy(x)


def xywh2xyxy(x: Boxes) -> Boxes:
    """Centre, width, height to corners.

    Examples:
        >>> xywh2xyxy(torch.tensor([[10.0, 10.0, 4.0, 6.0]]))
        tensor([[ 8.,  7., 12., 13.]])
    """
    y = _copy(x)
    y[..., 0] = x[..., 0] - x[..., 2] / 2
    y[..., 1] = x[..., 1] - x[..., 3] / 2
    y[..., 2] = x[..., 0] + x[..., 2] / 2
    y[..., 3] = x[..., 1] + x[..., 3] / 2
    return y


def xyxy2xywh(x: Boxes) -> Boxes:
    """Corners to centre, width, height.

    Examples:
        >>> xyxy2xywh(np.array([[8.0, 7.0, 12.0, 13.0]]))
        array([[10., 10.,  4.,  6.]])
    """
    y = _copy(x)
    y[..., 0] = (x[..., 0] + x[..., 2]) / 2
    y[..., 1] = (x[..., 1] + x[..., 3]) / 2
    y[..., 2] = x[..., 2] - x[..., 0]
    y[..., 3] = x[..., 3] - x[..., 1]
    return y


def xywhn2xyxy(x: Boxes, w: float = 640, h: float = 640, padw: float = 0, padh: float = 0) -> Boxes:
    """Normalised centre, width, height to pixel corners in a (padded) w x h image.

    Computed as centre -/+ half size in the boxes' own dtype (float32 for the data pipeline's
    labels): YOLOv5's ``w * (x - w_box / 2) + padw`` gives the same values up to the last bit.

    Examples:
        >>> xywhn2xyxy(torch.tensor([[0.5, 0.5, 0.25, 0.5]]), w=100, h=200)
        tensor([[ 37.5000,  50.0000,  62.5000, 150.0000]])
        >>> xywhn2xyxy(np.array([[0.5, 0.5, 0.5, 0.5]], np.float32), 100, 50, 10, 0).tolist()
        [[35.0, 12.5, 85.0, 37.5]]
    """
    w, h, padw, padh = float(w), float(h), float(padw), float(padh)  # Python floats: the boxes' dtype rules
    y = _copy(x)
    centre_x, centre_y = x[..., 0] * w + padw, x[..., 1] * h + padh
    half_w, half_h = x[..., 2] * (w / 2), x[..., 3] * (h / 2)
    y[..., 0] = centre_x - half_w
    y[..., 1] = centre_y - half_h
    y[..., 2] = centre_x + half_w
    y[..., 3] = centre_y + half_h
    return y


def xyxy2xywhn(x: Boxes, w: float = 640, h: float = 640, clip: bool = False, eps: float = 0.0) -> Boxes:
    """Pixel corners to normalised centre, width, height; ``clip`` first clips to the image less ``eps``.

    Examples:
        >>> xyxy2xywhn(torch.tensor([[37.5, 50.0, 62.5, 150.0]]), w=100, h=200)
        tensor([[0.5000, 0.5000, 0.2500, 0.5000]])
    """
    if _plain_rows(x) and {type(w), type(h), type(eps)} <= {int, float}:
        return _xyxy2xywhn_rows(x, w, h, clip, eps)
    if clip:
        x = clip_boxes(_copy(x), (h - eps, w - eps))
    y = _copy(x)
    y[..., 0] = ((x[..., 0] + x[..., 2]) / 2) / w
    y[..., 1] = ((x[..., 1] + x[..., 3]) / 2) / h
    y[..., 2] = (x[..., 2] - x[..., 0]) / w
    y[..., 3] = (x[..., 3] - x[..., 1]) / h
    return y


def _plain_rows(x: Boxes) -> bool:
    return isinstance(x, np.ndarray) and x.ndim == 2 and x.shape[1] == 4 and x.dtype in (np.float32, np.float64)


def _xyxy2xywhn_rows(x: np.ndarray, w: float, h: float, clip: bool, eps: float) -> np.ndarray:
    # xyxy2xywhn of an [n, 4] float array in five NumPy calls instead of some twenty (a cost per sample in the
    # loader): the same operations on the same values in the array's dtype (w, h and the bounds, Python numbers
    # there, cast to it as NumPy casts them), so the same bits
    if clip:
        x = np.minimum(np.maximum(x, 0), np.array((w - eps, h - eps, w - eps, h - eps), x.dtype))  # np.clip
    y = np.empty_like(x)
    size = np.array((w, h), x.dtype)
    np.divide((x[:, :2] + x[:, 2:]) / 2, size, out=y[:, :2])
    np.divide(x[:, 2:] - x[:, :2], size, out=y[:, 2:])
    return y


def xyn2xy(x: Boxes, w: float = 640, h: float = 640, padw: float = 0, padh: float = 0) -> Boxes:
    """Normalised points [..., 2] (segment polygons) to pixels in a (padded) w x h image.

    Examples:
        >>> xyn2xy(np.array([[0.5, 0.25]]), w=100, h=200, padw=10)
        array([[60., 50.]])
    """
    y = _copy(x)
    y[..., 0] = w * x[..., 0] + padw
    y[..., 1] = h * x[..., 1] + padh
    return y


def clip_boxes(boxes: Boxes, shape: tuple[float, float]) -> Boxes:
    """Clip xyxy boxes in place to an image of ``shape`` = (height, width).

    Examples:
        >>> clip_boxes(torch.tensor([[-5.0, 2.0, 120.0, 90.0]]), (80, 100))
        tensor([[  0.,   2., 100.,  80.]])
    """
    height, width = shape[0], shape[1]
    if isinstance(boxes, torch.Tensor):
        boxes[..., 0].clamp_(0, width)
        boxes[..., 1].clamp_(0, height)
        boxes[..., 2].clamp_(0, width)
        boxes[..., 3].clamp_(0, height)
    else:
        boxes[..., [0, 2]] = boxes[..., [0, 2]].clip(0, width)
        boxes[..., [1, 3]] = boxes[..., [1, 3]].clip(0, height)
    return boxes


__all__ = [
    "Boxes",
    "clip_boxes",
    "xyn2xy",
    "xywh2xyxy",
    "xywhn2xyxy",
    "xyxy2xywh",
    "xyxy2xywhn",
]
