"""AutoBatch: the largest training batch that fits a share of the GPU's memory (``--batch-size -1``).

The names and behaviour are YOLOv5's and Ultralytics': measure the memory that a training
forward + backward pass needs at a few batch sizes, fit a straight line through the
points, and take the largest batch whose predicted memory stays within ``fraction`` of
the card. Without CUDA there is nothing to measure: a log line says so and the default
batch size comes back. Under DDP run it on rank 0 and broadcast the answer, so that every
rank trains with the same batch.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from ..log import LOGGER

PROBE_BATCH_SIZES = (1, 2, 4, 8, 16)
MAX_BATCH_SIZE = 1024
_GIB = 2**30


def fit_batch_size(
    batch_sizes: Sequence[int], memory_gib: Sequence[float | None], budget_gib: float, default: int
) -> int:
    """The largest batch whose memory, on the line fitted through the measurements, is within ``budget_gib``.

    Args:
        batch_sizes: the probed batch sizes, increasing.
        memory_gib: the peak memory measured at each (None from the first that ran out of memory).
        budget_gib: the memory the batch may use.
        default: returned when the measurements give no sensible answer (fewer than two
            points, memory not growing with the batch, or an answer outside 1..1024).

    Examples:
        >>> fit_batch_size([1, 2, 4, 8], [1.5, 2.0, 3.0, 5.0], budget_gib=10.0, default=16)
        18
        >>> fit_batch_size([1, 2, 4, 8], [1.5, 2.0, 3.0, None], budget_gib=10.0, default=16)
        4
    """
    points = [(b, m) for b, m in zip(batch_sizes, memory_gib) if m is not None]
    if len(points) < 2:
        return default
    slope, intercept = np.polyfit([b for b, _ in points], [m for _, m in points], deg=1)
    if slope <= 0:
        return default
    batch = math.floor((budget_gib - intercept) / slope + 1e-6)  # the fit's rounding must not cost an image
    if None in memory_gib:  # the line may be optimistic: never reach a size that ran out of memory
        failed = batch_sizes[list(memory_gib).index(None)]
        if batch >= failed:
            batch = points[-1][0]
    return batch if 1 <= batch <= MAX_BATCH_SIZE else default


def _peak_memory_gib(model: nn.Module, imgsz: int, batch: int, device: torch.device, amp: bool) -> float | None:
    """Peak memory reserved by one training forward + backward pass at ``batch``, or None if out of memory."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    try:
        images = torch.rand(batch, 3, imgsz, imgsz, device=device)
        with torch.autocast("cuda", enabled=amp):
            outputs = model(images)
            loss = sum(o.float().mean() for o in (outputs if isinstance(outputs, (list, tuple)) else [outputs]))
        loss.backward()
        torch.cuda.synchronize(device)  # measuring: the pass must have finished
        return torch.cuda.max_memory_reserved(device) / _GIB
    except torch.cuda.OutOfMemoryError:
        return None
    finally:
        model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()


def autobatch(model: nn.Module, imgsz: int = 640, fraction: float = 0.6, batch_size: int = 16, amp: bool = True) -> int:
    """The training batch size that uses about ``fraction`` of the GPU's memory for ``model``.

    Args:
        model: the model, on the device to measure (a copy is measured; the model is untouched).
        imgsz: the square training image size.
        fraction: the share of the card's total memory the training may use.
        batch_size: the answer when nothing can be measured (no CUDA) or the fit fails.
        amp: measure under autocast, as training with AMP runs.

    Returns:
        The batch size.

    Examples:
        >>> autobatch(torch.nn.Conv2d(3, 8, 3), imgsz=32, batch_size=8)  # on CPU: the default
        8
    """
    device = next(model.parameters()).device
    prefix = "AutoBatch:"
    if device.type != "cuda":
        LOGGER.info(f"{prefix} no CUDA device to measure on ({device}); using the default batch size {batch_size}")
        return batch_size
    if torch.backends.cudnn.benchmark:
        LOGGER.warning(f"{prefix} needs torch.backends.cudnn.benchmark=False; using batch size {batch_size}")
        return batch_size
    free, total = torch.cuda.mem_get_info(device)
    budget = min(fraction * total, free + torch.cuda.memory_reserved(device)) / _GIB
    probe = copy.deepcopy(model).train()
    memory: list[float | None] = []
    for size in PROBE_BATCH_SIZES:
        memory.append(_peak_memory_gib(probe, imgsz, size, device, amp))
        if memory[-1] is None:
            break
    del probe
    torch.cuda.empty_cache()
    sizes = PROBE_BATCH_SIZES[: len(memory)]
    chosen = fit_batch_size(sizes, memory, budget, batch_size)
    measured = ", ".join(f"{b}: {'OOM' if m is None else f'{m:.2f}G'}" for b, m in zip(sizes, memory))
    LOGGER.info(
        f"{prefix} {torch.cuda.get_device_name(device)} {total / _GIB:.1f}G total, target {fraction:.0%} "
        f"({budget:.1f}G); measured {measured}; batch size {chosen}"
    )
    return chosen


def check_train_batch_size(
    model: nn.Module, imgsz: int = 640, amp: bool = True, fraction: float = 0.6, batch_size: int = 16
) -> int:
    """YOLOv5's name for :func:`autobatch` on a training-mode model (``train.py --batch-size -1``).

    :func:`autobatch` needs ``cudnn.benchmark`` off (autotuning would measure the tuner's
    workspaces); this turns it off for the measurement and puts it back, so a run that trains
    with benchmark on still gets its batch size measured.

    Examples:
        >>> check_train_batch_size(torch.nn.Conv2d(3, 8, 3), imgsz=32)  # on CPU: the default
        16
    """
    benchmark = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        return autobatch(model, imgsz, fraction=fraction, batch_size=batch_size, amp=amp)
    finally:
        torch.backends.cudnn.benchmark = benchmark
