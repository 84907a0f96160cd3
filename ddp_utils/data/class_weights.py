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


__all__ = ["class_frequency", "labels_to_class_weights", "labels_to_image_weights"]
