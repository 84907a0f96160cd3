"""How big a model is: YOLOv5's one-line summary (layers, parameters, gradients, GFLOPs) and the parameter table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ..distributed import de_parallel
from ..log import LOGGER
from .flop_counters import flops
from .inputs import image_size


def count_layers(model: nn.Module) -> int:
    """Layers as YOLOv5's summary counts them: every module object once, the model itself included.

    ``nn.Identity`` placeholders are left out: this is where a fused Conv's batch norm goes
    here, where YOLOv5 deletes the attribute, so the fused count drops by one per Conv as
    YOLOv5's does. A module object used in several places (YOLOv5 shares one activation
    across all its Convs) counts once, as ``model.modules()`` yields it once.

    Examples:
        >>> count_layers(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Identity()))
        3
    """
    return sum(1 for m in model.modules() if not isinstance(m, nn.Identity))


def summary_name(model: nn.Module) -> str:
    """The summary's name: the stem of the model's yaml file ("yolov5s" as "YOLOv5s"), else its class name."""
    yaml_file = getattr(model, "yaml_file", None)
    if isinstance(yaml_file, (str, Path)) and not str(yaml_file).startswith("<"):  # "<dict>": built from a dict
        return Path(yaml_file).stem.replace("yolov5", "YOLOv5")
    return type(model).__name__


def _max_stride(model: nn.Module) -> int | None:
    """YOLOv5's counting size for a detector: its largest stride, at least 32; None for other models.

    A detector's ``stride`` is a tensor of its output levels' strides; a layer's ``stride``
    (nn.Conv2d's tuple) is not one.
    """
    stride = getattr(model, "stride", None)
    if not isinstance(stride, torch.Tensor) or stride.numel() == 0:
        return None
    return max(int(stride.max()), 32)


def model_gflops(model: nn.Module, imgsz: int | Sequence[int] = 640) -> tuple[float, str]:
    """GFLOPs of one batch-1 forward pass at ``imgsz`` and the counter that gave them.

    A detector (a model with a ``stride``) is counted as YOLOv5 counts it: on one image the
    size of its largest stride (at least 32), scaled by area to ``imgsz``, which is exact for
    a fully convolutional model and costs 1/400 of a count at 640. Any other model is
    counted at ``imgsz`` itself.

    Raises:
        RuntimeError: neither counter could count (see :func:`ddp_utils.profiling.flops`).
    """
    h, w = image_size(imgsz)
    stride = _max_stride(model)
    if stride is None:
        report = flops(model, (h, w))
        return report.gflops, report.counter
    report = flops(model, stride)
    return report.gflops * (h / stride) * (w / stride), report.counter


def model_info(model: nn.Module, verbose: bool = False, imgsz: int | Sequence[int] = 640) -> dict[str, Any]:
    """Count layers, parameters, gradients and GFLOPs, and log YOLOv5's one-line summary.

    The line reads as YOLOv5's, e.g. ``YOLOv5s summary: 214 layers, 7235389 parameters,
    7235389 gradients, 16.6 GFLOPs``: layers as :func:`count_layers` counts them, gradients
    the parameters that require grad, GFLOPs thop's 2 x MACs (see :func:`model_gflops`).
    Where the line is not YOLOv5's own, it says so: " at HxW" for a size other than 640
    and " (FlopCounterMode)" when thop could not count.

    Args:
        model: the model (a DDP or DataParallel wrapper is looked through).
        verbose: also log one line per parameter tensor (see :func:`parameter_table`). Second, as in
            YOLOv5's ``model_info(model, verbose=False, imgsz=640)``.
        imgsz: input size the GFLOPs are given for (batch 1), an int or (height, width).

    Returns:
        A dict with "name", "layers", "parameters", "gradients", "gflops" (None when they
        could not be counted: a warning says why and the line leaves them out), "counter"
        (which counter) and "summary" (the logged line).

    Examples:
        >>> info = model_info(nn.Sequential(nn.Linear(4, 3), nn.ReLU()))
        >>> info["layers"], info["parameters"], info["gradients"]
        (3, 15, 15)
    """
    model = de_parallel(model)
    parameters = sum(p.numel() for p in model.parameters())
    gradients = sum(p.numel() for p in model.parameters() if p.requires_grad)
    layers = count_layers(model)
    if verbose:
        LOGGER.info(parameter_table(model))
    try:
        gflops, counter = model_gflops(model, imgsz)
    except Exception as e:  # the counts are still worth having
        LOGGER.warning(f"model_info: GFLOPs not counted: {type(e).__name__}: {e}")
        gflops, counter = None, None
    name = summary_name(model)
    summary = f"{name} summary: {layers} layers, {parameters} parameters, {gradients} gradients"
    if gflops is not None:
        h, w = image_size(imgsz)
        number = f"{gflops:.1f}" if gflops >= 0.1 else f"{gflops:.2g}"  # a small model at a small size is not 0.0
        summary += f", {number} GFLOPs" + ("" if (h, w) == (640, 640) else f" at {h}x{w}")
        summary += "" if counter == "thop" else f" ({counter})"
    LOGGER.info(summary)
    return {
        "name": name,
        "layers": layers,
        "parameters": parameters,
        "gradients": gradients,
        "gflops": gflops,
        "counter": counter,
        "summary": summary,
    }


def parameter_table(model: nn.Module) -> str:
    """One line per parameter tensor: index, name, trained, size, shape, mean, standard deviation.

    Examples:
        >>> print(parameter_table(nn.Linear(2, 1)).splitlines()[0].split())
        ['layer', 'name', 'gradient', 'parameters', 'shape', 'mu', 'sigma']
    """
    lines = [f"{'layer':>5} {'name':>40} {'gradient':>9} {'parameters':>12} {'shape':>20} {'mu':>10} {'sigma':>10}"]
    for i, (name, p) in enumerate(de_parallel(model).named_parameters()):
        values = p.detach().float()
        sigma = values.std().item() if values.numel() > 1 else 0.0
        lines.append(
            f"{i:>5} {name:>40} {p.requires_grad!s:>9} {p.numel():>12} {str(list(p.shape)):>20} "
            f"{values.mean().item():>10.3g} {sigma:>10.3g}"
        )
    return "\n".join(lines)
