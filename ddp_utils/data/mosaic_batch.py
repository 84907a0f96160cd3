"""The training batch's mosaics made together: the samples of ``YoloDataset[key]``, bit for bit, in less time.

At small sizes (64 px) a sample's pixels cost little and its Python and small-array calls
most: four tiles' labels converted, placed, clipped, mapped, filtered, normalised and
flipped, an HSV round trip, a dozen random draws, each a few microseconds. Here a batch's
mosaics (the usual hyp: a zoom and a shift, no mixup) are drawn and warped one by one as
:meth:`YoloDataset.load_mosaic` does, into one array for the batch, and the rest is done
once per batch:

- the labels of all the batch's tiles in one pass of NumPy calls: the same float32 and
  float64 operations on the same values, row by row, as the per-sample route;
- the colour conversions to HSV and back on the whole batch (OpenCV converts row by row, and
  the batch's rows are its images' rows: each pixel goes through the same code, SIMD or not);
  the gains, one ``cv2.transform`` per sample as before;
- the random numbers after a sample's tile choice in two ``rng.random(k)``: ``uniform(lo, hi)``
  is ``lo + (hi - lo) * random()``, the same double.

A sample the batch route does not cover (no mosaic drawn, mixup drawn, a zoom not above 0)
is made again from its key by ``dataset[key]``: every sample is a function of its key alone,
so starting it over gives it exactly. ``tests/data/test_mosaic_batch.py`` compares the two
routes.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, NamedTuple

import cv2
import numpy as np
import torch

from ..boxes import xyxy2xywhn
from ..hyp import hyp_value
from ..seed import derive_seed
from .geometry import box_candidates
from .images import resized_shape
from .warp import PAD_COLOR, warp_tiles

# a YoloDataset and a SampleKey: dataset.py imports this module, not the other way round
_Dataset = Any
_Key = tuple


_CHUNK_PIXELS = 16 * 640 * 640  # most mosaic pixels made at once: 20 MB for each of the route's few batch arrays


class _Mosaic(NamedTuple):
    # what the batch's image and label passes need of one sample made here
    slot: int  # its place in the batch
    index: int  # its image (the key's)
    tiles: list[int]  # the four images, in tile order
    sizes: list[tuple[int, int]]  # the (h, w) each tile stands for
    offsets: list[tuple[int, int]]  # where each tile sits on the 2s canvas
    affine: tuple[float, float, float, float]  # (a, tx, b, ty): canvas (x, y) to output (a x + tx, b y + ty)
    zoom: float
    gains: np.ndarray | None  # the HSV gains, None without HSV jitter
    flip_ud: bool
    flip_lr: bool


class _Plan(NamedTuple):
    # the hyp's numbers as the per-sample route reads them, once per batch
    mosaic: float
    mixup: float
    zoom: tuple[float, float]  # perspective_matrix's uniform(1 - scale, 1 + scale): low and high
    shift: tuple[float, float]  # its uniform(0.5 - translate, 0.5 + translate)
    jitter: tuple[float, float, float] | None  # augment_hsv's gains; None: no HSV draws
    flipud: float
    fliplr: float


def batch_plan(dataset: _Dataset) -> _Plan | None:
    """What :func:`mosaic_batch` needs of the hyp, or None where it leaves every sample to ``dataset[key]``.

    The batch route makes training mosaics of the default border whose transform only zooms and
    shifts: no rotation, shear or perspective in the hyp (as ``mosaic4`` reads them), a scale and a
    translation not below 0.
    """
    hyp, s = dataset.hyp, dataset.imgsz
    if not (dataset.mosaic and s % 2 == 0 and list(dataset.mosaic_border) == [-s // 2, -s // 2]):
        return None
    if any(hyp.get(name, 0.0) != 0 for name in ("degrees", "shear", "perspective")):
        return None
    scale, translate = hyp.get("scale", 0.0), hyp.get("translate", 0.0)
    if not (isinstance(scale, (int, float)) and isinstance(translate, (int, float)) and scale >= 0 <= translate):
        return None
    jitter = (hyp_value(hyp, "hsv_h"), hyp_value(hyp, "hsv_s"), hyp_value(hyp, "hsv_v"))
    return _Plan(
        mosaic=hyp_value(hyp, "mosaic"),
        mixup=hyp_value(hyp, "mixup"),
        zoom=(float(1 - scale), float(1 + scale)),
        shift=(float(0.5 - translate), float(0.5 + translate)),
        jitter=jitter if any(jitter) else None,
        flipud=hyp_value(hyp, "flipud"),
        fliplr=hyp_value(hyp, "fliplr"),
    )


def mosaic_batch(dataset: _Dataset, keys: Sequence[_Key]) -> list[tuple]:
    """``[dataset[key] for key in keys]``, the mosaics among them made together.

    Args:
        dataset: a :class:`~ddp_utils.data.dataset.YoloDataset`.
        keys: the batch's sample keys.

    Returns:
        One ``(img, labels, path, shapes)`` per key, equal to ``dataset[key]``'s; the images
        and labels of the mosaics made here are views of one array each for the batch.
    """
    plan = batch_plan(dataset) if keys else None
    if plan is None or plan.mosaic <= 0:
        return [dataset[key] for key in keys]
    chunk = max(_CHUNK_PIXELS // dataset.imgsz**2, 1)  # a large batch of large images in parts
    if len(keys) > chunk:
        return [
            sample
            for start in range(0, len(keys), chunk)
            for sample in mosaic_batch(dataset, keys[start : start + chunk])
        ]
    s = dataset.imgsz
    samples: list = [None] * len(keys)
    canvas = np.full((len(keys), s, s, 3), PAD_COLOR[0], np.uint8)
    mosaics = []
    for slot, key in enumerate(keys):
        mosaic = _draw_and_warp(dataset, plan, key, slot, canvas[slot])
        if mosaic is None:
            samples[slot] = dataset[key]  # started over from its key: the same sample
        else:
            mosaics.append(mosaic)
    if mosaics:
        chw = _finish_images(canvas, mosaics)
        labels, bounds = _batch_labels(dataset.labels, mosaics, s)
        for mosaic, (start, end) in zip(mosaics, bounds):
            image, path = torch.from_numpy(chw[mosaic.slot]), dataset.im_files[mosaic.index]
            samples[mosaic.slot] = (image, torch.from_numpy(labels[start:end]), path, None)
    return samples


def _draw_and_warp(dataset: _Dataset, plan: _Plan, key: _Key, slot: int, out: np.ndarray) -> _Mosaic | None:
    # YoloDataset.__getitem__'s draws for a mosaic, in its order, and mosaic4's warps into out; None where the
    # sample leaves the route (no mosaic, mixup, a zoom not above 0) before any warp. Each uniform(low, high) is
    # low + (high - low) * random(), the same double: NumPy's own formula.
    s, s2 = dataset.imgsz, 2 * dataset.imgsz
    index = int(dataset._indices[key.index])
    rng = np.random.default_rng(derive_seed(dataset.seed, key.epoch, key.slot, index))
    if not rng.random() < plan.mosaic:
        return None
    others = dataset._indices[rng.integers(0, len(dataset), 3)]  # load_mosaic's
    tiles = [int(i) for i in rng.permutation([index, *others])]
    # mosaic4's centre (2), perspective_matrix's perspective (2), angle, zoom, shear (2), shift (2); the mixup's
    u = rng.random(11).tolist()
    low, high = float(s // 2), float(s2 - s // 2)
    xc, yc = int(low + (high - low) * u[0]), int(low + (high - low) * u[1])
    low, high = plan.zoom
    zoom = low + (high - low) * u[5]
    if not zoom > 0 or u[10] < plan.mixup:
        return None
    low, high = plan.shift
    tx, ty = (low + (high - low) * u[8]) * s, (low + (high - low) * u[9]) * s
    centre = s2 / 2
    affine = (zoom, tx - zoom * centre, zoom, ty - zoom * centre)  # perspective_matrix's zoom and shift
    images, sizes = [], []
    cache = dataset.cache
    for i in tiles:
        if cache is None:  # decoded only if its tile shows
            w0, h0 = dataset.shapes[i]
            images.append(partial(dataset._tile_image, i))
            sizes.append(resized_shape(int(h0), int(w0), s))
        else:
            img = cache[i]
            images.append(img)
            sizes.append(img.shape[:2])
    offsets = warp_tiles(out, images, sizes, (xc, yc), affine, s2)
    v = rng.random(2 if plan.jitter is None else 5)  # augment_hsv's gains, then the two flips
    gains = None if plan.jitter is None else (-1.0 + 2.0 * v[:3]) * plan.jitter + 1
    flip_ud, flip_lr = bool(v[-2] < plan.flipud), bool(v[-1] < plan.fliplr)
    return _Mosaic(slot, index, tiles, sizes, offsets, affine, zoom, gains, flip_ud, flip_lr)


def _finish_images(canvas: np.ndarray, mosaics: list[_Mosaic]) -> np.ndarray:
    # augment_hsv, the flips and the CHW RGB split of each mosaic; the colour conversions for the whole batch
    s = canvas.shape[1]
    rows = canvas.reshape(-1, s, 3)
    if mosaics[0].gains is not None:  # the hyp's: all or none
        hsv = cv2.cvtColor(rows, cv2.COLOR_BGR2HSV).reshape(canvas.shape)
        for mosaic in mosaics:
            cv2.transform(hsv[mosaic.slot], np.diag(mosaic.gains).astype(np.float32), dst=hsv[mosaic.slot])
        cv2.cvtColor(hsv.reshape(-1, s, 3), cv2.COLOR_HSV2BGR, dst=rows)
    chw = np.empty((len(canvas), 3, s, s), np.uint8)
    for mosaic in mosaics:
        img = canvas[mosaic.slot]
        if mosaic.flip_ud or mosaic.flip_lr:  # flip_ud then flip_lr: one flip about both axes
            img = cv2.flip(img, -1 if mosaic.flip_ud and mosaic.flip_lr else int(mosaic.flip_lr))
        planes = chw[mosaic.slot]
        cv2.split(img, [planes[2], planes[1], planes[0]])  # BGR HWC to RGB CHW
    return chw


def _batch_labels(labels: Sequence[np.ndarray], mosaics: list[_Mosaic], s: int) -> tuple[np.ndarray, list]:
    # The labels of every mosaic, as __getitem__ makes them ([n, 6] float32 (0, class, xc, yc, w, h)), in one pass:
    # load_mosaic's _tile_labels, mosaic4's placing and clipping, transform_boxes' zoom and shift, _filter_boxes,
    # xyxy2xywhn and the flips, each the same operation in the same dtype on each row (each by its own sample's
    # numbers). Returns the rows and each mosaic's (start, end) in them.
    parts = [labels[i] for mosaic in mosaics for i in mosaic.tiles]
    counts = [len(part) for part in parts]
    per_sample = np.add.reduceat(counts, np.arange(0, len(counts), 4)) if counts else np.zeros(0, np.int64)
    rows = np.concatenate(parts, 0)
    scale = np.repeat(np.array([size for m in mosaics for size in m.sizes], np.float32)[:, ::-1], counts, axis=0)
    centre, half = rows[:, 1:3] * scale, rows[:, 3:5] * (scale / 2)
    shift = np.array([(0, dx, dy, dx, dy) for m in mosaics for dx, dy in m.offsets], np.float32)
    placed = np.concatenate((rows[:, :1], centre - half, centre + half), 1) + np.repeat(shift, counts, axis=0)
    corners = placed[:, 1:5]
    np.minimum(np.maximum(corners, 0, out=corners), 2 * s, out=corners)
    a, tx, b, ty = np.repeat(np.array([m.affine for m in mosaics]), per_sample, axis=0).T[:, :, None]  # float64
    after = np.empty((len(rows), 4), np.float32)
    np.minimum(np.maximum(corners[:, 0::2] * a + tx, 0), s, out=after[:, 0::2])
    np.minimum(np.maximum(corners[:, 1::2] * b + ty, 0), s, out=after[:, 1::2])
    zoom = np.repeat(np.array([m.zoom for m in mosaics], np.float32), per_sample)[:, None]  # a Python float's cast
    keep = box_candidates(corners * zoom, after, area_thr=0.1)
    owner = np.repeat(np.arange(len(mosaics)), per_sample)[keep]
    boxes = xyxy2xywhn(after[keep], s, s, clip=True, eps=1e-3)
    for column, flipped in ((1, [m.flip_ud for m in mosaics]), (0, [m.flip_lr for m in mosaics])):
        rows_flipped = np.array(flipped)[owner]
        boxes[rows_flipped, column] = 1 - boxes[rows_flipped, column]
    out = np.zeros((len(boxes), 6), np.float32)
    out[:, 1] = placed[keep, 0]
    out[:, 2:] = boxes
    ends = np.cumsum(np.bincount(owner, minlength=len(mosaics)))
    return out, list(zip([0, *ends[:-1].tolist()], ends.tolist()))


__all__ = ["batch_plan", "mosaic_batch"]
