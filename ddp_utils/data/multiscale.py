"""``--multi-scale``: each batch resized to a size drawn in [0.5, 1.5] x the image size, on the model's grid.

The size of a step is a function of (seed, epoch, step) alone, not of a random state that
each rank seeds for itself: every rank of a DDP job resizes its share of global step ``k`` to
the same size, the one a single process with the whole global batch would use.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from ..seed import derive_seed

_MULTI_SCALE_STREAM = 2  # keeps these draws apart from the samplers' (seed, epoch) and (seed, epoch, 1)


def multi_scale_size(imgsz: int, grid: int, seed: int = 0, epoch: int = 0, step: int = 0) -> int:
    """The side of step ``step`` of epoch ``epoch``: a multiple of ``grid`` in [0.5, 1.5] x ``imgsz``.

    Examples:
        >>> multi_scale_size(640, 32, seed=0, epoch=1, step=5) == multi_scale_size(640, 32, 0, 1, 5)
        True
        >>> len({multi_scale_size(64, 32, 0, 0, k) for k in range(50)})  # 32, 64 and 96
        3
    """
    rng = np.random.default_rng(derive_seed(seed, epoch, step, _MULTI_SCALE_STREAM))
    return int(rng.integers(int(imgsz * 0.5), int(imgsz * 1.5) + grid)) // grid * grid


def multi_scale_resize(
    imgs: torch.Tensor, imgsz: int, grid: int, seed: int = 0, epoch: int = 0, step: int = 0
) -> torch.Tensor:
    """Resize a batch to :func:`multi_scale_size`'s size for this step, on multiples of ``grid`` (``--multi-scale``).

    The longer side becomes the drawn size; the other keeps the aspect, rounded up to ``grid``.

    Args:
        imgs: [N, C, H, W] float batch.
        imgsz: the training image size.
        grid: the model's largest stride.
        seed: the run's seed (``--seed``): the same on every rank.
        epoch: the epoch.
        step: the step (any numbering that is the same on every rank, e.g. the global iteration).

    Examples:
        >>> multi_scale_resize(torch.zeros(1, 3, 64, 64), 64, 32, seed=0, epoch=0, step=3).shape[-1] in (32, 64, 96)
        True
    """
    size = multi_scale_size(imgsz, grid, seed, epoch, step)
    factor = size / max(imgs.shape[2:])
    if factor == 1:
        return imgs
    new_shape = [math.ceil(x * factor / grid) * grid for x in imgs.shape[2:]]
    return nn.functional.interpolate(imgs, size=new_shape, mode="bilinear")
