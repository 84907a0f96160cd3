"""Letterbox undoing and non-maximum suppression; the box conversions, re-exported from :mod:`ddp_utils.boxes`.

The conversions accept torch tensors and numpy arrays alike and return a new object of
the same kind; :func:`clip_boxes` and :func:`scale_boxes` work in place, as YOLOv5's do,
and also return the boxes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torchvision

from ..boxes import Boxes, clip_boxes, xyn2xy, xywh2xyxy, xywhn2xyxy, xyxy2xywh, xyxy2xywhn


def letterbox_params(img1_shape: tuple[int, int], img0_shape: tuple[int, int]) -> tuple[float, tuple[float, float]]:
    """The gain and (left, top) padding that letterboxing an img0_shape image into img1_shape applied.

    The padding splits like the letterbox's: the left/top side gets the rounded-down half.

    Examples:
        >>> letterbox_params((640, 640), (480, 640))
        (1.0, (0, 80))
    """
    gain = min(img1_shape[0] / img0_shape[0], img1_shape[1] / img0_shape[1])
    pad_w = round((img1_shape[1] - img0_shape[1] * gain) / 2 - 0.1)
    pad_h = round((img1_shape[0] - img0_shape[0] * gain) / 2 - 0.1)
    return gain, (pad_w, pad_h)


def scale_boxes(
    img1_shape: tuple[int, int],
    boxes: Boxes,
    img0_shape: tuple[int, int],
    ratio_pad: Any = None,
) -> Boxes:
    """Map xyxy boxes in place from the letterboxed image (img1_shape, (h, w)) back to the original (img0_shape).

    Args:
        img1_shape: (height, width) of the network input.
        boxes: [n, >=4] xyxy boxes in network-input pixels; modified in place.
        img0_shape: (height, width) of the original image.
        ratio_pad: the loader's ``((h / h0, w / w0), (pad_w, pad_h))``; None recomputes it from the shapes.

    Returns:
        The same boxes, in original-image pixels, clipped to the image.

    Examples:
        >>> # a 320x640 image letterboxed to 640x640: scale 1, 160 px of padding on top
        >>> scale_boxes((640, 640), torch.tensor([[10.0, 170.0, 110.0, 270.0]]), (320, 640))
        tensor([[ 10.,  10., 110., 110.]])
    """
    if ratio_pad is None:
        gain, pad = letterbox_params(img1_shape, img0_shape)
    else:
        gain, pad = ratio_pad[0][0], ratio_pad[1]
    boxes[..., [0, 2]] -= pad[0]
    boxes[..., [1, 3]] -= pad[1]
    boxes[..., :4] /= gain
    return clip_boxes(boxes, img0_shape)


def non_max_suppression(
    prediction: torch.Tensor | tuple | list,
    conf_thres: float = 0.25,
    iou_thres: float = 0.45,
    classes: list[int] | None = None,
    agnostic: bool = False,
    multi_label: bool = False,
    labels: Sequence[torch.Tensor] = (),
    max_det: int = 300,
    nm: int = 0,
    *,
    max_nms: int = 30000,
) -> list[torch.Tensor]:
    """Filter the model's eval output to detections per image with class-aware NMS.

    Confidence is objectness x class score. With ``multi_label`` a box may be kept once per
    class above ``conf_thres`` (as for mAP evaluation), else only for its best class.

    Args:
        prediction: ``[B, N, 5 + nc]`` (xywh, objectness, class scores), or the eval tuple ``(pred, raw)``.
        conf_thres: minimum confidence kept.
        iou_thres: IoU above which the lower-scoring box of the same class is suppressed.
        classes: keep only these class indices.
        agnostic: suppress across classes too.
        multi_label: allow several labels per box.
        labels: per image, an ``[n, 5]`` tensor of known ``class, x, y, w, h`` (pixels) added as
            detections of confidence 1 before NMS (YOLOv5's ``--save-hybrid`` autolabelling).
        max_det: most detections kept per image.
        nm: YOLOv5's mask-coefficient count for segmentation models; only 0 (detection) is supported.
        max_nms: most boxes (by confidence) passed into NMS per image.

    The arguments are YOLOv5's, in its order.

    Returns:
        One ``[n, 6]`` float32 tensor per image: x1, y1, x2, y2, confidence, class (computed in float32 whatever
        the predictions' dtype: bf16 spaces values 4 px apart at 512-1024).

    Examples:
        >>> pred = torch.tensor([[[50.0, 50, 20, 20, 0.9, 0.9], [51, 50, 20, 20, 0.8, 0.9], [10, 10, 4, 4, 0.1, 1]]])
        >>> non_max_suppression(pred, conf_thres=0.25)[0]
        tensor([[40.0000, 40.0000, 60.0000, 60.0000,  0.8100,  0.0000]])
    """
    if isinstance(prediction, (list, tuple)):
        prediction = prediction[0]
    if not 0 <= conf_thres <= 1 or not 0 <= iou_thres <= 1:
        raise ValueError(f"conf_thres={conf_thres} and iou_thres={iou_thres} must lie in [0, 1]")
    if nm:
        raise ValueError(f"non_max_suppression(nm={nm}): ddp_utils' detector has no mask coefficients; use nm=0")
    nc = prediction.shape[2] - 5
    multi_label &= nc > 1
    output = [torch.zeros((0, 6), device=prediction.device) for _ in range(prediction.shape[0])]
    for index, x in enumerate(prediction.float()):
        x = _candidates(x, labels[index] if index < len(labels) else None, nc, conf_thres, multi_label, classes)
        if not x.shape[0]:
            continue
        x = x[x[:, 4].argsort(descending=True)[:max_nms]]
        groups = torch.zeros_like(x[:, 5]) if agnostic else x[:, 5]
        keep = torchvision.ops.batched_nms(x[:, :4], x[:, 4], groups, iou_thres)
        output[index] = x[keep[:max_det]]
    return output


def _candidates(
    x: torch.Tensor,
    known: torch.Tensor | None,
    nc: int,
    conf_thres: float,
    multi_label: bool,
    classes: list[int] | None,
) -> torch.Tensor:
    """One image's detections before NMS, ``[n, 6]`` (x1, y1, x2, y2, confidence, class); no rows when none passes."""
    x = x[x[:, 4] > conf_thres]
    if known is not None and len(known):
        x = torch.cat((x, _as_detections(known, nc).to(x)), 0)
    if not x.shape[0]:
        return x
    scores = x[:, 5:] * x[:, 4:5]
    box = xywh2xyxy(x[:, :4])
    if multi_label:
        i, j = (scores > conf_thres).nonzero(as_tuple=False).T
        x = torch.cat((box[i], scores[i, j, None], j[:, None].float()), 1)
    else:
        conf, j = scores.max(1, keepdim=True)
        x = torch.cat((box, conf, j.float()), 1)[conf.view(-1) > conf_thres]
    if classes is not None:
        x = x[(x[:, 5:6] == torch.tensor(classes, device=x.device)).any(1)]
    return x


def _as_detections(labels: torch.Tensor, nc: int) -> torch.Tensor:
    """Known ``class, x, y, w, h`` rows as raw predictions of objectness and class score 1."""
    rows = torch.zeros((len(labels), nc + 5), device=labels.device)
    rows[:, :4] = labels[:, 1:5]
    rows[:, 4] = 1.0
    rows[torch.arange(len(labels), device=labels.device), labels[:, 0].long() + 5] = 1.0
    return rows


__all__ = [
    "Boxes",
    "clip_boxes",
    "letterbox_params",
    "non_max_suppression",
    "scale_boxes",
    "xyn2xy",
    "xywh2xyxy",
    "xywhn2xyxy",
    "xyxy2xywh",
    "xyxy2xywhn",
]
