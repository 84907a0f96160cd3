"""ddp_utils.boxes: YOLOv5's box conversions, one home for data/ and yolo/."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ddp_utils import boxes
from ddp_utils.yolo import ops


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_round_trips_keep_the_kind(kind):
    rng = np.random.default_rng(0)
    xywhn = np.concatenate([rng.uniform(0.2, 0.8, (20, 2)), rng.uniform(0.05, 0.3, (20, 2))], 1)
    x = torch.from_numpy(xywhn) if kind == "torch" else xywhn
    xyxy = boxes.xywhn2xyxy(x, w=320, h=240, padw=4, padh=2)
    assert type(xyxy) is type(x) and xyxy is not x
    back = boxes.xyxy2xywhn(xyxy - torch.tensor([4, 2, 4, 2]) if kind == "torch" else xyxy - [4, 2, 4, 2], 320, 240)
    np.testing.assert_allclose(np.asarray(back), xywhn, atol=1e-9)
    np.testing.assert_allclose(np.asarray(boxes.xyxy2xywh(boxes.xywh2xyxy(x))), xywhn, atol=1e-12)


def test_xyn2xy_scales_points_and_pads():
    pts = np.array([[0.0, 0.0], [1.0, 0.5]])
    assert boxes.xyn2xy(pts, w=10, h=20, padw=1, padh=2).tolist() == [[1.0, 2.0], [11.0, 12.0]]


def test_clip_in_xyxy2xywhn_stays_inside_the_image():
    out = boxes.xyxy2xywhn(np.array([[-10.0, -10.0, 700.0, 700.0]]), 640, 640, clip=True, eps=1e-3)
    assert (out[:, :2] - out[:, 2:] / 2 >= 0).all() and (out[:, :2] + out[:, 2:] / 2 < 1).all()


def test_xywhn2xyxy_keeps_the_boxes_dtype_and_matches_yolov5s_order_to_the_last_bit():
    x = np.random.default_rng(0).random((50, 4)).astype(np.float32)
    out = boxes.xywhn2xyxy(x, 321, 123, 7, 3)
    assert out.dtype == np.float32
    left, right = 321 * (x[:, 0] - x[:, 2] / 2) + 7, 321 * (x[:, 0] + x[:, 2] / 2) + 7
    top, bottom = 123 * (x[:, 1] - x[:, 3] / 2) + 3, 123 * (x[:, 1] + x[:, 3] / 2) + 3
    yolov5_order = np.stack([left, top, right, bottom], 1)
    np.testing.assert_allclose(out, yolov5_order, rtol=1e-6, atol=1e-4)


def test_one_home_old_paths_give_the_same_functions():
    for name in ("xywh2xyxy", "xyxy2xywh", "xywhn2xyxy", "xyxy2xywhn", "xyn2xy", "clip_boxes"):
        assert getattr(ops, name) is getattr(boxes, name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("clip", [False, True])
def test_xyxy2xywhn_of_rows_equals_the_general_path_bit_for_bit(monkeypatch, dtype, clip):
    # [n, 4] float arrays take a shortcut (the loader's per-sample cost): the same values as the general path
    rng = np.random.default_rng(0)
    for _ in range(100):
        x = rng.uniform(-20, 90, (int(rng.integers(0, 12)), 4)).astype(dtype)
        w, h = int(rng.integers(16, 80)), float(rng.uniform(16, 80))
        fast = boxes.xyxy2xywhn(x, w, h, clip=clip, eps=1e-3)
        with monkeypatch.context() as general:
            general.setattr(boxes, "_plain_rows", lambda x: False)
            ref = boxes.xyxy2xywhn(x, w, h, clip=clip, eps=1e-3)
        assert fast.dtype == ref.dtype == dtype and fast.shape == ref.shape
        np.testing.assert_array_equal(fast, ref)
        assert fast.tobytes() == ref.tobytes()
