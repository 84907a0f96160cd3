"""A training sample as a recipe: every random draw and the labels of ``YoloDataset[key]``, no pixels.

With ``--augment-on device`` the loader's workers do not decode, warp or colour a single pixel:
for each sample they make the same random draws, in the same order, from the same generator
as :meth:`YoloDataset.__getitem__` (so the same augmentation distribution and the same resume
story), compute the labels exactly as it does (the same NumPy operations on the same values:
labels never depend on pixels), and describe the image as a :class:`Recipe`: which images,
placed where on a canvas, mapped to the output by which transform, mixed, coloured and
flipped how. A batch travels as a :class:`RecipeBatch`: the recipes and, once per image the
batch uses, its JPEG file's bytes (or, for another format, an EXIF-rotated JPEG or a cached
image, its pixels decoded here as today). The training process renders it on its device
(:mod:`ddp_utils.data.device.render`).

Coordinates follow OpenCV's: pixel ``i`` has its centre at ``i``. A *tile* is an image
resized so its long side is ``imgsz`` (``load_image``'s ``(h, w)``); the *canvas* is the
mosaic's ``2 * imgsz`` square, or for a letterboxed sample the letterboxed image.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from ...boxes import xyxy2xywhn
from ...hyp import hyp_value
from ...seed import derive_seed
from ..augment import letterbox_geometry
from ..geometry import lands_in, mosaic_labels, mosaic_layout, perspective_labels, perspective_matrix, tile_placement
from ..headers import batch_decode_unfit, jpeg_frame
from ..images import image_noted, load_image, note_bad_image, resized_shape
from .plan import RowPlan, row_plan

_Dataset = Any  # a YoloDataset: dataset.py imports this module, not the other way round


class Placement(NamedTuple):
    """One image's part of a canvas.

    Attributes:
        image: the dataset's image index (in a :class:`RecipeBatch`, the index into its sources).
        rect: (x0, y0, x1, y1), the canvas pixels it covers, ends excluded.
        affine: (sx, ox, sy, oy): canvas point (x, y) is tile point (sx * x + ox, sy * y + oy).
        crop: (u0, v0, u1, v1), the tile pixels it shows, ends excluded.
    """

    image: int
    rect: tuple[int, int, int, int]
    affine: tuple[float, float, float, float]
    crop: tuple[int, int, int, int]


class Layer(NamedTuple):
    """A canvas and how it maps to the output: ``inverse`` (3x3 float64) takes output pixels to canvas pixels.

    A mosaic's ``centre`` (xc, yc) is where its four tiles meet: each placement lies in one quadrant around it,
    the tiles 0-3 top left, top right, bottom left, bottom right (``tile_placement``); None for one image.
    """

    inverse: np.ndarray
    placements: list[Placement]
    centre: tuple[int, int] | None = None


class Recipe(NamedTuple):
    """How one training image is made from its tiles.

    Attributes:
        size: the output's (h, w).
        layers: one canvas, or two for a mixup (blended ``mix`` : ``1 - mix``).
        mix: the mixup's Beta(32, 32) weight of the first layer; None without a mixup.
        gains: the HSV gains (float64 [3]); None without HSV jitter.
        flip_ud: flipped up-down (after the colours).
        flip_lr: flipped left-right (after that).
    """

    size: tuple[int, int]
    layers: list[Layer]
    mix: float | None
    gains: np.ndarray | None
    flip_ud: bool
    flip_lr: bool


class RecipeBatch(NamedTuple):
    """A batch as the workers send it with ``--augment-on device``: what to render, and from what.

    Every source's bytes travel in ONE uint8 tensor (``data``: one shared-memory segment from the worker,
    pinned once in the training process): the JPEG files first, then the pixels of the sources the
    workers decoded themselves (other formats, EXIF-rotated JPEGs, cached images: their tiles, BGR
    ``[h, w, 3]``), so those arrive on the device in one copy.

    Attributes:
        recipes: one per sample; their placements' ``image`` index the sources.
        data: uint8, 1-D: the sources' bytes, back to back (the JPEGs, then the pixels).
        spans: source ``i`` is ``data[spans[i][0]:spans[i][1]]``.
        jpeg: per source, whether it is a JPEG file's bytes (else its tile's BGR pixels).
        sizes: per source, its tile's (h, w).
        originals: per source, the (h, w) it decodes to (the tile's for pixels).
        paths: per source, its file (named when it cannot be decoded).
        plan: the recipes' half of the render's tables (:func:`~ddp_utils.data.device.plan.row_plan`), made where
            the batch is (a loader worker), so that the training process does not loop over the samples.
    """

    recipes: list[Recipe]
    data: torch.Tensor
    spans: list[tuple[int, int]]
    jpeg: list[bool]
    sizes: list[tuple[int, int]]
    originals: list[tuple[int, int]]
    paths: list[str]
    plan: RowPlan

    def __len__(self) -> int:  # the number of samples, as a batch of images has
        return len(self.recipes)

    def source(self, i: int) -> torch.Tensor | np.ndarray:
        """Source ``i``: its JPEG bytes (a uint8 tensor, a view of ``data``) or its tile's BGR pixels (an array)."""
        view = self.data[self.spans[i][0] : self.spans[i][1]]
        return view if self.jpeg[i] else view.numpy().reshape(*self.sizes[i], 3)

    @property
    def sources(self) -> list[bytes | np.ndarray]:
        """Every source as bytes (a JPEG) or a BGR array (a copy of the bytes, for inspection)."""
        return [bytes(s.numpy()) if self.jpeg[i] else s for i, s in enumerate(map(self.source, range(len(self.jpeg))))]


def pack_sources(
    recipes: list[Recipe],
    sources: Sequence[bytes | np.ndarray],
    sizes: Sequence[tuple[int, int]],
    originals: Sequence[tuple[int, int]],
    paths: Sequence[str],
) -> RecipeBatch:
    """A :class:`RecipeBatch` from each source's bytes (a JPEG) or tile (a BGR array): the JPEGs, then the pixels,
    copied once into one tensor in shared memory when made in a loader worker (torch sends it as is), and the
    recipes' plan of the render's tables.

    Args:
        recipes: the samples' recipes, their placements numbering ``sources``.
        sources: per source, JPEG bytes or the tile's BGR uint8 ``[h, w, 3]``.
        sizes: per source, the tile's (h, w).
        originals: per JPEG source, its decoded (h, w) (ignored for pixels: their tile's).
        paths: per source, its file.
    """
    jpeg = [not isinstance(source, np.ndarray) for source in sources]
    order = [i for i in range(len(sources)) if jpeg[i]] + [i for i in range(len(sources)) if not jpeg[i]]
    lengths = [len(sources[i]) if jpeg[i] else sources[i].size for i in range(len(sources))]
    data = torch.empty(sum(lengths), dtype=torch.uint8)
    if torch.utils.data.get_worker_info() is not None:  # a worker: the tensor travels as its shared memory
        data.share_memory_()
    spans, start, buffer = [(0, 0)] * len(sources), 0, data.numpy()
    for i in order:
        source = sources[i]
        buffer[start : start + lengths[i]] = np.frombuffer(source, np.uint8) if jpeg[i] else source.reshape(-1)
        spans[i], start = (start, start + lengths[i]), start + lengths[i]
    originals = [tuple(originals[i]) if jpeg[i] else tuple(sizes[i]) for i in range(len(sources))]
    sizes = [tuple(s) for s in sizes]
    return RecipeBatch(recipes, data, spans, jpeg, sizes, originals, list(paths), row_plan(recipes))


def plan_sample(dataset: _Dataset, key: Any) -> tuple[Recipe, torch.Tensor, str, Any]:
    """``dataset[key]`` with a :class:`Recipe` in place of the image: the same draws, the same labels.

    Args:
        dataset: a :class:`~ddp_utils.data.dataset.YoloDataset` that augments.
        key: a :class:`~ddp_utils.data.dataset.SampleKey`.

    Returns:
        ``(recipe, labels, path, shapes)``; labels and shapes equal ``dataset[key]``'s.
    """
    index = int(dataset._indices[key.index])
    rng = np.random.default_rng(derive_seed(dataset.seed, key.epoch, key.slot, index))
    hyp = dataset.hyp
    mix = None
    if dataset.mosaic and rng.random() < hyp_value(hyp, "mosaic"):
        layer, labels, size = _mosaic(dataset, index, rng)
        layers, shapes = [layer], None
        if rng.random() < hyp_value(hyp, "mixup"):  # mixup()'s draw follows the second mosaic's
            second, labels2, _ = _mosaic(dataset, int(rng.integers(0, len(dataset))), rng)
            mix = float(rng.beta(32.0, 32.0))
            layers.append(second)
            labels = np.concatenate((labels, labels2), 0)
    else:
        layer, labels, shapes, size = _letterboxed(dataset, index, key.batch, rng)
        layers = [layer]
    h, w = size
    boxes = xyxy2xywhn(np.asarray(labels[:, 1:5], np.float32), w, h, clip=True, eps=1e-3) if len(labels) else None
    gains, flip_ud, flip_lr = None, False, False
    if dataset.augment:  # augment_hsv's draw (only with a gain), then the two flips: __getitem__'s order
        jitter = (hyp_value(hyp, "hsv_h"), hyp_value(hyp, "hsv_s"), hyp_value(hyp, "hsv_v"))
        if any(jitter):
            gains = rng.uniform(-1, 1, 3) * jitter + 1
        flip_ud = bool(rng.random() < hyp_value(hyp, "flipud"))
        flip_lr = bool(rng.random() < hyp_value(hyp, "fliplr"))
    out = np.zeros((len(labels), 6), dtype=np.float32)
    if len(labels):
        for column, flipped in ((1, flip_ud), (0, flip_lr)):
            if flipped:  # flip_ud's and flip_lr's box arithmetic, on a copy as theirs
                boxes = boxes.copy()
                boxes[:, column] = 1 - boxes[:, column]
        out[:, 1] = labels[:, 0]
        out[:, 2:] = boxes
    recipe = Recipe((h, w), layers, mix, gains, flip_ud, flip_lr)
    return recipe, torch.from_numpy(out), dataset.im_files[index], shapes


def _tile_sizes(dataset: _Dataset, indices: Sequence[int]) -> list[tuple[int, int]]:
    # the (h, w) of each image's tile, as load_image and the caches make it
    return [resized_shape(int(dataset.shapes[i][1]), int(dataset.shapes[i][0]), dataset.imgsz) for i in indices]


def _mosaic(dataset: _Dataset, index: int, rng: np.random.Generator) -> tuple[Layer, np.ndarray, tuple[int, int]]:
    # load_mosaic's draws and mosaic4's layout and labels; a tile that does not reach the output is left out,
    # as mosaic4 never decodes it
    s = dataset.imgsz
    others = dataset._indices[rng.integers(0, len(dataset), 3)]
    indices = [int(i) for i in rng.permutation([index, *others])]
    sizes = _tile_sizes(dataset, indices)
    tile_labels = dataset._tile_labels(indices, sizes)
    default = dataset.mosaic_border == [-s // 2, -s // 2] and s % 2 == 0
    (xc, yc), m, zoom, (out_h, out_w) = mosaic_layout(s, rng, dataset.hyp, None if default else dataset.mosaic_border)
    placements, offsets = [], []
    for k, i in enumerate(indices):
        h, w = sizes[k]
        x1a, y1a, x1b, y1b, x2b, y2b = tile_placement(k, xc, yc, h, w, 2 * s)
        dx, dy = x1a - x1b, y1a - y1b
        offsets.append((dx, dy))
        x2a, y2a = x1a + x2b - x1b, y1a + y2b - y1b
        if x2b > x1b and y2b > y1b and lands_in(m, x1a, y1a, x2a, y2a, out_w, out_h):
            placements.append(Placement(i, (x1a, y1a, x2a, y2a), (1.0, -dx, 1.0, -dy), (x1b, y1b, x2b, y2b)))
    labels = mosaic_labels(tile_labels, offsets, m, zoom, 2 * s, (out_h, out_w))
    return Layer(np.linalg.inv(m), placements, (xc, yc)), labels, (out_h, out_w)


def _letterboxed(dataset: _Dataset, index: int, batch: int, rng: np.random.Generator) -> tuple:
    # YoloDataset._letterboxed without the pixels: letterbox's geometry, then random_perspective's draws and labels
    w0, h0 = (int(v) for v in dataset.shapes[index])
    (h, w) = _tile_sizes(dataset, [index])[0]
    if dataset.rect:
        shape = tuple(int(v) for v in dataset.batch_shapes[batch if batch >= 0 else dataset.batch_index[index]])
    else:
        shape = dataset.imgsz
    (new_w, new_h), ratio, pad, (top, bottom, left, right) = letterbox_geometry(
        (h, w), shape, auto=False, scaleup=dataset.augment
    )
    out_h, out_w = new_h + top + bottom, new_w + left + right
    shapes = ((h0, w0), ((h / h0 * ratio[1], w / w0 * ratio[0]), pad))
    labels = dataset._pixel_labels(index, ratio[0] * w, ratio[1] * h, pad[0], pad[1])
    m = np.eye(3)
    if dataset.augment:
        names = ("degrees", "translate", "scale", "shear", "perspective")
        m, zoom = perspective_matrix(rng, (out_w, out_h), (out_w, out_h), *(hyp_value(dataset.hyp, n) for n in names))
        labels = perspective_labels(labels, m, zoom, out_w, out_h)
    # cv2.resize's sampling: output pixel x reads the tile at (x + 0.5) * w / new_w - 0.5
    sx, sy = w / new_w, h / new_h
    affine = (sx, (0.5 - left) * sx - 0.5, sy, (0.5 - top) * sy - 0.5)
    placement = Placement(index, (left, top, left + new_w, top + new_h), affine, (0, 0, w, h))
    return Layer(np.linalg.inv(m), [placement]), labels, shapes, (out_h, out_w)


def image_source(dataset: _Dataset, i: int) -> bytes | np.ndarray:
    """What the training process renders image ``i`` from: its JPEG bytes, or its tile's BGR pixels.

    The bytes of a JPEG that a batched hardware decode takes (8-bit, baseline or extended
    sequential, three YCbCr components: :func:`~ddp_utils.data.headers.batch_decode_unfit`),
    whose header gives the size the label scan found and no EXIF rotation, and that no process of
    this job has noted as damaged or undecodable on the device
    (:func:`~ddp_utils.data.images.image_noted`). Otherwise the tile as the CPU path makes it
    (``dataset.load_image``: the cache, or the CPU decoder with its messages for a file it cannot
    read); a progressive, grey, CMYK or otherwise unfit JPEG is named once in the log with why
    (:func:`~ddp_utils.data.images.note_bad_image`): it costs one decode here and never reaches
    the device's batched decode.

    Args:
        dataset: the YoloDataset.
        i: an image index.
    """
    path = dataset.im_files[i]
    if dataset.cache is None and not image_noted(path):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            data = b""  # load_image says what is wrong with the file
        frame = jpeg_frame(io.BytesIO(data)) if data[:2] == b"\xff\xd8" else None
        if frame is not None and frame.orientation == 1 and (frame.width, frame.height) == tuple(dataset.shapes[i]):
            unfit = batch_decode_unfit(frame)
            if unfit is None:
                return data
            note_bad_image(path, f"{unfit}, which nvJPEG's batched decode (the device path on a GPU) does not take")
    return np.ascontiguousarray(dataset.load_image(i)[0])


class RecipeCollate:
    """The collate function of a dataset that plans: samples to ``(RecipeBatch, labels, paths, shapes)``.

    Labels are collated as :meth:`YoloDataset.collate_fn` does (column 0: the image's place in the
    batch); each image the batch's recipes use is read once.

    Args:
        dataset: the YoloDataset whose images the recipes name.
    """

    def __init__(self, dataset: _Dataset) -> None:
        self.dataset = dataset

    def __call__(self, batch: Sequence[tuple]) -> tuple:
        recipes, labels, paths, shapes = zip(*batch)
        for i, lb in enumerate(labels):
            lb[:, 0] = i
        where: dict[int, int] = {}  # dataset image -> its place among the sources
        renumbered = []
        for recipe in recipes:
            layers = []
            for layer in recipe.layers:
                placed = [p._replace(image=where.setdefault(p.image, len(where))) for p in layer.placements]
                layers.append(layer._replace(placements=placed))
            renumbered.append(recipe._replace(layers=layers))
        images = list(where)
        sources = [image_source(self.dataset, i) for i in images]
        sizes = _tile_sizes(self.dataset, images)
        originals = [(int(self.dataset.shapes[i][1]), int(self.dataset.shapes[i][0])) for i in images]
        files = [self.dataset.im_files[i] for i in images]
        return pack_sources(renumbered, sources, sizes, originals, files), torch.cat(labels, 0), paths, shapes


def decode_on_host(source: bytes | np.ndarray, size: tuple[int, int], path: str) -> np.ndarray:
    """A source's tile decoded on the host, as the CPU path would (OpenCV's messages for a bad file).

    Args:
        source: JPEG bytes or the tile's pixels.
        size: the tile's (h, w).
        path: the image file.

    Returns:
        The tile, BGR uint8 [h, w, 3].
    """
    if isinstance(source, np.ndarray):
        return source
    return load_image(path, max(size), augment=True)[0]  # a tile's long side is imgsz


__all__ = [
    "Layer",
    "Placement",
    "Recipe",
    "RecipeBatch",
    "RecipeCollate",
    "decode_on_host",
    "image_source",
    "pack_sources",
    "plan_sample",
]
