"""Box conversions, letterbox undoing and NMS against hand-made cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ddp_utils.yolo import (
    clip_boxes,
    letterbox_params,
    non_max_suppression,
    scale_boxes,
    xywh2xyxy,
    xywhn2xyxy,
    xyxy2xywh,
    xyxy2xywhn,
)

finite = st.floats(0.0, 1000.0, allow_nan=False, allow_infinity=False)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(finite, finite, finite, finite), min_size=1, max_size=8))
def test_conversions_round_trip(rows):
    boxes = np.array(rows, dtype=np.float64)
    assert np.allclose(xyxy2xywh(xywh2xyxy(boxes)), boxes)
    tensor = torch.tensor(rows, dtype=torch.float64)
    assert torch.allclose(xywhn2xyxy(xyxy2xywhn(tensor, w=1000, h=800), w=1000, h=800), tensor)


def test_conversions_do_not_modify_their_input():
    boxes = torch.tensor([[10.0, 20.0, 4.0, 8.0]])
    assert torch.equal(xywh2xyxy(boxes), torch.tensor([[8.0, 16.0, 12.0, 24.0]]))
    assert torch.equal(boxes, torch.tensor([[10.0, 20.0, 4.0, 8.0]]))
    assert isinstance(xyxy2xywh(boxes.numpy()), np.ndarray)


def test_xywhn2xyxy_with_padding_and_clipped_normalisation():
    assert torch.equal(
        xywhn2xyxy(torch.tensor([[0.5, 0.5, 1.0, 1.0]]), w=100, h=50, padw=3, padh=7),
        torch.tensor([[3.0, 7.0, 103.0, 57.0]]),
    )
    out = xyxy2xywhn(torch.tensor([[-10.0, 0.0, 50.0, 60.0]]), w=100, h=50, clip=True)
    assert torch.allclose(out, torch.tensor([[0.25, 0.5, 0.5, 1.0]]))


def test_clip_boxes_tensor_and_numpy():
    t = torch.tensor([[-3.0, -1.0, 70.0, 40.0]])
    assert clip_boxes(t, (30, 64)) is t and torch.equal(t, torch.tensor([[0.0, 0.0, 64.0, 30.0]]))
    a = np.array([[5.0, 50.0, 10.0, 60.0]])
    assert np.array_equal(clip_boxes(a, (40, 64)), np.array([[5.0, 40.0, 10.0, 40.0]]))


def test_scale_boxes_with_the_loaders_ratio_pad():
    # a 200 x 300 (h0, w0) image letterboxed into 128 x 128: gain 128/300, 21 px padding above
    gain = 128 / 300
    ratio_pad = ((gain, gain), (0, 21.3333))
    original = torch.tensor([[30.0, 40.0, 150.0, 180.0]])
    letterboxed = original * gain + torch.tensor([0, 21.3333, 0, 21.3333])
    back = scale_boxes((128, 128), letterboxed.clone(), (200, 300), ratio_pad)
    assert torch.allclose(back, original, atol=1e-3)


def test_scale_boxes_without_ratio_pad_recomputes_the_letterbox():
    assert letterbox_params((64, 64), (100, 200)) == (0.32, (0, 16))
    boxes = torch.tensor([[0.0, 16.0, 64.0, 48.0], [10.0, 0.0, 20.0, 10.0]])  # the second lies in the padding
    out = scale_boxes((64, 64), boxes, (100, 200))
    assert torch.allclose(out, torch.tensor([[0.0, 0.0, 200.0, 100.0], [31.25, 0.0, 62.5, 0.0]]))


def _pred(rows: list[list[float]], nc: int) -> torch.Tensor:
    """Rows of (x, y, w, h, obj, cls) to a [1, n, 5 + nc] eval-format prediction with one-hot class scores."""
    out = torch.zeros((1, len(rows), 5 + nc))
    for i, (x, y, w, h, obj, cls) in enumerate(rows):
        out[0, i, :5] = torch.tensor([x, y, w, h, obj])
        out[0, i, 5 + int(cls)] = 1.0
    return out


def test_nms_suppresses_overlaps_within_a_class_only():
    pred = _pred(
        [
            [50, 50, 20, 20, 0.9, 0],
            [52, 50, 20, 20, 0.8, 0],  # IoU 0.82 with the first: suppressed
            [52, 50, 20, 20, 0.7, 1],  # same place, other class: kept
            [150, 150, 20, 20, 0.6, 0],  # elsewhere: kept
            [10, 10, 4, 4, 0.2, 0],  # below conf_thres
        ],
        nc=2,
    )
    (out,) = non_max_suppression(pred, conf_thres=0.25, iou_thres=0.45)
    assert out.shape == (3, 6)
    assert out[:, 4].tolist() == pytest.approx([0.9, 0.7, 0.6])
    assert out[:, 5].tolist() == [0.0, 1.0, 0.0]
    assert torch.allclose(out[0, :4], torch.tensor([40.0, 40.0, 60.0, 60.0]))
    (agnostic,) = non_max_suppression(pred, conf_thres=0.25, iou_thres=0.45, agnostic=True)
    assert agnostic[:, 4].tolist() == pytest.approx([0.9, 0.6])
    (only_1,) = non_max_suppression(pred, conf_thres=0.25, classes=[1])
    assert only_1[:, 5].tolist() == [1.0]


def test_nms_multi_label_max_det_and_empty_images():
    pred = torch.zeros((2, 3, 7))
    pred[0, 0] = torch.tensor([50, 50, 20, 20, 0.9, 0.8, 0.6])  # two classes above threshold
    pred[0, 1] = torch.tensor([150, 50, 20, 20, 0.9, 0.5, 0.0])
    first, second = non_max_suppression((pred, None), conf_thres=0.3, iou_thres=0.5, multi_label=True)
    found = sorted((int(c), round(conf, 4)) for c, conf in zip(first[:, 5].tolist(), first[:, 4].tolist()))
    assert found == [(0, 0.45), (0, 0.72), (1, 0.54)]
    assert second.shape == (0, 6)
    (capped, _) = non_max_suppression(pred, conf_thres=0.3, multi_label=True, max_det=2)
    assert capped[:, 4].tolist() == pytest.approx([0.72, 0.54])
    with pytest.raises(ValueError, match="conf_thres"):
        non_max_suppression(pred, conf_thres=1.5)
