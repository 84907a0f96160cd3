"""Getting a model ready to train: pretrained tensors in, layers frozen, the image size on its stride.

What a training script does between building the model and building the optimizer. Each
function is small and works on the unwrapped model (wrappers are looked through by the caller).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from ..log import LOGGER


def transfer_weights(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> tuple[int, int]:
    """Load every tensor of ``state_dict`` whose name and shape match one of ``model``'s.

    The rest keeps its initial value, so a checkpoint trained for another number of classes
    still gives the backbone and neck (the head's class rows differ in shape and are skipped).

    Args:
        model: the model to fill (unwrapped).
        state_dict: the source tensors, e.g. a checkpoint's ``"model"``.

    Returns:
        ``(transferred, total)``: how many of the model's state entries were filled, and how many it has.

    Examples:
        >>> src, dst = nn.Linear(2, 3), nn.Linear(2, 4)
        >>> transfer_weights(dst, src.state_dict())  # both shapes differ: nothing matches
        (0, 2)
        >>> transfer_weights(nn.Linear(2, 3), src.state_dict())
        (2, 2)
    """
    own = model.state_dict()
    matched = {k: v for k, v in state_dict.items() if k in own and tuple(v.shape) == tuple(own[k].shape)}
    model.load_state_dict(matched, strict=False)
    return len(matched), len(own)


def freeze_layers(model: nn.Module, freeze: Iterable[int]) -> list[str]:
    """Stop the gradients of the listed top-level layers (``model.<i>.*``); all others train.

    YOLOv5's ``--freeze`` habit: one number N freezes the first N layers (``--freeze 10``:
    the backbone), several numbers freeze exactly those. Resolve that with
    :func:`freeze_indices` first.

    Args:
        model: a detection model whose layers are named ``model.0``, ``model.1``, ...
        freeze: the layer indices to freeze.

    Returns:
        The names of the frozen parameters.

    Raises:
        ValueError: an index that is not one of the model's layers, or every trainable layer frozen
            (nothing would learn); the message names the layers the model has.

    Examples:
        >>> net = nn.Module()
        >>> net.model = nn.Sequential(nn.Linear(1, 1), nn.Linear(1, 1))
        >>> freeze_layers(net, [0])
        ['model.0.weight', 'model.0.bias']
        >>> [p.requires_grad for p in net.parameters()]
        [False, False, True, True]
        >>> freeze_layers(net, [0, 1])
        Traceback (most recent call last):
        ValueError: --freeze: every layer with parameters (of 0-1) would be frozen, leaving nothing to train
    """
    freeze = sorted({int(i) for i in freeze})
    layers = len(model.model) if isinstance(getattr(model, "model", None), nn.Sequential) else None
    prefixes = tuple(f"model.{i}." for i in freeze)
    if prefixes and all(name.startswith(prefixes) for name, _ in model.named_parameters()):
        raise ValueError(
            f"--freeze: every layer with parameters (of 0-{layers - 1 if layers else '?'}) would be frozen, "
            "leaving nothing to train"
        )
    outside = [i for i in freeze if i < 0 or (layers is not None and i >= layers)]
    if outside:
        raise ValueError(f"--freeze: layer {outside[0]} is not in the model, whose layers are 0-{layers - 1}")
    frozen = []
    for name, param in model.named_parameters():
        param.requires_grad = not (prefixes and name.startswith(prefixes))
        if not param.requires_grad:
            frozen.append(name)
    return frozen


def freeze_indices(freeze: Iterable[int]) -> list[int]:
    """Read YOLOv5's ``--freeze`` list: ``[N]`` means layers 0..N-1, several numbers mean those layers.

    Examples:
        >>> freeze_indices([3]), freeze_indices([0]), freeze_indices([2, 5])
        ([0, 1, 2], [], [2, 5])
    """
    freeze = [int(i) for i in freeze]
    return list(range(freeze[0])) if len(freeze) == 1 else freeze


def grid_size(model: nn.Module, floor: int = 32) -> int:
    """The largest stride of a detection model, and at least ``floor`` (YOLOv5's ``gs``).

    Examples:
        >>> net = nn.Module(); net.stride = torch.tensor([8.0, 16.0, 64.0])
        >>> grid_size(net)
        64
    """
    return max(int(torch.as_tensor(model.stride).max()), floor)


def check_img_size(imgsz: int, stride: int = 32, floor: int = 0) -> int:
    """Round an image size up to a multiple of ``stride`` (at least ``floor``), warning when it changes.

    Args:
        imgsz: the requested size in pixels.
        stride: the model's largest stride (:func:`grid_size`).
        floor: the smallest size to return.

    Returns:
        The size to train and validate at.

    Examples:
        >>> check_img_size(640), check_img_size(100, 32), check_img_size(8, 32, floor=64)
        (640, 128, 64)
    """
    size = max(math.ceil(int(imgsz) / stride) * stride, floor)
    if size != imgsz:
        LOGGER.warning(f"--imgsz {imgsz} is not a multiple of the stride {stride}: using {size}")
    return size
