"""bf16 autocast's convolutions computed as a CPU with native bf16 computes them, on a CPU without it: fast.

On a CPU without ``avx512_bf16`` or ``amx_bf16``, torch runs a bf16 convolution by its reference kernel
(``_slow_conv2d``: im2col, then bf16 matrix products with fp32 sums), 6-9x slower than fp32: a parity run of
``--amp bf16`` takes hours there. A bf16 convolution's arithmetic is: bf16 operands (autocast rounds the input and
the weight to bf16), products exact in fp32 (8 x 8 significant bits fit in fp32's 24), sums in fp32, each result
rounded to bf16 once; backward likewise from the bf16 gradient of the output. :func:`install` computes exactly that
with fp32 convolutions (oneDNN's, fast) on the bf16 operands, each result rounded to bf16: the numbers of a kernel
that sums in fp32 and rounds once (as oneDNN's native bf16 kernels do), up to the order of the sums. torch's
reference kernel rounds more often: its input gradient adds the overlapping patches (col2im) in bf16, and its weight
gradient adds image by image in bf16 (one image through a 1x1 kernel gives the same bits as here; more images, or a
3x3 kernel, do not: ``tests/test_benchmarks_bf16_conv.py``). Everything but the convolutions (BatchNorm, SiLU, the
loss, the optimizer) runs as under autocast, untouched.

Used by ``parity.py --ours-amp bf16 --ours-bf16-conv fp32``: its runs carry ``bf16_conv: fp32`` in their key, apart
from the runs of torch's own kernel.
"""

from __future__ import annotations

import runpy
import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

_original_conv_forward = nn.Conv2d._conv_forward


class _Bf16Conv(torch.autograd.Function):
    """conv2d of bf16 ``x``, ``weight``, ``bias`` (each exact in fp32), computed in fp32 and rounded to bf16."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv: dict) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.conv, ctx.has_bias = conv, bias is not None
        with torch.autocast("cpu", enabled=False):
            out = F.conv2d(x.float(), weight.float(), None if bias is None else bias.float(), **conv)
        return out.to(torch.bfloat16, memory_format=_layout(x))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        x, weight = ctx.saved_tensors
        grad32 = grad.float()  # the bf16 gradient of the output, exact in fp32
        with torch.autocast("cpu", enabled=False):
            grad_x = grad_w = grad_b = None
            if ctx.needs_input_grad[0]:
                grad_x = torch.nn.grad.conv2d_input(x.shape, weight.float(), grad32, **ctx.conv)
                grad_x = grad_x.to(torch.bfloat16, memory_format=_layout(x))
            if ctx.needs_input_grad[1]:
                grad_w = torch.nn.grad.conv2d_weight(x.float(), weight.shape, grad32, **ctx.conv)
                grad_w = grad_w.to(torch.bfloat16, memory_format=_layout(weight))
            if ctx.has_bias and ctx.needs_input_grad[2]:
                grad_b = grad32.sum((0, 2, 3)).to(torch.bfloat16)
        return grad_x, grad_w, grad_b, None


def _layout(t: torch.Tensor) -> torch.memory_format:
    return torch.channels_last if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) else (
        torch.contiguous_format
    )  # fmt: skip


def _conv_forward(self: nn.Conv2d, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Conv2d's forward: under CPU bf16 autocast, :class:`_Bf16Conv` on the operands autocast rounds; else as is."""
    if not (torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16):
        return _original_conv_forward(self, x, weight, bias)
    if self.padding_mode != "zeros":
        return _original_conv_forward(self, x, weight, bias)
    conv = dict(stride=self.stride, padding=self.padding, dilation=self.dilation, groups=self.groups)
    bf16 = [t if t is None else t.to(torch.bfloat16) for t in (x, weight, bias)]  # autocast's casts (with gradients)
    return _Bf16Conv.apply(*bf16, conv)


def install() -> None:
    """Compute every ``nn.Conv2d`` under CPU bf16 autocast by :class:`_Bf16Conv` in this process."""
    nn.Conv2d._conv_forward = _conv_forward


def uninstall() -> None:
    """torch's own kernel again."""
    nn.Conv2d._conv_forward = _original_conv_forward


def main(argv: list[str]) -> None:
    """``python bf16_conv.py SCRIPT ARGS...``: run SCRIPT as ``__main__`` with the convolutions installed."""
    install()
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
