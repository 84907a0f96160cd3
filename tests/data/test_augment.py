"""Augmentations keep boxes consistent with the pixels: draw known rectangles, transform, compare."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from ddp_utils.boxes import xywhn2xyxy, xyxy2xywhn
from ddp_utils.data.augment import augment_hsv, flip_lr, flip_ud, letterbox, mixup
from ddp_utils.data.dataset import rect_batch_shapes
from ddp_utils.data.warp import box_candidates, mosaic4, perspective_matrix, random_perspective, transform_boxes

COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)]


def canvas_with_rect(h: int, w: int, box: tuple[int, int, int, int], colour=COLOURS[0], background=40):
    img = np.full((h, w, 3), background, np.uint8)
    x1, y1, x2, y2 = box
    img[y1:y2, x1:x2] = colour
    return img


def pixel_box(img: np.ndarray, colour, tol: int = 60) -> np.ndarray | None:
    """Bounding box (x1, y1, x2, y2) of the pixels close to ``colour``, None when there are none."""
    mask = np.abs(img.astype(int) - np.array(colour)).max(2) <= tol
    ys, xs = np.nonzero(mask)
    if len(xs) == 0:
        return None
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float32)


def test_letterbox_box_matches_pixels():
    img = canvas_with_rect(300, 200, (20, 50, 120, 250))
    out, ratio, (dw, dh) = letterbox(img, 160, auto=False)
    assert out.shape == (160, 160, 3)
    label = np.array([[20, 50, 120, 250]], np.float32)
    label[:, [0, 2]] = label[:, [0, 2]] * ratio[0] + dw
    label[:, [1, 3]] = label[:, [1, 3]] * ratio[1] + dh
    np.testing.assert_allclose(pixel_box(out, COLOURS[0]), label[0], atol=2)
    # the padding sits on both sides and keeps the pad colour
    assert dw > 0 and dh == 0 and (out[:, : int(dw) - 1] == 114).all()


def test_letterbox_auto_pads_to_stride_only():
    out, _, (dw, dh) = letterbox(np.zeros((300, 200, 3), np.uint8), 640, auto=True, stride=32)
    assert out.shape[0] == 640 and out.shape[1] % 32 == 0 and dh == 0


def test_letterbox_scaleup_false_never_enlarges():
    out, ratio, _ = letterbox(np.zeros((50, 40, 3), np.uint8), 128, auto=False, scaleup=False)
    assert ratio == (1.0, 1.0) and out.shape == (128, 128, 3)


@pytest.mark.parametrize("flip", [flip_lr, flip_ud])
def test_flips_box_matches_pixels(flip):
    h, w = 120, 160
    img = canvas_with_rect(h, w, (10, 20, 60, 50))
    boxes = xyxy2xywhn(np.array([[10, 20, 60, 50]], np.float32), w, h, clip=True, eps=1e-3)
    out, flipped = flip(img, boxes)
    np.testing.assert_allclose(pixel_box(out, COLOURS[0]), xywhn2xyxy(flipped, w, h)[0], atol=1)
    assert out.flags.c_contiguous


@pytest.mark.parametrize("seed", range(6))
def test_random_perspective_box_matches_pixels(seed):
    img = canvas_with_rect(256, 256, (70, 90, 170, 160))
    labels = np.array([[3, 70, 90, 170, 160]], np.float32)
    rng = np.random.default_rng(seed)
    out, new = random_perspective(img, labels, rng, degrees=30, translate=0.1, scale=0.3, shear=5, perspective=0.0005)
    assert out.shape == img.shape
    assert (new[:, 1:5] >= 0).all() and (new[:, [1, 3]] <= 256).all() and (new[:, [2, 4]] <= 256).all()
    seen = pixel_box(out, COLOURS[0])
    if len(new):
        assert new[0, 0] == 3
        np.testing.assert_allclose(seen, new[0, 1:5], atol=2.5)
    else:  # dropped as a candidate: little or nothing of it left in the image
        assert seen is None or (seen[2] - seen[0]) * (seen[3] - seen[1]) < 0.1 * 100 * 70 * 1.3**2


def test_random_perspective_same_rng_same_result():
    img = canvas_with_rect(64, 64, (10, 10, 40, 40))
    labels = np.array([[0, 10, 10, 40, 40]], np.float32)
    a = random_perspective(img, labels, np.random.default_rng(5), degrees=20, scale=0.5)
    b = random_perspective(img, labels, np.random.default_rng(5), degrees=20, scale=0.5)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    # and it did something: an identity warp (or one that ignores the generator) would pass the lines above
    assert a[0].shape == img.shape and not np.array_equal(a[0], img)
    assert len(a[1]) == 1 and not np.allclose(a[1][0, 1:5], labels[0, 1:5], atol=0.5)
    c = random_perspective(img, labels, np.random.default_rng(6), degrees=20, scale=0.5)
    assert not np.array_equal(c[0], a[0])


def mosaic_inputs(s: int, rng: np.random.Generator):
    images, labels = [], []
    for k in range(4):
        h, w = (s, int(s * 0.75)) if k % 2 else (int(s * 0.75), s)
        x1, y1 = rng.integers(5, w // 2), rng.integers(5, h // 2)
        x2, y2 = x1 + rng.integers(w // 5, w // 2), y1 + rng.integers(h // 5, h // 2)
        images.append(canvas_with_rect(h, w, (x1, y1, x2, y2), COLOURS[k]))
        labels.append(np.array([[k, x1, y1, x2, y2]], np.float32))
    return images, labels


@pytest.mark.parametrize("seed", range(8))
def test_mosaic_boxes_match_pixels(seed):
    s = 160
    rng = np.random.default_rng(seed)
    images, labels = mosaic_inputs(s, rng)
    # no rotation: a rotated box clipped at a corner over-covers its pixels (a known limit of boxes)
    hyp = {"degrees": 0, "translate": 0.1, "scale": 0.5, "shear": 0}
    out, new = mosaic4(images, labels, s, rng, hyp)
    assert out.shape == (s, s, 3)
    assert (new[:, 1:5] >= 0).all() and (new[:, 1:5] <= s).all()
    for row in new:
        seen = pixel_box(out, COLOURS[int(row[0])])
        assert seen is not None, f"label of tile {int(row[0])} but none of its pixels"
        np.testing.assert_allclose(seen, row[1:5], atol=2.5)


def test_mosaic_folds_the_resize_into_the_warp():
    s = 160
    images, labels = mosaic_inputs(s, np.random.default_rng(4))
    raw = [
        cv2.resize(im, (im.shape[1] * 3 // 2, im.shape[0] * 3 // 2), interpolation=cv2.INTER_NEAREST) for im in images
    ]
    raw[1] = cv2.resize(images[1], (images[1].shape[1] // 2, images[1].shape[0] // 2), interpolation=cv2.INTER_AREA)
    hyp = {"degrees": 0, "translate": 0.1, "scale": 0.5, "shear": 0}
    sizes = [im.shape[:2] for im in images]
    ref, ref_labels = mosaic4(images, labels, s, np.random.default_rng(2), hyp)
    out, new = mosaic4(raw, labels, s, np.random.default_rng(2), hyp, sizes=sizes)
    np.testing.assert_array_equal(new, ref_labels)
    for row in new:
        np.testing.assert_allclose(pixel_box(out, COLOURS[int(row[0])]), row[1:5], atol=2.5)
    assert (np.abs(out.astype(int) - ref.astype(int)).max(2) > 60).mean() < 0.03  # edges, <= 1 px apart


@pytest.mark.parametrize("degrees", [0, 10])
def test_mosaic_decodes_only_the_tiles_it_shows(degrees):
    s = 128
    images, labels = mosaic_inputs(s, np.random.default_rng(5))
    sizes = [im.shape[:2] for im in images]
    hyp = {"degrees": degrees, "translate": 0.1, "scale": 0.9, "shear": 0}  # zoom up to 1.9
    decoded = 0

    def lazy(img):
        def decode():
            nonlocal decoded
            decoded += 1
            return img

        return decode

    for seed in range(40):
        ref, ref_labels = mosaic4(images, labels, s, np.random.default_rng(seed), hyp, sizes=sizes)
        out, new = mosaic4([lazy(im) for im in images], labels, s, np.random.default_rng(seed), hyp, sizes=sizes)
        np.testing.assert_array_equal(out, ref)
        np.testing.assert_array_equal(new, ref_labels)
    assert 40 * 2 < decoded < 40 * 4  # some tiles fell outside the output and were never decoded


def test_mosaic_equals_canvas_then_warp():
    """One warp per tile gives the 2x canvas + one warp of YOLOv5's mosaic, up to interpolation at seams."""
    s = 128
    images, labels = mosaic_inputs(s, np.random.default_rng(3))
    hyp = {"degrees": 5, "translate": 0.1, "scale": 0.3, "shear": 0}
    out, _ = mosaic4(images, labels, s, np.random.default_rng(11), hyp)
    # replay the same draws: centre, then the matrix
    rng = np.random.default_rng(11)
    xc, yc = (int(rng.uniform(s // 2, 2 * s - s // 2)) for _ in range(2))
    m, _ = perspective_matrix(rng, (2 * s, 2 * s), (s, s), 5, 0.1, 0.3, 0, 0)
    canvas = np.full((2 * s, 2 * s, 3), 114, np.uint8)
    for k, img in enumerate(images):
        h, w = img.shape[:2]
        x0 = xc - w if k in (0, 2) else xc
        y0 = yc - h if k in (0, 1) else yc
        xa, ya = max(x0, 0), max(y0, 0)
        xb, yb = min(x0 + w, 2 * s), min(y0 + h, 2 * s)
        canvas[ya:yb, xa:xb] = img[ya - y0 : yb - y0, xa - x0 : xb - x0]
    reference = cv2.warpAffine(canvas, m[:2], (s, s), borderValue=(114, 114, 114))
    diff = np.abs(out.astype(int) - reference.astype(int)).max(2)
    assert (diff > 40).mean() < 0.01, f"{(diff > 40).mean():.3%} of pixels differ"


@pytest.mark.parametrize("seed", range(4))
def test_mosaic_pixels_sit_where_the_boxes_say_to_a_hundredth_of_a_pixel(seed):
    """A zoom and a shift (no rotation, the usual hyp): the same pixels as YOLOv5's canvas then warpAffine.

    Ramp images (the level says the column and the row) show a sub-pixel offset as a level offset:
    pixels placed at a whole pixel with cv2.resize sat on average 1 - zoom px off their boxes.
    """
    s = 128
    images = []
    for k in range(4):
        h, w = (s, 96) if k % 2 else (96, s)
        cols, rows = np.meshgrid(np.arange(w), np.arange(h))
        images.append(np.stack([2 * cols, 2 * rows, np.full_like(cols, 40 * k)], 2).astype(np.uint8))
    labels = [np.zeros((0, 5), np.float32)] * 4
    hyp = {"degrees": 0, "translate": 0.1, "scale": 0.5, "shear": 0}
    out, _ = mosaic4(images, labels, s, np.random.default_rng(seed), hyp)
    draws = np.random.default_rng(seed)  # the same draws: the centre, then the matrix
    xc, yc = (int(draws.uniform(s // 2, 2 * s - s // 2)) for _ in range(2))
    m, zoom = perspective_matrix(draws, (2 * s, 2 * s), (s, s), 0, 0.1, 0.5, 0, 0)
    canvas = np.full((2 * s, 2 * s, 3), 114, np.uint8)
    for k, img in enumerate(images):
        h, w = img.shape[:2]
        x0, y0 = xc - w if k in (0, 2) else xc, yc - h if k in (0, 1) else yc
        xa, ya, xb, yb = max(x0, 0), max(y0, 0), min(x0 + w, 2 * s), min(y0 + h, 2 * s)
        canvas[ya:yb, xa:xb] = img[ya - y0 : yb - y0, xa - x0 : xb - x0]
    reference = cv2.warpAffine(canvas, m[:2], (s, s), borderValue=(114, 114, 114))
    # compare inside the tiles only: away from their seams, where both sample one tile
    tile = cv2.warpAffine(canvas[:, :, 2], m[:2], (s, s), flags=cv2.INTER_NEAREST, borderValue=255)
    inside = (cv2.erode(tile, np.ones((5, 5), np.uint8)) == cv2.dilate(tile, np.ones((5, 5), np.uint8))) & (tile < 255)
    assert inside.mean() > 0.5
    diff = out[inside].astype(float) - reference[inside].astype(float)
    offset_px = np.abs(diff[:, :2].mean(0)) / (2 * zoom)  # 2 levels per source pixel, zoom pixels per source pixel
    assert (offset_px < 0.01).all(), f"pixels {offset_px} px off (zoom {zoom:.2f})"
    assert np.abs(diff).max() <= 1


def test_mixup_keeps_both_label_sets_and_blends():
    a, b = np.zeros((8, 8, 3), np.uint8), np.full((8, 8, 3), 200, np.uint8)
    img, lab = mixup(a, np.zeros((2, 5)), b, np.ones((3, 5)), np.random.default_rng(0))
    assert lab.shape == (5, 5) and 60 < img.mean() < 140


def test_hsv_in_place_and_seeded():
    rng_img = np.random.default_rng(0).integers(0, 255, (32, 32, 3)).astype(np.uint8)
    a, b = rng_img.copy(), rng_img.copy()
    augment_hsv(a, 0.015, 0.7, 0.4, np.random.default_rng(1))
    augment_hsv(b, 0.015, 0.7, 0.4, np.random.default_rng(1))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, rng_img)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hsv_scales_each_channel_by_its_gain(seed):
    img = np.random.default_rng(seed).integers(0, 256, (64, 64, 3)).astype(np.uint8)
    hsv = cv2.cvtColor(img, cv2.COLOR_BGR2HSV).astype(np.float64)
    gh, gs, gv = np.random.default_rng(seed).uniform(-1, 1, 3) * (0.1, 0.7, 0.4) + 1
    out = img.copy()
    augment_hsv(out, 0.1, 0.7, 0.4, np.random.default_rng(seed))
    got = cv2.cvtColor(out, cv2.COLOR_BGR2HSV).astype(np.float64)
    value, sat = np.minimum(hsv[..., 2] * gv, 255), np.minimum(hsv[..., 1] * gs, 255)
    hue = (hsv[..., 0] * gh) % 180
    # reading HSV back from 8-bit BGR loses a little, most for hue in dark or grey pixels
    assert np.abs(got[..., 2] - value).max() <= 1
    bright = value > 128
    assert np.abs(got[..., 1] - sat)[bright].max() <= 4
    colourful = bright & (sat > 128)
    hue_error = np.abs(got[..., 0] - hue)[colourful]
    assert np.minimum(hue_error, 180 - hue_error).max() <= 2


def test_box_candidates_and_transform_boxes():
    before = np.array([[0, 0, 100, 100], [0, 0, 100, 100], [0, 0, 100, 100]], np.float32)
    after = np.array([[0, 0, 90, 90], [0, 0, 1, 50], [0, 0, 20, 20]], np.float32)
    assert box_candidates(before, after).tolist() == [True, False, False]
    rot90 = np.array([[0, -1, 100], [1, 0, 0], [0, 0, 1]], np.float64)
    np.testing.assert_allclose(transform_boxes(np.array([[10, 20, 30, 60.0]]), rot90, 100, 100), [[40, 10, 80, 30]])


def test_rect_batch_shapes_are_stride_multiples():
    aspect = np.array([0.5, 0.6, 1.0, 1.5, 2.0])
    shapes = rect_batch_shapes(aspect, [[0, 1], [2], [3, 4]], 640, 32, 0.5)
    assert (shapes % 32 == 0).all()
    assert shapes[0].tolist() == [416, 672] and shapes[2].tolist() == [672, 448]
