"""``--multi-scale``: each batch resized to a size drawn in [0.5, 1.5] x the image size, on the model's grid."""

from __future__ import annotations

import math
import random

import torch
from torch import nn


def multi_scale_resize(imgs: torch.Tensor, imgsz: int, grid: int) -> torch.Tensor:
    """Resize a batch to a random size in [0.5, 1.5] x ``imgsz``, on multiples of ``grid`` (``--multi-scale``).

    Draws from Python's ``random``, which the run seeds per rank.

    Examples:
        >>> multi_scale_resize(torch.zeros(1, 3, 64, 64), 64, 32).shape[-1] in (32, 64, 96)
        True
    """
    size = random.randrange(int(imgsz * 0.5), int(imgsz * 1.5) + grid) // grid * grid
    factor = size / max(imgs.shape[2:])
    if factor == 1:
        return imgs
    new_shape = [math.ceil(x * factor / grid) * grid for x in imgs.shape[2:]]
    return nn.functional.interpolate(imgs, size=new_shape, mode="bilinear")
