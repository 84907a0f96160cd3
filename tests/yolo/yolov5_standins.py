"""Stand-ins for YOLOv5's model classes, at YOLOv5's module paths, to write checkpoints in its pickle layout.

Written here from the published architecture (YOLOv5 is AGPL and never imported): Conv is
conv + batch norm + SiLU; C3 a CSP block of bottlenecks; SPPF three chained max-pools; Detect
decodes xy = (2 sigmoid + grid - 0.5) * stride and wh = (2 sigmoid)^2 * anchor. The classes carry
``__module__ = "models.common"`` / ``"models.yolo"`` so that ``torch.save`` pickles them under
YOLOv5's names; :func:`yolov5_modules` puts those modules into ``sys.modules`` only while saving.
"""

from __future__ import annotations

import contextlib
import math
import sys
import types
from collections.abc import Iterator
from copy import deepcopy
from typing import Any

import torch
from torch import nn


def _pad(k: int, p: int | None) -> int:
    return k // 2 if p is None else p


class Conv(nn.Module):
    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, p: int | None = None, g: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, _pad(k, p), groups=g, bias=False)
        self.bn = nn.BatchNorm2d(c2, eps=0.001, momentum=0.03)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, c1: int, c2: int, shortcut: bool = True, g: int = 1, e: float = 0.5) -> None:
        super().__init__()
        self.cv1 = Conv(c1, int(c2 * e), 1, 1)
        self.cv2 = Conv(int(c2 * e), c2, 3, 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.cv2(self.cv1(x))
        return out + x if self.add else out


class C3(nn.Module):
    def __init__(self, c1: int, c2: int, n: int = 1, shortcut: bool = True, g: int = 1, e: float = 0.5) -> None:
        super().__init__()
        c_ = int(c2 * e)
        self.cv1, self.cv2, self.cv3 = Conv(c1, c_), Conv(c1, c_), Conv(2 * c_, c2)
        self.m = nn.Sequential(*[Bottleneck(c_, c_, shortcut, g, 1.0) for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat([self.m(self.cv1(x)), self.cv2(x)], dim=1))


class SPPF(nn.Module):
    def __init__(self, c1: int, c2: int, k: int = 5) -> None:
        super().__init__()
        self.cv1, self.cv2 = Conv(c1, c1 // 2), Conv(c1 // 2 * 4, c2)
        self.m = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = [self.cv1(x)]
        for _ in range(3):
            pooled.append(self.m(pooled[-1]))
        return self.cv2(torch.cat(pooled, 1))


class SPP(nn.Module):
    def __init__(self, c1: int, c2: int, k: tuple = (5, 9, 13)) -> None:
        super().__init__()
        self.cv1, self.cv2 = Conv(c1, c1 // 2), Conv(c1 // 2 * (len(k) + 1), c2)
        self.m = nn.ModuleList([nn.MaxPool2d(size, 1, size // 2) for size in k])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        return self.cv2(torch.cat([x, *[pool(x) for pool in self.m]], 1))


class Focus(nn.Module):
    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, p: int | None = None, g: int = 1) -> None:
        super().__init__()
        self.conv = Conv(4 * c1, c2, k, s, p, g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [x[..., i::2, j::2] for j, i in ((0, 0), (0, 1), (1, 0), (1, 1))]
        return self.conv(torch.cat(parts, 1))


class Concat(nn.Module):
    def __init__(self, dimension: int = 1) -> None:
        super().__init__()
        self.d = dimension

    def forward(self, x: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(x, self.d)


class Detect(nn.Module):
    stride = None
    legacy = False  # pre-v6.0: the anchors in pixels are a buffer, anchor_grid

    def __init__(self, nc: int = 80, anchors: Any = (), ch: Any = ()) -> None:
        super().__init__()
        self.nc, self.no, self.nl, self.na = nc, nc + 5, len(anchors), len(anchors[0]) // 2
        self.grid = [torch.empty(0) for _ in range(self.nl)]
        self.register_buffer("anchors", torch.tensor(anchors).float().view(self.nl, -1, 2))
        if self.legacy:
            self.register_buffer("anchor_grid", self.anchors.clone().view(self.nl, 1, -1, 1, 1, 2))
        else:
            self.anchor_grid = [torch.empty(0) for _ in range(self.nl)]
        self.m = nn.ModuleList(nn.Conv2d(c, self.no * self.na, 1) for c in ch)

    def forward(self, x: list[torch.Tensor]) -> Any:
        z = []
        for i in range(self.nl):
            bs, _, ny, nx = (out := self.m[i](x[i])).shape
            x[i] = out.view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous()
            if not self.training:
                yv, xv = torch.meshgrid(torch.arange(ny), torch.arange(nx), indexing="ij")
                grid = torch.stack((xv, yv), 2).view(1, 1, ny, nx, 2).float() - 0.5
                pixels = self.anchor_grid[i] if self.legacy else self.anchors[i] * self.stride[i]
                anchor = pixels.reshape(1, self.na, 1, 1, 2)
                s = x[i].sigmoid()
                xy = (s[..., :2] * 2 + grid) * self.stride[i]
                wh = (s[..., 2:4] * 2) ** 2 * anchor
                z.append(torch.cat((xy, wh, s[..., 4:]), -1).view(bs, -1, self.no))
        return x if self.training else (torch.cat(z, 1), x)


class DetectionModel(nn.Module):
    def __init__(self, cfg: dict, ch: int = 3, nc: int | None = None) -> None:
        super().__init__()
        self.yaml = deepcopy(cfg)
        ch = self.yaml["ch"] = self.yaml.get("ch", ch)
        if nc:
            self.yaml["nc"] = nc
        self.model, self.save = _build(self.yaml, ch)
        self.names = [str(i) for i in range(self.yaml["nc"])]
        self.inplace = True
        head = self.model[-1]
        self.train()
        head.stride = torch.tensor([256 / o.shape[-2] for o in self.forward(torch.zeros(1, ch, 256, 256))])
        head.anchors /= head.stride.view(-1, 1, 1)
        self.stride = head.stride

    def forward(self, x: torch.Tensor) -> Any:
        kept: list[Any] = []
        for m in self.model:
            if m.f != -1:
                x = kept[m.f] if isinstance(m.f, int) else [x if j == -1 else kept[j] for j in m.f]
            x = m(x)
            kept.append(x if m.i in self.save else None)
        return x


class Model(DetectionModel):  # the name before YOLOv5 v6.1
    pass


_COMMON = (Conv, Bottleneck, C3, SPPF, SPP, Focus, Concat)
_BLOCKS = {c.__name__: c for c in (*_COMMON, Detect)} | {"nn.Upsample": nn.Upsample}


def _build(d: dict, ch_in: int) -> tuple[nn.Sequential, list[int]]:
    na = len(d["anchors"][0]) // 2
    no = na * (d["nc"] + 5)
    ch, layers, save = [ch_in], [], []
    for i, (f, n, name, args) in enumerate(d["backbone"] + d["head"]):
        block = _BLOCKS[name]
        args = [{"None": None, "nc": d["nc"], "anchors": d["anchors"]}.get(a, a) if isinstance(a, str) else a
                for a in args]  # fmt: skip
        n = max(round(n * d["depth_multiple"]), 1) if n > 1 else n
        if block in (Conv, Bottleneck, C3, SPPF, SPP, Focus):
            c1, c2 = ch[f], args[0]
            if c2 != no:
                c2 = math.ceil(c2 * d["width_multiple"] / 8) * 8
            args = [c1, c2, *args[1:]]
            if block is C3:
                args.insert(2, n)
                n = 1
        elif block is Concat:
            c2 = sum(ch[x] for x in f)
        elif block is Detect:
            args.append([ch[x] for x in f])
        else:
            c2 = ch[f]
        m = nn.Sequential(*(block(*args) for _ in range(n))) if n > 1 else block(*args)
        m.i, m.f, m.type, m.np = i, f, name, sum(p.numel() for p in m.parameters())
        save.extend(x % i for x in ([f] if isinstance(f, int) else f) if x != -1)
        layers.append(m)
        if i == 0:
            ch = []
        ch.append(c2)
    return nn.Sequential(*layers), sorted(save)


@contextlib.contextmanager
def yolov5_modules(prefix: str = "models") -> Iterator[None]:
    """Put the stand-ins at ``<prefix>.common`` and ``<prefix>.yolo`` in sys.modules; remove them after."""
    package = types.ModuleType(prefix)
    common, yolo = types.ModuleType(f"{prefix}.common"), types.ModuleType(f"{prefix}.yolo")
    for cls in _COMMON:
        cls.__module__ = common.__name__
        setattr(common, cls.__name__, cls)
    for cls in (Detect, DetectionModel, Model):
        cls.__module__ = yolo.__name__
        setattr(yolo, cls.__name__, cls)
    package.common, package.yolo = common, yolo
    parents = {".".join(prefix.split(".")[:i]): None for i in range(1, prefix.count(".") + 1)}
    modules = {**{p: types.ModuleType(p) for p in parents}, prefix: package, common.__name__: common}
    modules[yolo.__name__] = yolo
    try:
        with installed_modules(modules):
            yield
    finally:
        for cls in (*_COMMON, Detect, DetectionModel, Model):
            cls.__module__ = __name__


@contextlib.contextmanager
def installed_modules(modules: dict[str, types.ModuleType]) -> Iterator[None]:
    """``modules`` in sys.modules for the block; afterwards whatever stood under those names before."""
    saved = {n: sys.modules[n] for n in modules if n in sys.modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for n in modules:
            sys.modules.pop(n, None)
        sys.modules.update(saved)


def build(cfg: dict, legacy: bool = False, seed: int = 0) -> DetectionModel:
    """A stand-in YOLOv5 model with random weights and batch-norm statistics (so every tensor matters)."""
    torch.manual_seed(seed)
    Detect.legacy = legacy
    try:
        model = (Model if legacy else DetectionModel)(cfg)
    finally:
        Detect.legacy = False
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 2.0)
        for conv in model.model[-1].m:
            conv.bias.normal_(-2, 0.5)
    return model


def yolov5_checkpoint(model: DetectionModel, epoch: int = -1) -> dict:
    """The dict YOLOv5's train.py saves (released weights: no EMA, no optimizer), model in half precision."""
    model = deepcopy(model).half()
    model.nc, model.hyp = model.yaml["nc"], {"lr0": 0.01, "box": 0.05}
    model.names = {i: f"class{i}" for i in range(model.nc)}
    return {
        "epoch": epoch,
        "best_fitness": None,
        "model": model,
        "ema": None,
        "updates": None,
        "optimizer": None,
        "opt": {"weights": "yolov5s.pt", "imgsz": 640, "epochs": 300},
        "git": {"remote": "https://example.invalid/yolov5", "branch": "master", "commit": "0000000"},
        "date": "2024-01-01T00:00:00",
    }
