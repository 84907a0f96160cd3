"""The loader's fast path gives the very samples of the general one, bit for bit.

With the usual hyp (no rotation, shear or perspective) the mosaic's matrix only zooms and
shifts, and the warp takes shortcuts: the matrix multiplied out in floats, each tile placed by
four numbers, boxes mapped by two corners, the four tiles' labels converted at once. Each
shortcut is compared here with the general route (3x3 products, four corners per box, one
label conversion per tile) over many random draws: images and labels equal, not close.
"""

from __future__ import annotations

from dataclasses import replace

import cv2
import numpy as np
import pytest
import torch

from ddp_utils.data import geometry, warp
from ddp_utils.data.dataset import SampleKey, YoloDataset
from ddp_utils.data.labels import find_images, load_labels
from ddp_utils.data.synthetic import make_shapes_dataset
from tests.workers.data_scenarios import HYP


def matrix_product(rng, in_size, out_size, degrees, translate, scale, shear, perspective):
    """The random transform as five 3x3 matrices multiplied: centre, perspective, rotate, shear, shift."""
    centre = np.eye(3)
    centre[0, 2], centre[1, 2] = -in_size[0] / 2, -in_size[1] / 2
    persp = np.eye(3)
    persp[2, 0], persp[2, 1] = rng.uniform(-perspective, perspective, 2)
    rotate = np.eye(3)
    angle, zoom = rng.uniform(-degrees, degrees), rng.uniform(1 - scale, 1 + scale)
    rotate[:2] = cv2.getRotationMatrix2D(center=(0, 0), angle=angle, scale=zoom)
    shear_m = np.eye(3)
    shear_m[0, 1], shear_m[1, 0] = np.tan(np.deg2rad(rng.uniform(-shear, shear, 2)))
    shift = np.eye(3)
    shift[0, 2] = rng.uniform(0.5 - translate, 0.5 + translate) * out_size[0]
    shift[1, 2] = rng.uniform(0.5 - translate, 0.5 + translate) * out_size[1]
    return shift @ shear_m @ rotate @ persp @ centre, zoom


def random_hyp(rng: np.random.Generator, general: bool) -> dict[str, float]:
    return {
        "degrees": rng.uniform(0, 45) if general else 0.0,
        "translate": rng.uniform(0, 0.5),
        "scale": rng.uniform(0, 0.95),
        "shear": rng.uniform(0, 10) if general else 0.0,
        "perspective": rng.uniform(0, 1e-3) if general else 0.0,
    }


def test_perspective_matrix_is_the_product_of_its_five_matrices():
    meta = np.random.default_rng(0)
    for draw in range(2000):
        hyp = random_hyp(meta, general=draw % 2 == 1)
        side = int(meta.integers(16, 1300))
        out_size = (side, side) if draw % 3 else tuple(int(v) for v in meta.integers(16, 2000, 2))
        seed = int(meta.integers(1 << 30))
        m, zoom = warp.perspective_matrix(np.random.default_rng(seed), (2 * side, 2 * side), out_size, **hyp)
        ref, ref_zoom = matrix_product(np.random.default_rng(seed), (2 * side, 2 * side), out_size, **hyp)
        assert m.dtype == np.float64 and m.shape == (3, 3)
        np.testing.assert_array_equal(m, ref, err_msg=f"draw {draw}, hyp {hyp}")
        assert zoom == ref_zoom


