"""The ``channels_last`` (NHWC) memory format for conv models: on CUDA, and on CPUs where oneDNN runs the convolutions.

cuDNN's tensor-core convolutions work in NHWC; given NCHW tensors they transpose around
every convolution. Measured on an H100 (yolov5s, AMP, batch 64, forward + backward):
689 img/s in NCHW, 1,526 in channels_last. On x86 CPUs oneDNN's convolutions are NHWC-native
too: a yolov5n training step ran 1.2-1.3x as fast in channels_last, in fp32 (AVX2 and AVX-512
hosts) and more with bf16 (see :func:`use_channels_last` and docs/cpu.md).
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import nn

from ..host import cpu_flags


def use_channels_last(device: torch.device | str, flags: Collection[str] | None = None) -> bool:
    """Whether a conv model and its input should be ``channels_last`` on ``device``.

    True on CUDA. On the CPU, True where oneDNN runs the convolutions on AVX2 or more (x86): a
    yolov5n step (forward, backward, SGD; batch 16, 1 thread) took 1.3x less time in channels_last
    on an AVX-512 host at 320 px; train.py's epochs took 1.33x (yolov5n) and 1.13x (yolov5s) less on a
    shared 2-core AVX2 host at 160 px (``python benchmarks/speed/cpu_train_speed.py``, docs/cpu.md). Elsewhere
    (Arm, older x86) unmeasured: NCHW, as before.

    Args:
        device: the training device.
        flags: the CPU's feature flags (default: :func:`ddp_utils.host.cpu_flags`).

    Examples:
        >>> use_channels_last("cpu", flags={"avx2"}), use_channels_last("cpu", flags={"neon"})
        (True, False)
        >>> use_channels_last(torch.device("cuda", 0))
        True
    """
    device = torch.device(device)
    if device.type == "cuda":
        return True
    if device.type != "cpu":
        return False
    flags = cpu_flags() if flags is None else flags
    return "avx2" in flags and torch.backends.mkldnn.is_available()


def to_channels_last(model: nn.Module) -> nn.Module:
    """Put ``model``'s 4-d parameters and buffers in ``channels_last``, in place; returns ``model``.

    Do it before the optimizer and DDP are built: both keep references to the parameters,
    and DDP's gradient buckets follow the parameters' layout.

    Examples:
        >>> conv = to_channels_last(nn.Conv2d(3, 8, 3))
        >>> conv.weight.is_contiguous(memory_format=torch.channels_last)
        True
    """
    return model.to(memory_format=torch.channels_last)
