"""The building blocks of a YOLOv5-style detector: Conv, Bottleneck, C3, SPPF, Concat.

Each block takes its input channels first and its output channels second, the order
that :mod:`ddp_utils.yolo.model` fills in from a model yaml. The detection head,
:class:`~ddp_utils.yolo.model.Detect`, lives with the model because it needs the strides.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

# YOLOv5's batch-norm settings: a larger eps and a slower running-average momentum
# than torch's defaults, which suit small per-GPU batches.
BN_EPS = 1e-3
BN_MOMENTUM = 0.03


def autopad(kernel: int | list[int], padding: int | None = None, dilation: int = 1) -> int | list[int]:
    """Padding that keeps the spatial size ("same") for stride 1.

    Examples:
        >>> autopad(3), autopad(6, 2), autopad(3, dilation=2)
        (1, 2, 2)
    """
    if dilation > 1:
        kernel = dilation * (kernel - 1) + 1 if isinstance(kernel, int) else [dilation * (k - 1) + 1 for k in kernel]
    if padding is None:
        padding = kernel // 2 if isinstance(kernel, int) else [k // 2 for k in kernel]
    return padding


class Conv(nn.Module):
    """Convolution, batch norm and SiLU; :meth:`fuse` folds the batch norm into the convolution.

    Examples:
        >>> Conv(3, 16, 3, 2)(torch.zeros(1, 3, 32, 32)).shape
        torch.Size([1, 16, 16, 16])
    """

    # one SiLU object shared by every Conv, as YOLOv5 v7.0 has it: it holds no state, and YOLOv5's
    # layer count (len(list(model.modules()))) sees it once
    default_act = nn.SiLU(inplace=True)

    def __init__(
        self,
        c1: int,
        c2: int,
        k: int = 1,
        s: int = 1,
        p: int | None = None,
        g: int = 1,
        d: int = 1,
        act: bool | nn.Module = True,
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p, d), groups=g, dilation=d, bias=False)
        self.bn: nn.Module = nn.BatchNorm2d(c2, eps=BN_EPS, momentum=BN_MOMENTUM)
        if act is True:
            self.act: nn.Module = self.default_act
        elif isinstance(act, nn.Module):
            self.act = act
        else:
            self.act = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))

    @property
    def fused(self) -> bool:
        return isinstance(self.bn, nn.Identity)

    def fuse(self) -> None:
        """Fold the batch norm into the convolution (inference only: the fused weights are frozen, as YOLOv5's)."""
        if self.fused:
            return
        self.conv = fuse_conv_bn_eval(self.conv.eval(), self.bn.eval()).requires_grad_(False)
        self.bn = nn.Identity()


class Bottleneck(nn.Module):
    """A 1x1 then 3x3 convolution pair, with a residual connection when shapes allow.

    Examples:
        >>> Bottleneck(8, 8)(torch.zeros(1, 8, 4, 4)).shape
        torch.Size([1, 8, 4, 4])
    """

    def __init__(self, c1: int, c2: int, shortcut: bool = True, g: int = 1, e: float = 0.5) -> None:
        super().__init__()
        hidden = int(c2 * e)
        self.cv1 = Conv(c1, hidden, 1, 1)
        self.cv2 = Conv(hidden, c2, 3, 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    """CSP bottleneck with three convolutions: one branch runs n bottlenecks, the other skips them.

    Examples:
        >>> C3(8, 16, n=2)(torch.zeros(1, 8, 4, 4)).shape
        torch.Size([1, 16, 4, 4])
    """

    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = True, g: int = 1, e: float = 0.5) -> None:
        super().__init__()
        hidden = int(c2 * e)
        self.cv1 = Conv(c1, hidden, 1, 1)
        self.cv2 = Conv(c1, hidden, 1, 1)
        self.cv3 = Conv(2 * hidden, c2, 1)
        self.m = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut, g, e=1.0) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained max-pools stand in for pools of k, 2k-1, 3k-2.

    Examples:
        >>> SPPF(16, 16, 5)(torch.zeros(1, 16, 4, 4)).shape
        torch.Size([1, 16, 4, 4])
    """

    def __init__(self, c1: int, c2: int, k: int = 5) -> None:
        super().__init__()
        hidden = c1 // 2
        self.cv1 = Conv(c1, hidden, 1, 1)
        self.cv2 = Conv(hidden * 4, c2, 1, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))


class SPP(nn.Module):
    """Spatial pyramid pooling with parallel max-pools (YOLOv5 before v6.0).

    Examples:
        >>> SPP(16, 16)(torch.zeros(1, 16, 4, 4)).shape
        torch.Size([1, 16, 4, 4])
    """

    def __init__(self, c1: int, c2: int, k: tuple[int, ...] = (5, 9, 13)) -> None:
        super().__init__()
        hidden = c1 // 2
        self.cv1 = Conv(c1, hidden, 1, 1)
        self.cv2 = Conv(hidden * (len(k) + 1), c2, 1, 1)
        self.m = nn.ModuleList(nn.MaxPool2d(kernel_size=x, stride=1, padding=x // 2) for x in k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        return self.cv2(torch.cat([x] + [m(x) for m in self.m], 1))


class Focus(nn.Module):
    """Space-to-depth then a convolution (the stem of YOLOv5 before v6.0).

    Examples:
        >>> Focus(3, 16, 3)(torch.zeros(1, 3, 8, 8)).shape
        torch.Size([1, 16, 4, 4])
    """

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, p: int | None = None, g: int = 1) -> None:
        super().__init__()
        self.conv = Conv(c1 * 4, c2, k, s, p, g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat((x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]), 1))


class Concat(nn.Module):
    """Concatenate a list of tensors along one dimension (channels by default).

    Examples:
        >>> Concat()([torch.zeros(1, 2, 4, 4), torch.zeros(1, 3, 4, 4)]).shape
        torch.Size([1, 5, 4, 4])
    """

    def __init__(self, dimension: int = 1) -> None:
        super().__init__()
        self.d = dimension

    def forward(self, x: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(x, self.d)