def mosaic_draw(rng: np.random.Generator, s: int):
    """Four noise tiles (every pixel tells where it came from), each standing for a (h, w) of long side s,
    some stored at another size (the resize folded into the warp), with 0-5 boxes that may leave the tile."""
    images, labels, sizes = [], [], []
    for _ in range(4):
        short = int(rng.integers(max(s // 3, 1), s + 1))
        h, w = (s, short) if rng.random() < 0.5 else (short, s)
        stored = (h, w) if rng.random() < 0.5 else (max(int(h * rng.uniform(0.4, 2.5)), 1), max(int(w * 0.9), 1))
        images.append(rng.integers(0, 256, (*stored, 3), dtype=np.uint8))
        n = int(rng.integers(0, 6))
        x1, y1 = rng.uniform(-0.2 * w, w, n), rng.uniform(-0.2 * h, h, n)
        boxes = np.stack([x1, y1, x1 + rng.uniform(1, w / 2, n), y1 + rng.uniform(1, h / 2, n)], 1)
        labels.append(np.hstack([rng.integers(0, 3, (n, 1)), boxes]).astype(np.float32))
        sizes.append((h, w))
    return images, labels, sizes


@pytest.mark.parametrize("s", [64, 160])
def test_mosaic_fast_path_equals_general_path(monkeypatch, s):
    placed = 0
    place_tile = warp._place_tile

    def counting_place_tile(*args):
        nonlocal placed
        placed += 1
        place_tile(*args)

    monkeypatch.setattr(warp, "_place_tile", counting_place_tile)
    meta = np.random.default_rng(s)
    boxes_kept = 0
    for draw in range(150):
        images, labels, sizes = mosaic_draw(meta, s)
        hyp = random_hyp(meta, general=False)
        border = None if draw % 4 else (-int(meta.integers(0, s // 2 + 1)), -int(meta.integers(0, s // 2 + 1)))
        seed = int(meta.integers(1 << 30))
        out, new = warp.mosaic4(images, labels, s, np.random.default_rng(seed), hyp, sizes, border)
        with monkeypatch.context() as general:
            general.setattr(warp, "_zoom_and_shift", lambda m: False)  # the warp's route
            general.setattr(geometry, "_zoom_and_shift", lambda m: False)  # and the boxes'
            ref, ref_labels = warp.mosaic4(images, labels, s, np.random.default_rng(seed), hyp, sizes, border)
        np.testing.assert_array_equal(out, ref, err_msg=f"image of draw {draw}")
        np.testing.assert_array_equal(new, ref_labels, err_msg=f"labels of draw {draw}")
        assert new.dtype == ref_labels.dtype == np.float32
        boxes_kept += len(new)
    assert placed > 150 * 2 and boxes_kept > 150  # the fast path ran, and had boxes to keep


def test_transform_boxes_fast_path_equals_four_corners(monkeypatch):
    rng = np.random.default_rng(1)
    for _ in range(200):
        boxes = rng.uniform(-50, 700, (int(rng.integers(1, 30)), 4)).astype(np.float32)
        boxes[:, 2:] = boxes[:, :2] + rng.uniform(0, 300, (len(boxes), 2))
        (zoom_x, zoom_y), (shift_x, shift_y) = rng.uniform(0.05, 2, 2), rng.uniform(-400, 400, 2)
        m = np.array([[zoom_x, 0, shift_x], [0, zoom_y, shift_y], [0, 0, 1]])
        out = warp.transform_boxes(boxes, m, 640, 480)
        with monkeypatch.context() as general:
            general.setattr(geometry, "_zoom_and_shift", lambda m: False)
            ref = warp.transform_boxes(boxes, m, 640, 480)
        assert out.dtype == ref.dtype == np.float32
        np.testing.assert_array_equal(out, ref)


@pytest.fixture(scope="module")
def label_set(tmp_path_factory):
    root = make_shapes_dataset(tmp_path_factory.mktemp("ds") / "shapes", 12, 0, size=(96, 160))
    labels = load_labels(find_images(root / "images" / "train"))
    empty = labels.labels[3][:0]
    return replace(labels, labels=[empty if i in (3, 7) else lab for i, lab in enumerate(labels.labels)])


def per_tile_labels(self, indices, sizes):
    return [self._pixel_labels(int(i), w, h) for i, (h, w) in zip(indices, sizes)]


@pytest.mark.parametrize(("imgsz", "cache"), [(64, "ram"), (96, None)])
def test_dataset_samples_equal_the_general_path(monkeypatch, label_set, imgsz, cache):
    ds = YoloDataset(label_set, imgsz=imgsz, augment=True, hyp=HYP, cache=cache)
    keys = [SampleKey(epoch, slot, (7 * slot + epoch) % len(ds)) for epoch in range(3) for slot in range(12)]
    fast = [ds[key] for key in keys]
    with monkeypatch.context() as general:
        general.setattr(warp, "_zoom_and_shift", lambda m: False)
        general.setattr(YoloDataset, "_tile_labels", per_tile_labels)
        ref = [ds[key] for key in keys]
    for key, (img, labels, *_), (ref_img, ref_labels, *_) in zip(keys, fast, ref):
        assert torch.equal(img, ref_img), key
        assert torch.equal(labels, ref_labels), key
    assert sum(len(sample[1]) for sample in fast) > len(keys)


def test_tile_labels_equal_per_tile_conversion(label_set):
    ds = YoloDataset(label_set, imgsz=64, augment=True, hyp=HYP)
    rng = np.random.default_rng(0)
    for _ in range(50):
        indices = rng.integers(0, len(ds), 4)
        sizes = [(int(h), int(w)) for h, w in rng.integers(8, 700, (4, 2))]
        got = ds._tile_labels(indices, sizes)
        for part, ref in zip(got, per_tile_labels(ds, indices, sizes)):
            assert part.dtype == ref.dtype and part.shape == ref.shape
            np.testing.assert_array_equal(part, ref)
