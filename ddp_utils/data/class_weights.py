"""Class and image weights from the labels, under YOLOv5's names (its ``--image-weights``).

YOLOv5's train.py draws each epoch's images by these weights::

    cw = model.class_weights.cpu().numpy() * (1 - maps) ** 2 / nc
    iw = labels_to_image_weights(dataset.labels, nc=nc, class_weights=cw)
    dataset.indices = random.choices(range(dataset.n), weights=iw, k=dataset.n)

and the same works on :class:`~ddp_utils.data.dataset.YoloDataset` (or hand the weights to
``loader.set_image_weights``, which draws them reproducibly from the loader's seed).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def _class_counts(labels: np.ndarray, nc: int) -> np.ndarray:
    classes = np.asarray(labels, dtype=np.float64).reshape(-1, 5)[:, 0].astype(np.int64)
    return np.bincount(classes, minlength=nc)[:nc] if len(classes) else np.zeros(nc, np.int64)


def class_frequency(labels: Sequence[np.ndarray], nc: int) -> torch.Tensor:
    """Count the objects of each class in a dataset's labels (rows ``class x y w h``), as floats.

    What ``Model.initialize_biases`` starts the head's class biases from.

    Examples:
        >>> class_frequency([np.array([[0, .5, .5, .1, .1], [2, .5, .5, .1, .1]]), np.zeros((0, 5))], nc=3)
        tensor([1., 0., 1.])
    """
    rows = np.concatenate([lb for lb in labels if len(lb)] or [np.zeros((0, 5))])
    return torch.from_numpy(np.bincount(rows[:, 0].astype(int), minlength=nc)).float()


def labels_to_class_weights(labels: Sequence[np.ndarray] | None, nc: int = 80) -> torch.Tensor:
    """Inverse class frequencies over a dataset's labels, normalised to sum to 1.

    A class without any object counts as one (its weight is then the largest), as in YOLOv5.

    Args:
        labels: per image, [n, 5] (class, x, y, w, h) arrays (``dataset.labels``).
        nc: number of classes.

    Returns:
        float32 tensor [nc]; an empty tensor when there are no labels (YOLOv5's ``labels[0] is None``).

    Examples:
        >>> labels_to_class_weights([np.array([[0, .5, .5, .1, .1], [0, .5, .5, .1, .1], [1, .5, .5, .1, .1]])], 3)
        tensor([0.2000, 0.4000, 0.4000])
    """
    if labels is None or len(labels) == 0 or labels[0] is None:
        return torch.zeros(0)
    counts = sum((_class_counts(lb, nc) for lb in labels), np.zeros(nc, np.int64)).astype(np.float64)
    counts[counts == 0] = 1
    weights = 1 / counts
    return torch.from_numpy(weights / weights.sum()).float()


def labels_to_image_weights(
    labels: Sequence[np.ndarray], nc: int = 80, class_weights: np.ndarray | Sequence[float] | None = None
) -> np.ndarray:
    """Each image's weight: the sum over its objects of their class's weight.

    Args:
        labels: per image, [n, 5] (class, x, y, w, h) arrays (``dataset.labels``).
        nc: number of classes.
        class_weights: [nc] weight per class; default all ones (the weight is then the object count).

    Returns:
        float64 [len(labels)] weights; an image without objects weighs 0.

    Examples:
        >>> labels_to_image_weights([np.array([[1, .5, .5, .1, .1]]), np.zeros((0, 5))], 2, np.array([1., 3.]))
        array([3., 0.])
    """
    cw = np.ones(nc) if class_weights is None else np.asarray(class_weights, dtype=np.float64).reshape(nc)
    counts = np.stack([_class_counts(lb, nc) for lb in labels]) if len(labels) else np.zeros((0, nc))
    return (counts * cw[None]).sum(1)


def epoch_image_weights(labels: Sequence[np.ndarray], nc: int, maps: Sequence[float] | np.ndarray | None) -> np.ndarray:
    """The image weights ``--image-weights`` draws an epoch by, as YOLOv5's train.py computes them.

    Each class weighs its inverse frequency times ``(1 - mAP)**2`` (``maps``: its mAP@0.5:0.95 at
    the last validation; zeros before the first), so rare and badly detected classes are drawn
    more; an image weighs the sum over its objects.

    Examples:
        >>> labels = [np.array([[0, .5, .5, .1, .1]]), np.array([[1, .5, .5, .1, .1]] * 3)]
        >>> epoch_image_weights(labels, 2, None).round(3).tolist()
        [0.75, 0.75]
        >>> epoch_image_weights(labels, 2, [0.5, 0.0]).round(4).tolist()  # class 0 is learnt half-way
        [0.1875, 0.75]
    """
    class_weights = labels_to_class_weights(labels, nc).double().numpy()
    quality = np.zeros(nc) if maps is None else np.asarray(maps, dtype=np.float64).reshape(nc)
    return labels_to_image_weights(labels, nc, class_weights * (1 - quality) ** 2)


__all__ = ["class_frequency", "epoch_image_weights", "labels_to_class_weights", "labels_to_image_weights"]
