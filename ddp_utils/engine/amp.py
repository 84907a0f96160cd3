"""Mixed precision: which autocast dtype a run trains with on its device."""

from __future__ import annotations

import inspect

import torch

from ..log import LOGGER

AMP_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "off": None}


def resolve_amp(amp: str | None, device: torch.device) -> str:
    """The mixed precision to train with: ``amp`` as asked, else fp16 on CUDA and off elsewhere.

    bf16 on a GPU without native bf16 (before Ampere) is emulated, slower than fp32: a warning says so.

    Raises:
        ValueError: an unknown choice, or fp16 on a device without fp16 autocast (the CPU).

    Examples:
        >>> resolve_amp(None, torch.device("cpu")), resolve_amp("bf16", torch.device("cpu"))
        ('off', 'bf16')
    """
    if amp is None:
        return "fp16" if device.type == "cuda" else "off"
    if amp not in AMP_DTYPES:
        raise ValueError(f"--amp {amp}: choose one of {', '.join(AMP_DTYPES)}")
    if amp == "fp16" and device.type == "cpu":
        raise ValueError("--amp fp16 needs a CUDA device: use --amp bf16 or --amp off on the CPU")
    if amp == "bf16" and device.type == "cuda" and not _native_bf16():
        LOGGER.warning(
            f"--amp bf16: {device} has no native bf16 (it is emulated, slower than fp32); use --amp fp16 there"
        )
    return amp


def _native_bf16() -> bool:
    """Whether the current CUDA device computes bf16 natively (not by emulation)."""
    if "including_emulation" in inspect.signature(torch.cuda.is_bf16_supported).parameters:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return torch.cuda.is_bf16_supported()
