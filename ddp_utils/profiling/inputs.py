"""What a profiled model is fed and what it gives back: example inputs and shapes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn


def param_device_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    """Device and dtype of the model's first floating-point parameter (CPU, float32 without one)."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.device, p.dtype
    return torch.device("cpu"), torch.float32


def image_size(imgsz: int | Sequence[int]) -> tuple[int, int]:
    """``imgsz`` as (height, width); ValueError naming it unless it is a positive int or pair."""
    size = (imgsz, imgsz) if isinstance(imgsz, int) else tuple(imgsz)
    if len(size) != 2 or not all(isinstance(s, int) and s > 0 for s in size):
        raise ValueError(f"imgsz={imgsz!r}: give a positive int or (height, width)")
    return size  # type: ignore[return-value]


def example_input(model: nn.Module, imgsz: int | Sequence[int] = 640, batch: int = 1) -> torch.Tensor:
    """A random input for ``model`` on its device and dtype: images, or vectors for an MLP.

    The first layer decides: a Conv2d gives (batch, in_channels, h, w), a Linear gives
    (batch, in_features); anything else gets a 3-channel image.

    Examples:
        >>> example_input(nn.Conv2d(1, 4, 3), imgsz=(32, 48)).shape
        torch.Size([1, 1, 32, 48])
        >>> example_input(nn.Linear(16, 4), batch=2).shape
        torch.Size([2, 16])
    """
    if batch < 1:
        raise ValueError(f"batch={batch!r}: must be at least 1")
    device, dtype = param_device_dtype(model)
    h, w = image_size(imgsz)
    shape: tuple[int, ...] = (batch, 3, h, w)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            shape = (batch, module.in_features)
            break
        if isinstance(module, nn.modules.conv._ConvNd):
            shape = (batch, module.in_channels, h, w)[: 2 + module.weight.dim() - 2]
            break
    return torch.rand(shape, device=device, dtype=dtype)


def shape_of(obj: Any) -> Any:
    """Shapes of the tensors in a (nested) output, as tuples; other values by their type name."""
    if isinstance(obj, torch.Tensor):
        return tuple(obj.shape)
    if isinstance(obj, (list, tuple)):
        return [shape_of(o) for o in obj]
    if isinstance(obj, dict):
        return {k: shape_of(v) for k, v in obj.items()}
    return type(obj).__name__


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """Every tensor in a (nested) list, tuple or dict output."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in tensors_in(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in tensors_in(o)]
    return []


def as_args(inputs: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """One tensor or several positional inputs, as the tuple a forward call takes."""
    return (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
