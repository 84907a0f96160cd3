"""A YOLOv5-style detector built from a model yaml in YOLOv5's own format.

The yaml names its blocks as text (``Conv``, ``C3``, ``nn.Upsample``, ...). Those names
resolve through :data:`MODULES`, an explicit allow-list: nothing from the file is ever
evaluated, so a yaml from the internet can describe a model but cannot run code. A yaml
that does not describe a model (an unknown block, a wrong number of arguments, a
``from`` index that points nowhere, a multiple that is not a number) raises
:class:`ModelConfigError` naming the file and the layer.
"""

from __future__ import annotations

import contextlib
import math
from copy import deepcopy
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from ..log import LOGGER
from ..yamls import find_asset
from .blocks import C3, SPP, SPPF, Bottleneck, Concat, Conv, Focus


class ModelConfigError(ValueError):
    """A model yaml that does not describe a model; the message names the file and the layer."""


def make_divisible(x: float, divisor: int = 8) -> int:
    """The smallest multiple of ``divisor`` that is at least ``x``.

    Examples:
        >>> make_divisible(64 * 0.25), make_divisible(1024 * 0.75), make_divisible(3.1, 8)
        (16, 768, 8)
    """
    return int(math.ceil(x / divisor) * divisor)


class Detect(nn.Module):
    """The detection head: one 1x1 convolution per level predicting ``na`` anchors x (5 + nc) values.

    Anchors are stored in grid units of their level (pixels / stride) once the
    :class:`Model` has measured the strides. In training it returns the raw level
    outputs, each ``[B, na, ny, nx, 5 + nc]``; in eval mode it returns ``(pred, raw)``
    where ``pred`` is ``[B, N, 5 + nc]`` with boxes as xywh in input pixels and
    sigmoid objectness and class scores. In eval mode the head's own convolutions run in
    the weights' dtype outside autocast (float32 unless the model was made ``.half()``) and
    the boxes are decoded in float32, whatever the network before them computed in (fp16,
    bf16 autocast): bf16's 8-bit mantissa moved a parity checkpoint's held-out
    mAP@0.5:0.95 by 0.0024 with a bf16 head, 0.0005 with this one (docs/cpu.md).
    """

    def __init__(self, nc: int = 80, anchors: list[list[float]] | tuple = (), ch: list[int] | tuple = ()) -> None:
        super().__init__()
        self.nc = nc
        self.no = nc + 5
        self.nl = len(anchors)
        self.na = len(anchors[0]) // 2
        self.register_buffer("anchors", torch.tensor(anchors, dtype=torch.float32).view(self.nl, -1, 2))
        self.register_buffer("stride", torch.zeros(self.nl))
        self.m = nn.ModuleList(nn.Conv2d(c, self.no * self.na, 1) for c in ch)
        self._grids: dict[tuple, torch.Tensor] = {}

    def forward(self, x: list[torch.Tensor]) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        decoded = []
        for i in range(self.nl):
            out = self.m[i](x[i]) if self.training else self._eval_head(i, x[i])
            bs, _, ny, nx = out.shape
            x[i] = out.view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous()
            if not self.training:  # decoded in fp32 whatever the network ran in: bf16 is 4 px coarse at 512-1024
                grid, anchor_grid = self._grid(i, nx, ny, x[i].device)
                xy, wh, conf = x[i].float().sigmoid().split((2, 2, self.nc + 1), 4)
                # YOLOv5's decoding: centres may leave their cell by half a cell, sizes reach 4x the anchor
                xy = (xy * 2 + grid) * self.stride[i]
                wh = (wh * 2) ** 2 * anchor_grid
                decoded.append(torch.cat((xy, wh, conf), 4).view(bs, self.na * ny * nx, self.no))
        return x if self.training else (torch.cat(decoded, 1), x)

    def _eval_head(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Level ``i``'s 1x1 convolution in its weights' dtype, autocast off (training keeps autocast's dtype)."""
        with torch.autocast(x.device.type, enabled=False):
            return self.m[i](x.to(self.m[i].weight.dtype))

    def _grid(self, i: int, nx: int, ny: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (i, nx, ny, device)
        grid = self._grids.get(key)
        if grid is None:
            ys = torch.arange(ny, device=device, dtype=torch.float32)
            xs = torch.arange(nx, device=device, dtype=torch.float32)
            yv, xv = torch.meshgrid(ys, xs, indexing="ij")
            grid = torch.stack((xv, yv), 2).expand(1, self.na, ny, nx, 2) - 0.5
            self._grids = {k: v for k, v in self._grids.items() if k[0] != i}  # one cached size per level
            self._grids[key] = grid
        # from the live buffers each time, so anchors changed in place (autoanchor) take effect
        anchor_grid = (self.anchors[i].float() * self.stride[i].float()).view(1, self.na, 1, 1, 2)
        return grid, anchor_grid

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_grids"] = {}  # caches stay out of deep copies and pickles
        return state


# The only names a model yaml may use, mapped to the classes they build.
MODULES: dict[str, type[nn.Module]] = {
    "Conv": Conv,
    "Bottleneck": Bottleneck,
    "C3": C3,
    "SPP": SPP,
    "SPPF": SPPF,
    "Focus": Focus,
    "Concat": Concat,
    "Detect": Detect,
    "nn.Upsample": nn.Upsample,
    "Upsample": nn.Upsample,
    "nn.BatchNorm2d": nn.BatchNorm2d,
    "nn.Identity": nn.Identity,
}
# Blocks whose first two arguments are (input channels, output channels), filled in from the graph.
_CHANNEL_BLOCKS = (Conv, Bottleneck, C3, SPP, SPPF, Focus)
# Blocks that take their repeat count as an argument instead of being stacked.
_REPEAT_BLOCKS = (C3,)
_WORDS = {"None": None, "True": True, "False": False}


def load_model_yaml(cfg: str | Path | dict) -> tuple[dict, str]:
    """Read a model yaml: a dict as given, a path, or a bare name shipped in configs/models/.

    Returns:
        The config dict (a copy) and a name for messages and the summary: the file path; for a dict,
        the name of the yaml file it came from (its ``yaml_file`` key, as checkpoints record it), else "<dict>".

    Examples:
        >>> cfg, source = load_model_yaml("yolov5n.yaml")
        >>> cfg["width_multiple"], Path(source).name
        (0.25, 'yolov5n.yaml')
    """
    if isinstance(cfg, dict):  # from a checkpoint: named by the yaml file it was built from, when recorded
        named = cfg.get("yaml_file")
        return deepcopy(cfg), Path(named).name if isinstance(named, str) and named else "<dict>"
    path = find_asset("configs/models", cfg)
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ModelConfigError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(loaded, dict):
        raise ModelConfigError(f"{path}: a model yaml is a mapping with nc, anchors, backbone and head")
    return loaded, str(path)


def _number(cfg: dict, key: str, source: str, default: float | None = None) -> float:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ModelConfigError(f"{source}: {key}={value!r} must be a positive number")
    return float(value)


def _anchor_list(anchors: Any, n_levels: int, source: str) -> list[list[float]]:
    if isinstance(anchors, int) and not isinstance(anchors, bool) and anchors > 0:
        # "anchors: 3" asks for 3 anchors per level to be found later (autoanchor); placeholders here
        return [[float(v) for v in range(1, 2 * anchors + 1)]] * n_levels
    ok = isinstance(anchors, (list, tuple)) and len(anchors) > 0
    ok = ok and all(isinstance(a, (list, tuple)) and len(a) >= 2 and len(a) % 2 == 0 for a in anchors)
    ok = ok and len({len(a) for a in anchors}) == 1
    ok = ok and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for a in anchors for v in a)
    if not ok:
        raise ModelConfigError(
            f"{source}: anchors={anchors!r} must be a list of [w1, h1, w2, h2, ...] lists of positive numbers, "
            "the same number of anchors on each level"
        )
    return [[float(v) for v in a] for a in anchors]


def _resolve_args(args: list, nc: int, anchors: Any) -> list:
    resolved = []
    for a in args:
        if a == "nc":
            resolved.append(nc)
        elif a == "anchors":
            resolved.append(anchors)
        elif isinstance(a, str) and a in _WORDS:
            resolved.append(_WORDS[a])
        else:
            resolved.append(a)  # numbers, lists, and plain strings such as "nearest" stay as written
    return resolved


def _check_from(f: Any, i: int, where: str) -> list[int]:
    sources = [f] if isinstance(f, int) and not isinstance(f, bool) else f
    if (
        not isinstance(sources, list)
        or not sources
        or not all(isinstance(j, int) and not isinstance(j, bool) for j in sources)
    ):
        raise ModelConfigError(f"{where}: from={f!r} must be an int or a list of ints")
    for j in sources:
        # -1 is the previous layer (the image for layer 0); others are earlier layers, counted from the end if < 0
        if j != -1 and not (0 <= j < i or -i <= j < 0):
            raise ModelConfigError(f"{where}: from={f!r} refers to layer {j}, but only layers 0..{i - 1} come before")
    return sources


def _layer_spec(spec: Any, i: int, where: str) -> tuple[Any, int, str, list, list[int]]:
    """One checked ``[from, number, module, args]`` row and the layers it reads: its errors name the layer."""
    if not isinstance(spec, (list, tuple)) or len(spec) != 4:
        raise ModelConfigError(f"{where}: each layer is [from, number, module, args]")
    f, number, name, args = spec
    sources = _check_from(f, i, where)
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ModelConfigError(f"{where}: number={number!r} must be a positive integer")
    if not isinstance(name, str) or name not in MODULES:
        raise ModelConfigError(f"{where}: unknown module {name!r}; known modules are {', '.join(MODULES)}")
    if not isinstance(args, list):
        raise ModelConfigError(f"{where}: args={args!r} must be a list")
    return f, number, name, args, sources


def _channel_block_args(
    name: str, args: list, n: int, c_in: int, n_outputs: int | None, width_multiple: float, where: str
) -> tuple[list, Any, int]:
    """A channel block's ``(args, c_out, n)``: its width scaled, and a C3's repeats passed in, not stacked."""
    if not args or isinstance(args[0], bool) or not isinstance(args[0], (int, float)):
        raise ModelConfigError(f"{where}: {name} needs its output channels as the first argument")
    if not math.isfinite(args[0]) or args[0] <= 0:
        raise ModelConfigError(f"{where}: {name} output channels {args[0]!r} must be a positive number")
    c_out = args[0] if args[0] == n_outputs else make_divisible(args[0] * width_multiple, 8)
    args = [c_in, c_out, *args[1:]]
    if MODULES[name] in _REPEAT_BLOCKS:
        args.insert(2, n)
        n = 1
    return args, c_out, n


def _detect_args(args: list, nc: int, anchors: Any, c_ins: list[int], where: str, source: str) -> list:
    """Detect's ``[nc, anchors, c_ins]`` (the channels it reads), checked against the top-level nc and anchors."""
    if anchors is None:
        raise ModelConfigError(f"{where}: Detect needs the top-level 'anchors' key")
    if len(c_ins) != len(anchors):
        raise ModelConfigError(f"{where}: Detect reads {len(c_ins)} layers but anchors has {len(anchors)} levels")
    args = [args[0] if args else nc, args[1] if len(args) > 1 else anchors, c_ins]
    if isinstance(args[0], bool) or not isinstance(args[0], int) or args[0] < 1:
        raise ModelConfigError(f"{where}: Detect's class count {args[0]!r} must be a positive integer (or nc)")
    if isinstance(args[1], int):
        args[1] = _anchor_list(args[1], len(c_ins), source)
    return args


def parse_model(cfg: dict, ch: int, source: str = "<dict>") -> tuple[nn.Sequential, list[int]]:
    """Build the layers a model yaml describes.

    Args:
        cfg: the model config (nc, depth_multiple, width_multiple, anchors, backbone, head).
        ch: input channels.
        source: the file name to put in error messages.

    Returns:
        The layers as an ``nn.Sequential`` (each carrying ``i``, ``f``, ``type``, ``np``) and the
        sorted indices of layers whose outputs later layers read.

    Raises:
        ModelConfigError: the config does not describe a model; the message names the file and layer.
    """
    nc = cfg.get("nc")
    if isinstance(nc, bool) or not isinstance(nc, int) or nc < 1:
        raise ModelConfigError(f"{source}: nc={nc!r} must be a positive integer (the number of classes)")
    depth_multiple = _number(cfg, "depth_multiple", source, 1.0)
    width_multiple = _number(cfg, "width_multiple", source, 1.0)
    backbone, head = cfg.get("backbone"), cfg.get("head")
    if not isinstance(backbone, list) or not isinstance(head, list):
        raise ModelConfigError(f"{source}: 'backbone' and 'head' must both be lists of [from, number, module, args]")
    raw_anchors = cfg.get("anchors")
    n_levels = len(raw_anchors) if isinstance(raw_anchors, list) else 3
    anchors = _anchor_list(raw_anchors, n_levels, source) if raw_anchors is not None else None
    # a block whose output channels equal the head's (anchors x (5 + nc)) keeps them unscaled
    n_outputs = len(anchors[0]) // 2 * (nc + 5) if anchors else None

    layers, save, channels = [], [], []
    for i, spec in enumerate(backbone + head):
        where = f"{source}: layer {i} ({spec!r})"
        f, number, name, args, sources = _layer_spec(spec, i, where)
        module_cls = MODULES[name]
        args = _resolve_args(args, nc, anchors)
        n = max(round(number * depth_multiple), 1) if number > 1 else number
        c_ins = [ch if (j == -1 and i == 0) else channels[j] for j in sources]
        c_in = c_ins[0]
        c_out = c_in
        if module_cls in _CHANNEL_BLOCKS:
            args, c_out, n = _channel_block_args(name, args, n, c_in, n_outputs, width_multiple, where)
        elif module_cls is nn.BatchNorm2d:
            args = [c_in]
        elif module_cls is Concat:
            c_out = sum(c_ins)
        elif module_cls is Detect:
            args = _detect_args(args, nc, anchors, c_ins, where, source)
        try:
            block = nn.Sequential(*(module_cls(*args) for _ in range(n))) if n > 1 else module_cls(*args)
        except (TypeError, ValueError, RuntimeError, OverflowError, IndexError) as exc:
            raise ModelConfigError(f"{where}: cannot build {name} from args {args!r}: {exc}") from None
        block.i, block.f, block.type = i, f, name
        block.np = sum(p.numel() for p in block.parameters())
        save.extend(j % i for j in sources if j != -1)
        layers.append(block)
        channels.append(c_out)
    if not layers:
        raise ModelConfigError(f"{source}: backbone and head describe no layers")
    return nn.Sequential(*layers), sorted(set(save))


class Model(nn.Module):
    """A detector built from a YOLOv5 model yaml.

    Args:
        cfg: a model yaml path, a bare name from configs/models/ ("yolov5s.yaml"), or a dict.
        ch: input channels.
        nc: number of classes; overrides the yaml's nc (the data yaml's count) and logs it.
        anchors: anchors overriding the yaml's (same format as the yaml's ``anchors``).

    Examples:
        >>> cfg, _ = load_model_yaml("yolov5n.yaml")
        >>> model = Model({**cfg, "width_multiple": 0.0625}, nc=2)
        >>> model.stride.tolist(), model.nc
        ([8.0, 16.0, 32.0], 2)
        >>> [tuple(o.shape) for o in model(torch.zeros(1, 3, 64, 64))]
        [(1, 3, 8, 8, 7), (1, 3, 4, 4, 7), (1, 3, 2, 2, 7)]
    """

    stride_probe_size = 256  # side of the zero image whose forward pass measures the strides

    def __init__(
        self, cfg: str | Path | dict = "yolov5n.yaml", ch: int = 3, nc: int | None = None, anchors: Any = None
    ) -> None:
        super().__init__()
        self.yaml, self.yaml_file = load_model_yaml(cfg)
        if self.yaml_file != "<dict>":  # kept in the checkpoint's model_cfg: a model built from it has the name
            self.yaml["yaml_file"] = Path(self.yaml_file).name
        ch = self.yaml["ch"] = self.yaml.get("ch", ch)
        if nc is not None and nc != self.yaml.get("nc"):
            LOGGER.info(f"{Path(self.yaml_file).name}: overriding nc={self.yaml.get('nc')} with nc={nc}")
            self.yaml["nc"] = nc
        if anchors is not None:
            LOGGER.info(f"{Path(self.yaml_file).name}: overriding the yaml's anchors with {anchors}")
            self.yaml["anchors"] = anchors
        self.model, self.save = parse_model(self.yaml, ch, self.yaml_file)
        self.nc = int(self.yaml["nc"])
        self.names = [str(i) for i in range(self.nc)]
        detect = self.model[-1]
        if isinstance(detect, Detect):
            detect.stride.copy_(self._measure_strides(ch))
            self._order_anchors(detect)
            detect.anchors /= detect.stride.view(-1, 1, 1)
            self.initialize_biases()

    @property
    def stride(self) -> torch.Tensor:
        """Downsampling factor of each output level, e.g. tensor([8., 16., 32.])."""
        detect = self.model[-1]
        return detect.stride if isinstance(detect, Detect) else torch.tensor([32.0])

    def forward(self, x: torch.Tensor) -> Any:
        outputs: list[Any] = []
        for layer in self.model:
            if layer.f != -1:
                x = outputs[layer.f] if isinstance(layer.f, int) else [x if j == -1 else outputs[j] for j in layer.f]
            x = layer(x)
            outputs.append(x if layer.i in self.save else None)
        return x

    @torch.no_grad()
    def _measure_strides(self, ch: int) -> torch.Tensor:
        # eval mode so the probe leaves the batch-norm statistics alone
        size = self.stride_probe_size
        was_training = self.training
        self.eval()
        # a yaml can pass parse_model and still not run (Upsample without a size, a kernel larger
        # than its input, Concat of mismatched grids): name the layer that failed on the probe
        current = [None]
        hooks = [m.register_forward_pre_hook(lambda _m, _x, i=m.i: current.__setitem__(0, i)) for m in self.model]
        try:
            _, levels = self.forward(torch.zeros(1, ch, size, size))
        except (RuntimeError, TypeError, ValueError, IndexError) as exc:
            layer = self.model[current[0]] if current[0] is not None else None
            where = f"layer {current[0]} ({layer.type})" if layer is not None else "the model"
            raise ModelConfigError(
                f"{self.yaml_file}: {where} fails on a {size}x{size} probe image: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}"
            ) from None
        finally:
            for hook in hooks:
                hook.remove()
            self.train(was_training)
        return torch.tensor([size / level.shape[-2] for level in levels], dtype=torch.float32)

    @staticmethod
    def _order_anchors(detect: Detect) -> None:
        # anchors must grow with the stride (small anchors on the fine P3 grid): flip a backwards list
        area = detect.anchors.prod(-1).mean(-1)
        if (area[-1] - area[0]).sign() * (detect.stride[-1] - detect.stride[0]).sign() < 0:
            LOGGER.info("reversing the anchor order to match the strides")
            detect.anchors.copy_(detect.anchors.flip(0))

    @torch.no_grad()
    def initialize_biases(self, class_frequency: torch.Tensor | None = None) -> None:
        """Set the head's biases to sensible priors so the first steps are not spent learning them.

        Objectness starts at about 8 objects per 640x640 image on each level. Class scores
        start at ``log(frequency / total)`` when class frequencies (e.g. label counts) are
        given, else at YOLOv5's default ``log(0.6 / (nc - 0.99))``. Setting, not adding, makes
        a second call (with the dataset's label counts) replace the first.

        Args:
            class_frequency: counts or frequencies per class, length nc; zeros are treated as the
                smallest non-zero frequency.
        """
        detect = self.model[-1]
        if not isinstance(detect, Detect):
            return
        if class_frequency is not None:
            freq = torch.as_tensor(class_frequency, dtype=torch.float32).flatten()
            if freq.numel() != detect.nc:
                raise ValueError(f"class_frequency has {freq.numel()} entries but the model has nc={detect.nc}")
            positive = freq[freq > 0]
            freq = freq.clamp(min=float(positive.min())) if positive.numel() else torch.ones_like(freq)
            class_bias = torch.log(freq / freq.sum())
        for conv, stride in zip(detect.m, detect.stride.tolist()):
            bias = conv.bias.view(detect.na, -1)
            bias[:, 4] = math.log(8 / (640 / stride) ** 2)
            if class_frequency is None:
                bias[:, 5:] = math.log(0.6 / (detect.nc - 0.99))
            else:
                bias[:, 5:] = class_bias.to(bias)

    def fuse(self) -> Model:
        """Fold every batch norm into its convolution for inference; outputs are unchanged."""
        LOGGER.info("fusing Conv and BatchNorm layers")
        for module in self.modules():
            if isinstance(module, Conv):
                module.fuse()
        return self

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Model:
        # the grid cache holds tensors on the old device and dtype
        with contextlib.suppress(AttributeError):
            self.model[-1]._grids = {}
        return super()._apply(fn, *args, **kwargs)
