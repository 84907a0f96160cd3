"""YoloDataset over a real synthetic dataset: outputs, determinism, rect shapes, collate functions."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from ddp_utils.data.dataset import SampleKey, YoloDataset
from ddp_utils.data.labels import find_images, load_labels
from ddp_utils.data.synthetic import make_shapes_dataset
from tests.workers.data_scenarios import HYP


@pytest.fixture(scope="module")
def label_set(tmp_path_factory):
    root = make_shapes_dataset(tmp_path_factory.mktemp("ds") / "shapes", 12, 0, size=(96, 160))
    return load_labels(find_images(root / "images" / "train"))


def test_item_layout_without_augmentation(label_set):
    ds = YoloDataset(label_set, imgsz=128)
    img, labels, path, shapes = ds[0]
    assert img.dtype == torch.uint8 and img.shape == (3, 128, 128) and img.is_contiguous()
    assert labels.dtype == torch.float32 and labels.shape[1] == 6 and (labels[:, 0] == 0).all()
    assert ((labels[:, 2:] >= 0) & (labels[:, 2:] <= 1)).all()
    (h0, w0), ((gain_h, gain_w), (padw, padh)) = shapes
    w, h = label_set.shapes[0]
    assert (h0, w0) == (h, w) and path == label_set.im_files[0]
    # RGB, and the letterboxed content is the resized original
    bgr = cv2.imread(path)
    resized = cv2.resize(bgr, (round(w0 * gain_w), round(h0 * gain_h)), interpolation=cv2.INTER_AREA)
    top, left = round(padh - 0.1), round(padw - 0.1)
    got = img.numpy().transpose(1, 2, 0)[top : top + resized.shape[0], left : left + resized.shape[1], ::-1]
    assert np.abs(got.astype(int) - resized.astype(int)).mean() < 1.0
    # the labels map back onto the original boxes
    xywh = labels[:, 2:].numpy() * 128
    x_orig = (xywh[:, 0] - padw) / gain_w / w0
    np.testing.assert_allclose(x_orig, label_set.labels[0][:, 1], atol=1e-3)


def test_mosaic_items_have_no_shapes_and_valid_boxes(label_set):
    ds = YoloDataset(label_set, imgsz=96, augment=True, hyp=HYP)
    for i in range(len(ds)):
        img, labels, _, shapes = ds[i]
        assert shapes is None and img.shape == (3, 96, 96)
        assert ((labels[:, 2:4] >= 0) & (labels[:, 2:4] <= 1)).all() and (labels[:, 4:] > 0).all()


def test_augmentation_is_a_function_of_the_key(label_set):
    ds = YoloDataset(label_set, imgsz=96, augment=True, hyp=HYP, seed=1)
    a = ds[SampleKey(epoch=2, slot=5, index=3)]
    b = ds[SampleKey(epoch=2, slot=5, index=3)]
    c = ds[SampleKey(epoch=3, slot=5, index=3)]
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_single_cls_and_labels_attribute(label_set):
    ds = YoloDataset(label_set, imgsz=64, single_cls=True)
    assert all((lb[:, 0] == 0).all() for lb in ds.labels)
    assert all(lb.shape[1] == 5 for lb in ds.labels)
    assert (ds[1][1][:, 1] == 0).all()


def test_rect_sorts_by_aspect_and_uses_stride_multiples(label_set):
    ds = YoloDataset(label_set, imgsz=128, batch_size=4, rect=True, stride=32, pad=0.5)
    aspect = ds.shapes[:, 1] / ds.shapes[:, 0]
    assert (np.diff(aspect) >= 0).all()
    assert (ds.batch_shapes % 32 == 0).all() and len(ds.batch_shapes) == 3
    batch = YoloDataset.collate_fn([ds[i] for i in range(4)])
    assert tuple(batch[0].shape[2:]) == tuple(ds.batch_shapes[0])


def test_collate_fn_sets_batch_index(label_set):
    ds = YoloDataset(label_set, imgsz=64)
    imgs, targets, paths, shapes = YoloDataset.collate_fn([ds[i] for i in range(3)])
    assert imgs.shape == (3, 3, 64, 64) and len(paths) == 3 and len(shapes) == 3
    counts = [len(ds.labels[i]) for i in range(3)]
    assert targets[:, 0].tolist() == [float(i) for i, c in enumerate(counts) for _ in range(c)]


def test_collate_fn4_makes_double_size_images(label_set):
    ds = YoloDataset(label_set, imgsz=64)
    torch.manual_seed(0)
    imgs, targets, paths, shapes = YoloDataset.collate_fn4([ds[i] for i in range(8)])
    assert imgs.shape == (2, 3, 128, 128) and len(paths) == 2
    assert set(targets[:, 0].tolist()) <= {0.0, 1.0}
    assert ((targets[:, 2:] >= 0) & (targets[:, 2:] <= 1)).all()


def test_empty_label_set_is_refused(label_set):
    from dataclasses import replace

    empty = replace(label_set, im_files=[], label_files=[], labels=[], shapes=np.zeros((0, 2)), messages=["x"])
    with pytest.raises(ValueError, match="no usable images"):
        YoloDataset(empty)


@pytest.mark.parametrize("cache", ["ram", "disk"])
def test_cached_items_equal_uncached(label_set, cache):
    plain = YoloDataset(label_set, imgsz=96, augment=True, hyp=HYP)
    cached = YoloDataset(label_set, imgsz=96, augment=True, hyp=HYP, cache=cache)
    assert cached.cache is not None
    for i in (0, 5):
        a, b = plain[SampleKey(1, i, i)], cached[SampleKey(1, i, i)]
        other = plain[SampleKey(2, i, i)]
        # an uncached mosaic resizes each tile it shows as the caches resize it: the same sample
        assert torch.equal(a[1], b[1]) and torch.equal(a[0], b[0]) and not torch.equal(a[0], other[0])


def grain(img: torch.Tensor) -> float:
    grey = cv2.cvtColor(np.ascontiguousarray(img.numpy().transpose(1, 2, 0)), cv2.COLOR_RGB2GRAY)
    return float(np.abs(cv2.Laplacian(grey, cv2.CV_32F)).mean())


def test_mosaics_are_no_grainier_than_the_val_images(label_set):
    # images shrunk to 0.4-0.67 of their size: a tile warped straight from the decoded image aliased the
    # background's pixel grain (1.7x the val images' mean |Laplacian|); resized first, as YOLOv5 does, it is not
    hyp = {**HYP, "scale": 0.0, "hsv_v": 0.0}
    train = YoloDataset(label_set, imgsz=64, augment=True, hyp={**hyp, "mosaic": 1.0})
    val = YoloDataset(label_set, imgsz=64)
    train_grain = np.mean([grain(train[SampleKey(0, i, i)][0]) for i in range(len(train))])
    val_grain = np.mean([grain(val[i][0]) for i in range(len(val))])
    assert 0.7 < train_grain / val_grain < 1.25, (train_grain, val_grain)
