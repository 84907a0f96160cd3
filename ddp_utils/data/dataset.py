"""The YOLO-format detection dataset, its rectangular batch shapes and its collate functions.

A sample's augmentation depends only on (seed, epoch, slot, index): the samplers in
``loader.py`` hand the dataset :class:`SampleKey` tuples, and the dataset seeds a fresh
``np.random.Generator`` from them, so the same epoch gives the same images whatever the
number of workers, the rank that draws it, or how often the workers were restarted.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Union

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset

from ..boxes import xywhn2xyxy, xyxy2xywhn
from ..hyp import hyp_value
from ..seed import derive_seed
from ..yamls import DataConfigError
from .augment import augment_hsv, flip_lr, flip_ud, letterbox, mixup
from .device.recipes import plan_sample
from .image_cache import DiskImageCache, SharedImageCache, normalize_cache
from .images import load_image, resized_shape
from .mosaic_batch import mosaic_batch
from .warp import mosaic4, random_perspective

if TYPE_CHECKING:
    from .labels import LabelSet

Shapes = Union[tuple[tuple[int, int], tuple[tuple[float, float], tuple[float, float]]], None]


def rect_batch_shapes(aspect_hw: np.ndarray, batches: Sequence[Sequence[int]], imgsz: int, stride: int, pad: float):
    """The letterbox shape (h, w) of each batch for rectangular training/eval.

    Each batch gets the smallest stride-multiple shape holding its images at long side
    ``imgsz`` (plus ``pad`` strides), as YOLOv5 does with aspect-sorted images.

    Args:
        aspect_hw: [N] h / w of every image.
        batches: index lists, one per batch.
        imgsz: long side.
        stride: the model's largest stride.
        pad: extra padding in strides.

    Returns:
        [len(batches), 2] int array of (h, w).

    Examples:
        >>> rect_batch_shapes(np.array([0.5, 0.75]), [[0, 1]], 640, 32, 0.0).tolist()
        [[480, 640]]
    """
    shapes = np.ones((len(batches), 2))
    for b, idx in enumerate(batches):
        ar = aspect_hw[list(idx)]
        lo, hi = ar.min(), ar.max()
        if hi < 1:
            shapes[b] = [hi, 1]
        elif lo > 1:
            shapes[b] = [1, 1 / lo]
    return (np.ceil(shapes * imgsz / stride + pad) * stride).astype(int)


def stack_images(images: Sequence[torch.Tensor], out: np.ndarray | None = None) -> torch.Tensor:
    """``torch.stack(images)`` of CPU tensors, done by NumPy.

    A batch is tens of MB. torch's CPU allocator hands back fresh pages for each one (a
    page fault per 4 KiB, ~1 ms per batch image in a VM), where glibc reuses the block
    NumPy freed with the previous batch; and torch's copy wakes its intra-op threads,
    whose spinning afterwards costs more CPU than the copy.

    Args:
        images: same-shape tensors.
        out: a flat buffer of the images' dtype to stack into, when it is large enough
            (a loader worker's shared-memory slot); else new memory.

    Examples:
        >>> stack_images([torch.zeros(3, 2, 2, dtype=torch.uint8)] * 4).shape
        torch.Size([4, 3, 2, 2])
    """
    arrays = [image.numpy() for image in images]
    shape = (len(arrays), *arrays[0].shape)
    size = math.prod(shape)
    if out is not None and out.dtype == arrays[0].dtype and out.size >= size:
        return torch.from_numpy(np.stack(arrays, out=out[:size].reshape(shape)))
    return torch.from_numpy(np.stack(arrays))


class SampleKey(NamedTuple):
    """What a sampler asks the dataset for: one image, in one place of one epoch.

    Attributes:
        epoch: the epoch, part of the augmentation seed.
        slot: position in the epoch's global order (all ranks), part of the seed, so an
            image drawn twice in one epoch is augmented twice differently.
        index: the image.
        batch: the rectangular batch (index into ``dataset.batch_shapes``), -1 for the image's default.
    """

    epoch: int
    slot: int
    index: int
    batch: int = -1


class YoloDataset(Dataset):
    """Images and labels of a :class:`~ddp_utils.data.labels.LabelSet`, resized, augmented, letterboxed.

    ``dataset[i]`` (or ``dataset[SampleKey(...)]``) returns ``(img, labels, path, shapes)``:
    a contiguous RGB ``uint8`` tensor [3, H, W]; float32 labels [n, 6] of (0, class, xc, yc,
    w, h) normalised to H, W (column 0 is filled with the batch index by :func:`collate_fn`);
    the image path; and ``shapes``, None for a mosaic, else ``((h0, w0), ((h / h0, w / w0),
    (pad_w, pad_h)))`` to map boxes back to the original image.

    YOLOv5's train.py finds its attributes under its names: ``n``, ``indices`` (assignable,
    see :attr:`indices`), ``labels``, ``segments``, ``shapes`` ((w, h) per image),
    ``im_files``, ``label_files``, ``batch``, ``mosaic_border``, ``img_size``, ``augment``,
    ``rect``, ``stride`` and ``hyp``.

    Args:
        label_set: verified images and labels (``load_labels``).
        imgsz: long side of the images fed to the model.
        batch_size: per-process batch size, for the default rectangular batches.
        augment: random perspective, HSV, flips, and mosaic/mixup (unless ``rect``).
        hyp: augmentation hyperparameters with YOLOv5's names.
        rect: letterbox each batch to its own stride-multiple shape; images sorted by aspect.
        image_weights: the sampler draws images by weight (single process).
        cache: "ram" (or True): one shared copy per node; "disk": .npy files; False: none.
        single_cls: every class becomes 0.
        stride: the model's largest stride.
        pad: extra rectangular padding, in strides.
        prefix: log prefix.
        seed: base of every sample's augmentation seed.
        local_rank: this process's rank on its node (-1 single); the node's first builds the RAM cache.
    """

    def __init__(
        self,
        label_set: LabelSet,
        imgsz: int = 640,
        batch_size: int = 16,
        augment: bool = False,
        hyp: dict | None = None,
        rect: bool = False,
        image_weights: bool = False,
        cache: bool | str | None = False,
        single_cls: bool = False,
        stride: int = 32,
        pad: float = 0.0,
        prefix: str = "",
        seed: int = 0,
        local_rank: int = -1,
    ) -> None:
        if len(label_set.im_files) == 0:
            raise ValueError(f"{prefix}no usable images: {label_set.messages[:3]}")
        self.imgsz, self.stride, self.pad = int(imgsz), int(stride), float(pad)
        self.augment, self.rect, self.image_weights = augment, rect, image_weights
        self.hyp = dict(hyp or {})
        self.mosaic = augment and not rect  # a mosaic has no aspect ratio to keep
        self.seed, self.epoch, self.prefix = int(seed), 0, prefix
        self.im_files = list(label_set.im_files)
        self.label_files = list(label_set.label_files)
        self.labels = [np.asarray(lb, dtype=np.float32).reshape(-1, 5).copy() for lb in label_set.labels]
        self.segments = list(label_set.segments) if label_set.segments else [[] for _ in self.im_files]
        if single_cls:
            for lb in self.labels:
                lb[:, 0] = 0
        self.shapes = np.asarray(label_set.shapes, dtype=np.int64).reshape(-1, 2)  # (w, h) as decoded
        if rect:
            order = np.argsort(self.shapes[:, 1] / self.shapes[:, 0], kind="stable")
            self.im_files = [self.im_files[i] for i in order]
            self.label_files = [self.label_files[i] for i in order]
            self.labels = [self.labels[i] for i in order]
            self.segments = [self.segments[i] for i in order]
            self.shapes = self.shapes[order]
        n = len(self.im_files)
        self.mosaic_border = [-self.imgsz // 2, -self.imgsz // 2]  # YOLOv5's (y, x): the mosaic's centre range
        self.indices_version = 0  # bumped by every assignment to ``indices``: the loader restarts its workers
        self.indices = np.arange(n)
        self.set_batches([range(i, min(i + batch_size, n)) for i in range(0, n, batch_size)])
        self.cache = self._build_cache(normalize_cache(cache), local_rank)
        self.recipes = False  # create_dataloader(augment_on="device"): __getitems__ plans, the device renders

    @property
    def n(self) -> int:
        """Number of images (YOLOv5's ``dataset.n``)."""
        return len(self.im_files)

    @property
    def img_size(self) -> int:
        """YOLOv5's name for :attr:`imgsz`."""
        return self.imgsz

    @property
    def batch(self) -> np.ndarray:
        """The rectangular batch of each image (YOLOv5's ``dataset.batch``); see :meth:`set_batches`."""
        return self.batch_index

    @property
    def indices(self) -> np.ndarray:
        """Which image each position stands for: ``dataset[i]`` is image ``indices[i]`` (YOLOv5's habit).

        ``np.arange(n)`` until assigned. YOLOv5's ``--image-weights`` assigns a weighted draw
        each epoch, ``dataset.indices = random.choices(range(dataset.n), weights=iw, k=dataset.n)``,
        and the mosaic's three other tiles are drawn from it too. Assign a new sequence (the
        array is read-only): the loader sees the assignment at its next epoch and restarts its
        workers, so the epoch draws from the new indices.
        """
        return self._indices

    @indices.setter
    def indices(self, value: Sequence[int] | np.ndarray) -> None:
        indices = np.array(value, dtype=np.int64).reshape(-1)
        n = len(self.im_files)
        if len(indices) != n or (n and (indices.min() < 0 or indices.max() >= n)):
            raise ValueError(f"{self.prefix}dataset.indices: need {n} image indices in [0, {n}), got {len(indices)}")
        indices.flags.writeable = False
        self._indices = indices
        self.indices_version += 1

    def check_classes(self, nc: int, data_name: str | Path = "the data yaml") -> None:
        """Raise :class:`DataConfigError` naming the first label file with a class outside ``[0, nc)``.

        Args:
            nc: the number of classes the data yaml declares.
            data_name: the data yaml (its path), named in the message.

        Examples:
            >>> ds = YoloDataset.__new__(YoloDataset)
            >>> ds.labels, ds.label_files = [np.array([[3, .5, .5, .1, .1]], np.float32)], ["a.txt"]
            >>> ds.check_classes(2, "data.yaml")
            Traceback (most recent call last):
            ...
            ddp_utils.yamls.DataConfigError: a.txt: class 3 is not below nc=2 of data.yaml; ...
        """
        for labels, label_file in zip(self.labels, self.label_files):
            classes = labels[:, 0]
            if len(classes) and (classes.max() >= nc or classes.min() < 0):
                bad = int(classes.max() if classes.max() >= nc else classes.min())
                raise DataConfigError(
                    f"{label_file}: class {bad} is not below nc={nc} of {data_name}; "
                    f"classes run 0..{nc - 1}: fix the label or the yaml's names"
                )

    def __len__(self) -> int:
        return len(self.im_files)

    def resized_shapes(self) -> np.ndarray:
        """[N, 2] (h, w) of every image once its long side is ``imgsz``."""
        return np.array([resized_shape(int(h), int(w), self.imgsz) for w, h in self.shapes], dtype=np.int64)

    def _build_cache(self, mode: str | None, local_rank: int) -> SharedImageCache | DiskImageCache | None:
        if mode == "ram":
            return SharedImageCache.build(
                self.im_files, self.resized_shapes(), self.imgsz, self.augment, local_rank in (-1, 0), self.prefix
            )
        if mode == "disk":
            cache = DiskImageCache(self.im_files, self.resized_shapes(), self.imgsz, self.augment)
            if local_rank in (-1, 0):  # the others run after it (zero_first) and find every file fresh
                cache.build(self.prefix)
            return cache
        return None

    def set_batches(self, batches: Sequence[Sequence[int]]) -> None:
        """Set the rectangular batches (index lists); batch ``b`` is letterboxed to ``batch_shapes[b]``.

        The loader calls this with the batches every rank will form, so that the images
        of one batch share a shape even when the sampler pads a shard with repeats.
        """
        self.batch_index = np.zeros(len(self), dtype=np.int64)
        for b, idx in enumerate(batches):
            self.batch_index[list(idx)] = b
        aspect = self.shapes[:, 1] / self.shapes[:, 0]
        self.batch_shapes = rect_batch_shapes(aspect, batches, self.imgsz, self.stride, self.pad)

    def load_image(self, i: int) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
        """Image ``i`` resized (long side ``imgsz``), from the cache when there is one.

        Returns:
            (img BGR, possibly a read-only view; (h0, w0); (h, w)).
        """
        if self.cache is None:
            return load_image(self.im_files[i], self.imgsz, self.augment)
        img = self.cache[i]
        w0, h0 = self.shapes[i]
        return img, (int(h0), int(w0)), img.shape[:2]

    def _tile_image(self, i: int) -> np.ndarray:
        # resized first, as the caches have it (and YOLOv5): the same samples with and without a cache, and
        # no aliasing: a tile warped straight from the decoded image and shrunk by half or more showed its
        # fine texture as grain the val images (resized with INTER_AREA) do not have
        return self.load_image(i)[0]

    def _pixel_labels(self, i: int, w: float, h: float, padw: float = 0.0, padh: float = 0.0) -> np.ndarray:
        labels = self.labels[i].copy()
        if len(labels):
            labels[:, 1:] = xywhn2xyxy(labels[:, 1:], w, h, padw, padh)
        return labels

    def load_mosaic(self, index: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """A 4-image mosaic around ``index`` with three random others, labels in pixel xyxy."""
        others = self._indices[rng.integers(0, len(self), 3)]  # YOLOv5 draws them from ``indices`` too
        indices = rng.permutation([index, *others])
        images, sizes = [], []
        for i in map(int, indices):
            if self.cache is None:  # decoded only if its tile shows
                img = partial(self._tile_image, i)
                w0, h0 = self.shapes[i]
                h, w = resized_shape(int(h0), int(w0), self.imgsz)
            else:
                img, _, (h, w) = self.load_image(i)
            images.append(img)
            sizes.append((h, w))
        labels = self._tile_labels(indices, sizes)
        default = self.mosaic_border == [-self.imgsz // 2, -self.imgsz // 2] and self.imgsz % 2 == 0
        return mosaic4(images, labels, self.imgsz, rng, self.hyp, sizes, None if default else self.mosaic_border)

    def _tile_labels(self, indices: np.ndarray, sizes: list[tuple[int, int]]) -> list[np.ndarray]:
        # _pixel_labels of each tile, the four converted together: the same float32 values (each row scaled
        # by its own image's w and h), one conversion instead of four (per-sample overhead at small sizes)
        parts = [self.labels[i] for i in indices]
        counts = [len(part) for part in parts]
        rows = np.concatenate(parts, 0)
        if len(rows):
            scale = np.repeat(np.array(sizes, np.float32)[:, ::-1], counts, axis=0)  # each row's (w, h)
            centre, half = rows[:, 1:3] * scale, rows[:, 3:5] * (scale / 2)
            rows = np.concatenate((rows[:, :1], centre - half, centre + half), 1)
        bounds = [0, *itertools.accumulate(counts)]
        return [rows[a:b] for a, b in zip(bounds, bounds[1:])]  # np.split's views, without its overhead

    def _letterboxed(self, index: int, batch: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, Shapes]:
        img, (h0, w0), (h, w) = self.load_image(index)
        if self.rect:
            shape = tuple(int(v) for v in self.batch_shapes[batch if batch >= 0 else self.batch_index[index]])
        else:
            shape = self.imgsz
        img, ratio, pad = letterbox(img, shape, auto=False, scaleup=self.augment)
        shapes = ((h0, w0), ((h / h0 * ratio[1], w / w0 * ratio[0]), pad))
        labels = self._pixel_labels(index, ratio[0] * w, ratio[1] * h, pad[0], pad[1])
        if self.augment:
            hyp = self.hyp
            img, labels = random_perspective(
                img,
                labels,
                rng,
                degrees=hyp_value(hyp, "degrees"),
                translate=hyp_value(hyp, "translate"),
                scale=hyp_value(hyp, "scale"),
                shear=hyp_value(hyp, "shear"),
                perspective=hyp_value(hyp, "perspective"),
            )
        return img, labels, shapes

    def _key(self, item: int | SampleKey | tuple) -> SampleKey:
        return SampleKey(*item) if isinstance(item, tuple) else SampleKey(self.epoch, int(item), int(item))

    def __getitems__(self, items: Sequence[int | SampleKey | tuple]) -> list[tuple]:
        """``[self[item] for item in items]``, the DataLoader's fetch of a batch: its mosaics made together; with
        ``recipes`` set, each a :class:`~ddp_utils.data.device.recipes.Recipe` (its draws and labels, no pixels)."""
        keys = [self._key(item) for item in items]
        return [plan_sample(self, key) for key in keys] if self.recipes else mosaic_batch(self, keys)

    def __getitem__(self, item: int | SampleKey | tuple) -> tuple[torch.Tensor, torch.Tensor, str, Shapes]:
        key = self._key(item)
        index = int(self._indices[key.index])  # the position's image (YOLOv5's ``indices``)
        rng = np.random.default_rng(derive_seed(self.seed, key.epoch, key.slot, index))
        hyp = self.hyp
        if self.mosaic and rng.random() < hyp_value(hyp, "mosaic"):
            img, labels = self.load_mosaic(index, rng)
            shapes = None
            if rng.random() < hyp_value(hyp, "mixup"):
                img2, labels2 = self.load_mosaic(int(rng.integers(0, len(self))), rng)
                img, labels = mixup(img, labels, img2, labels2, rng)
        else:
            img, labels, shapes = self._letterboxed(index, key.batch, rng)
        boxes = (
            xyxy2xywhn(np.asarray(labels[:, 1:5], np.float32), img.shape[1], img.shape[0], clip=True, eps=1e-3)
            if len(labels)
            else np.zeros((0, 4))
        )
        if self.augment:
            if not img.flags.writeable:
                img = img.copy()
            augment_hsv(img, hyp_value(hyp, "hsv_h"), hyp_value(hyp, "hsv_s"), hyp_value(hyp, "hsv_v"), rng)
            if rng.random() < hyp_value(hyp, "flipud"):
                img, boxes = flip_ud(img, boxes)
            if rng.random() < hyp_value(hyp, "fliplr"):
                img, boxes = flip_lr(img, boxes)
        out = np.zeros((len(labels), 6), dtype=np.float32)
        if len(labels):
            out[:, 1] = labels[:, 0]
            out[:, 2:] = boxes
        chw = np.empty((3, *img.shape[:2]), np.uint8)
        cv2.split(img, [chw[2], chw[1], chw[0]])  # HWC BGR -> CHW RGB in one pass, no strided numpy copy
        return torch.from_numpy(chw), torch.from_numpy(out), self.im_files[index], shapes

    @staticmethod
    def collate_fn(
        batch: Sequence[tuple], out: np.ndarray | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...], tuple[Shapes, ...]]:
        """Stack images (into ``out`` when it has room); concatenate labels with column 0 set to the
        image's index in the batch."""
        imgs, labels, paths, shapes = zip(*batch)
        for i, lb in enumerate(labels):
            lb[:, 0] = i
        return stack_images(imgs, out), torch.cat(labels, 0), paths, shapes

    @staticmethod
    def collate_fn4(
        batch: Sequence[tuple], out: np.ndarray | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[str, ...], tuple[Shapes, ...]]:
        """Quad collate: every 4 images become one of twice the size (a 2x2 grid, or one upsampled).

        The choice between grid and upsampling is drawn from torch's generator, which
        ``seed_worker`` seeds per worker.
        """
        imgs, labels, paths, shapes = zip(*batch)
        n = len(batch) // 4
        if n == 0:
            raise ValueError(f"quad collate needs batches of at least 4 images, got {len(batch)}")
        out_imgs, out_labels = [], []
        y_off = torch.tensor([[0.0, 0, 0, 1, 0, 0]])
        x_off = torch.tensor([[0.0, 0, 1, 0, 0, 0]])
        half = torch.tensor([[1.0, 1, 0.5, 0.5, 0.5, 0.5]])
        for q in range(n):
            i = 4 * q
            if torch.rand(1).item() < 0.5:
                up = torch.nn.functional.interpolate(
                    imgs[i][None].float(), scale_factor=2.0, mode="bilinear", align_corners=False
                )
                im = up[0].round().clamp(0, 255).to(imgs[i].dtype)
                lb = labels[i]
            else:
                top = torch.cat((imgs[i], imgs[i + 1]), 2)
                bottom = torch.cat((imgs[i + 2], imgs[i + 3]), 2)
                im = torch.cat((top, bottom), 1)
                lb = torch.cat((labels[i], labels[i + 1] + x_off, labels[i + 2] + y_off, labels[i + 3] + x_off + y_off))
                lb = lb * half
            out_imgs.append(im)
            out_labels.append(lb.clone())
        for q, lb in enumerate(out_labels):
            lb[:, 0] = q
        return stack_images(out_imgs, out), torch.cat(out_labels, 0), paths[::4], shapes[::4]
