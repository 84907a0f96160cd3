"""How big and how fast a model is: parameters, FLOPs, time and memory, per device.

Two FLOP counters disagree by convention, so :func:`flops` runs both and says which is which:

- thop counts multiply-adds (MACs) of the layer types it has a rule for (conv, linear, norm,
  pool, upsample). YOLOv5's table reports 2 x MACs as "GFLOPs"; so does this module.
- PyTorch's ``torch.utils.flop_counter.FlopCounterMode`` counts FLOPs of the aten ops it
  knows (matmul, conv, attention), 2 per multiply-add, whichever module called them.
  Elementwise ops (activations, additions, norms) are not counted.

thop is optional: it is imported when a count is asked for, and without it FlopCounterMode
serves and the report says so.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Union

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode  # the base FlopCounterMode itself is built on
from torch.utils.flop_counter import FlopCounterMode

from .device import available_devices, time_synchronized
from .dist import all_gather_object, dist_info, is_dist_initialized
from .log import LOGGER

THOP_CONVENTION = "thop: 2 x MACs of the layers thop has rules for (YOLOv5's GFLOPs)"
TORCH_CONVENTION = "FlopCounterMode: FLOPs of matmul/conv/attention aten ops (2 per multiply-add)"
CPU_MEMORY_NOTE = "memory: peak CUDA memory allocated (GB); not measured on cpu/mps (torch has no peak counter there)"

# aten ops that only move, view or create data: not a FLOP counter's business, so not
# listed among the ops a counter missed
_DATA_MOVEMENT_OPS = {
    *("view", "_unsafe_view", "reshape", "_reshape_alias", "permute", "transpose", "t", "expand", "expand_as"),
    *("view_as", "clone", "contiguous", "cat", "stack", "split", "split_with_sizes", "chunk", "unbind"),
    *("slice", "select", "unsqueeze", "squeeze", "flatten", "as_strided", "alias", "detach", "lift_fresh"),
    *("lift_fresh_copy", "_to_copy", "copy_", "empty", "empty_like", "empty_strided", "zeros", "zeros_like"),
    *("ones", "ones_like", "full", "full_like", "arange", "new_zeros", "new_empty", "new_ones", "new_full"),
    *("fill_", "zero_", "index", "meshgrid", "constant_pad_nd", "_local_scalar_dense", "item", "randn", "rand"),
}

Input = Union[torch.Tensor, int, Sequence[Any]]


@dataclass
class FlopsReport:
    """FLOPs of one forward pass, by both counters, with what each left out.

    Attributes:
        input_shape: shape of the input counted at (a list of shapes for several inputs).
        device: the device the count ran on.
        thop_gflops: 2 x thop's MACs / 1e9 (YOLOv5's convention), None when thop is
            missing or failed.
        torch_gflops: FlopCounterMode's FLOPs / 1e9, None when it failed.
        thop_uncounted: modules thop has no rule for that own parameters or do matmul/conv
            work of their own, as "name (Type)".
        torch_uncounted: aten ops FlopCounterMode has no formula for (data movement
            excepted) and how often each ran.
        notes: why a counter is missing or failed, one line each.
    """

    input_shape: Any
    device: str
    thop_gflops: float | None = None
    torch_gflops: float | None = None
    thop_uncounted: list[str] = field(default_factory=list)
    torch_uncounted: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def counter(self) -> str:
        """Which counter :attr:`gflops` comes from: "thop" when it ran, else "FlopCounterMode"."""
        return "thop" if self.thop_gflops is not None else "FlopCounterMode"

    @property
    def gflops(self) -> float:
        """The headline number: thop's (YOLOv5's convention) when available, else FlopCounterMode's."""
        value = self.thop_gflops if self.thop_gflops is not None else self.torch_gflops
        return float("nan") if value is None else value

    def text(self) -> str:
        """The report as a few human-readable lines."""
        lines = [f"FLOPs of one forward pass at input {self.input_shape} on {self.device}:"]
        thop = f"{self.thop_gflops:.4g} GFLOPs" if self.thop_gflops is not None else "not counted"
        torch_ = f"{self.torch_gflops:.4g} GFLOPs" if self.torch_gflops is not None else "not counted"
        lines.append(f"  {thop:>18}  {THOP_CONVENTION}")
        lines.append(f"  {torch_:>18}  {TORCH_CONVENTION}")
        if self.thop_uncounted:
            lines.append(f"  thop did not count (no rule): {', '.join(self.thop_uncounted)}")
        if self.torch_uncounted:
            ops = ", ".join(f"{name} x{calls}" for name, calls in self.torch_uncounted.items())
            lines.append(f"  FlopCounterMode did not count ops: {ops}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def de_parallel(model: nn.Module) -> nn.Module:
    """The bare model inside a DataParallel or DistributedDataParallel wrapper.

    Examples:
        >>> m = nn.Linear(2, 2)
        >>> de_parallel(nn.DataParallel(m)) is m
        True
    """
    wrappers = (nn.DataParallel, nn.parallel.DistributedDataParallel)
    return model.module if isinstance(model, wrappers) else model


def _param_device_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    for p in model.parameters():
        if p.is_floating_point():
            return p.device, p.dtype
    return torch.device("cpu"), torch.float32


def _image_size(imgsz: int | Sequence[int]) -> tuple[int, int]:
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
    device, dtype = _param_device_dtype(model)
    h, w = _image_size(imgsz)
    shape: tuple[int, ...] = (batch, 3, h, w)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            shape = (batch, module.in_features)
            break
        if isinstance(module, nn.modules.conv._ConvNd):
            shape = (batch, module.in_channels, h, w)[: 2 + module.weight.dim() - 2]
            break
    return torch.rand(shape, device=device, dtype=dtype)


def _shape_of(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return tuple(obj.shape)
    if isinstance(obj, (list, tuple)):
        return [_shape_of(o) for o in obj]
    if isinstance(obj, dict):
        return {k: _shape_of(v) for k, v in obj.items()}
    return type(obj).__name__


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


def _as_args(inputs: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)


def _thop_count(work: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[float, set[type]]:
    """thop's MACs and the module types it has rules for; ImportError when thop is not there."""
    import thop  # optional, as in YOLOv5: imported only when a count is asked for
    from thop.profile import register_hooks

    macs, _ = thop.profile(work, inputs=args, verbose=False)
    return float(macs), set(register_hooks)


class _OpRecorder(TorchDispatchMode):
    """Counts the aten ops a forward pass runs, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _torch_count(work: nn.Module | Callable, args: tuple[torch.Tensor, ...]) -> tuple[int, dict, dict[str, int]]:
    """FlopCounterMode's total, its per-module counts, and the aten ops it had no formula for."""
    from torch.utils.flop_counter import flop_registry

    recorder = _OpRecorder()
    counter = FlopCounterMode(display=False)
    with counter, recorder, torch.no_grad():
        work(*args)
    known = {str(op) for op in flop_registry}
    missed = {
        name: calls
        for name, calls in sorted(recorder.calls.items())
        if name not in known and name.split(".")[-1] not in _DATA_MOVEMENT_OPS
    }
    return counter.get_total_flops(), counter.get_flop_counts(), missed


def _thop_uncounted(work: nn.Module, rules: set[type], module_flops: dict | None) -> list[str]:
    """Modules thop skipped although they own parameters or do counted work of their own.

    A module's own work is what FlopCounterMode booked to it beyond what its submodules
    account for. A container whose forward was never called (a ModuleList, or a Sequential
    a model iterates itself) has no entry, so its children stand in for it.
    """
    root = type(work).__name__
    children = {name: [f"{name}.{c}" if name else c for c, _ in m.named_children()] for name, m in work.named_modules()}

    def total(name: str) -> int:
        if module_flops is None:
            return 0
        return sum(module_flops.get(f"{root}.{name}" if name else root, {}).values())

    def accounted(name: str) -> int:
        return total(name) or sum(accounted(c) for c in children[name])

    uncounted = []
    for name, module in work.named_modules():
        if type(module) in rules and not isinstance(module, (nn.Sequential, nn.ModuleList)):
            continue
        own_flops = total(name) - sum(accounted(c) for c in children[name])
        own_params = any(True for _ in module.parameters(recurse=False))
        if own_flops > 0 or own_params:
            uncounted.append(f"{name or '(model)'} ({type(module).__name__})")
    return uncounted


def flops(
    model: nn.Module,
    imgsz: int | Sequence[int] = 640,
    batch: int = 1,
    inputs: torch.Tensor | Sequence[torch.Tensor] | None = None,
) -> FlopsReport:
    """Count the FLOPs of one forward pass with thop and with FlopCounterMode.

    The count runs on a deep copy of the model in eval mode, on the model's device, at the
    real input size: the model itself keeps its mode, device and buffers.

    Args:
        model: the model (a DDP or DataParallel wrapper is looked through).
        imgsz: input image size, an int or (height, width).
        batch: batch size of the input.
        inputs: the input itself (a tensor, or a tuple of positional inputs) instead of
            one made from imgsz and batch (see :func:`example_input`).

    Returns:
        A :class:`FlopsReport` with both counts, their conventions and what they missed.

    Raises:
        RuntimeError: neither counter could count (both errors are named).

    Examples:
        >>> report = flops(nn.Conv2d(3, 8, 3, padding=1), imgsz=8)
        >>> report.torch_gflops * 1e9  # 2 x (8 x 8 x 8 outputs x 3 x 3 x 3 MACs each)
        27648.0
    """
    model = de_parallel(model)
    args = _as_args(inputs) if inputs is not None else (example_input(model, imgsz, batch),)
    device, _ = _param_device_dtype(model)
    shape = _shape_of(args[0]) if len(args) == 1 else _shape_of(list(args))
    report = FlopsReport(input_shape=shape, device=str(device))
    work = copy.deepcopy(model).eval()

    module_flops = None
    try:
        total, module_flops, report.torch_uncounted = _torch_count(work, args)
        report.torch_gflops = total / 1e9
    except Exception as e:  # a failed count is reported, the other counter may still serve
        report.notes.append(f"FlopCounterMode failed: {type(e).__name__}: {e}")

    try:
        macs, rules = _thop_count(work, args)
        report.thop_gflops = 2 * macs / 1e9
        report.thop_uncounted = _thop_uncounted(work, rules, module_flops)
    except ImportError as e:
        report.notes.append(f"thop is not installed ({e}): FlopCounterMode's count serves")
    except Exception as e:
        report.notes.append(f"thop failed: {type(e).__name__}: {e}")

    if report.thop_gflops is None and report.torch_gflops is None:
        raise RuntimeError(f"could not count the FLOPs of {type(model).__name__}: " + "; ".join(report.notes))
    for note in report.notes:
        LOGGER.warning(f"flops: {note}")
    if report.gflops == 0 and any(True for _ in model.parameters()):
        LOGGER.warning(f"flops: {type(model).__name__} has parameters but {report.counter} counted 0 FLOPs")
    return report


def model_info(model: nn.Module, imgsz: int | Sequence[int] = 640, verbose: bool = False) -> dict[str, Any]:
    """Count layers, parameters, trainable parameters and GFLOPs, and log a one-line summary.

    Args:
        model: the model (a DDP or DataParallel wrapper is looked through).
        imgsz: input size the GFLOPs are counted at (batch 1), an int or (height, width).
        verbose: also log one line per parameter tensor: index, name, whether it is
            trained, size, shape, mean and standard deviation.

    Returns:
        A dict with "layers", "parameters", "gradients" (trainable parameters), "gflops"
        (thop's 2 x MACs, FlopCounterMode's without thop; None when it could not be
        counted, with a warning), "counter" (which one) and "summary" (the logged line).

    Examples:
        >>> info = model_info(nn.Sequential(nn.Linear(4, 3), nn.ReLU()))
        >>> info["layers"], info["parameters"], info["gradients"]
        (3, 15, 15)
    """
    model = de_parallel(model)
    parameters = sum(p.numel() for p in model.parameters())
    gradients = sum(p.numel() for p in model.parameters() if p.requires_grad)
    layers = len(list(model.modules()))
    if verbose:
        LOGGER.info(parameter_table(model))
    try:
        report = flops(model, imgsz)
        gflops, counter = report.gflops, report.counter
    except Exception as e:
        LOGGER.warning(f"model_info: GFLOPs not counted: {type(e).__name__}: {e}")
        gflops, counter = None, None
    size = "x".join(map(str, _image_size(imgsz)))
    gflops_text = f"{gflops:.1f} GFLOPs at {size} ({counter})" if gflops is not None else "GFLOPs unknown"
    name = type(model).__name__
    summary = f"{name} summary: {layers} layers, {parameters:,} parameters, {gradients:,} gradients, {gflops_text}"
    LOGGER.info(summary)
    return {
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


def parse_devices(device: str | int | torch.device | Sequence[str | int | torch.device] | None) -> list[torch.device]:
    """Turn "cpu,0", "0,1", ["cpu", "cuda:1"] or a torch.device into a list of devices that are here.

    Unlike :func:`ddp_utils.device.select_device` this binds nothing (no CUDA_VISIBLE_DEVICES):
    it names the devices to profile on, by their current numbers. A device may repeat.

    Raises:
        ValueError: a name is malformed or the device is not there (the message lists what is).

    Examples:
        >>> parse_devices("cpu,cpu")
        [device(type='cpu'), device(type='cpu')]
    """
    if device is None or device == "":
        names = ["cuda:0" if torch.cuda.is_available() else "cpu"]
    elif isinstance(device, (str, int, torch.device)):
        names = [s.strip() for s in str(device).split(",") if s.strip()]
    else:
        names = [str(d).strip() for d in device]
    here = available_devices()
    devices = []
    for name in names:
        canonical = f"cuda:{name}" if name.isdigit() else name.lower()
        try:
            dev = torch.device(canonical)
        except RuntimeError:
            raise ValueError(f"device {name!r} in {device!r} is not valid: use cpu, mps, 0 or cuda:0") from None
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", 0)
        if str(dev) not in here:
            raise ValueError(f"device {name!r} in {device!r} is not there; devices here: {', '.join(here)}")
        devices.append(dev)
    if not devices:
        raise ValueError(f"device {device!r} names no device")
    return devices


def _inputs_list(input: Input, op: Any) -> list[torch.Tensor | tuple[int, ...]]:
    """Each input to profile: a tensor, or a shape to fill at random later."""
    if isinstance(input, torch.Tensor):
        return [input]
    if isinstance(input, int):
        return [tuple(example_input(op, input).shape) if isinstance(op, nn.Module) else (1, 3, input, input)]
    if isinstance(input, tuple) and all(isinstance(s, int) for s in input):
        return [tuple(input)]
    if isinstance(input, (list, tuple)) and input:
        return [x for item in input for x in _inputs_list(item, op)]
    raise ValueError(f"input {input!r}: give a tensor, an image size (int), a shape (tuple of ints) or a list of these")


def _op_name(op: Any) -> str:
    if isinstance(op, nn.Module):
        return type(de_parallel(op)).__name__
    return getattr(op, "__name__", type(op).__name__)


def _on_device(x: torch.Tensor | tuple[int, ...], device: torch.device, dtype: torch.dtype | None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        x = torch.rand(x)
    requires_grad = x.requires_grad
    x = x.detach().to(device)
    if dtype is not None and x.is_floating_point():
        x = x.to(dtype)
    return x.requires_grad_(requires_grad)


def _time_op(fn: Callable, x: torch.Tensor, n: int, device: torch.device, warmup: int = 2) -> dict[str, Any]:
    forward_s, backward_s = [], []
    params = list(fn.parameters()) if isinstance(fn, nn.Module) else []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for i in range(warmup + n):
        for p in params:
            p.grad = None
        t0 = time_synchronized(device)
        y = fn(x)
        t1 = time_synchronized(device)
        outputs = [t for t in _tensors(y) if t.requires_grad]
        if outputs:
            sum(t.float().sum() for t in outputs).backward()
            t2 = time_synchronized(device)
            if i >= warmup:
                backward_s.append(t2 - t1)
        if i >= warmup:
            forward_s.append(t1 - t0)
    memory = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None
    return {
        "forward_ms": statistics.median(forward_s) * 1e3,
        "backward_ms": statistics.median(backward_s) * 1e3 if backward_s else None,
        "memory_gb": memory,
        "output_shape": _shape_of(y),
    }


def profile(
    input: Input,
    ops: nn.Module | Callable | Sequence[nn.Module | Callable],
    n: int = 10,
    device: str | int | torch.device | Sequence[str | int | torch.device] | None = None,
) -> list[dict[str, Any]]:
    """Time forward and backward of each op on each input and device; count parameters and FLOPs.

    Each module is deep-copied to each device, so the caller's op keeps its device, mode
    and gradients. Times are the median of ``n`` runs after two warm-up runs, each measured
    with :func:`ddp_utils.device.time_synchronized`. Backward runs on the sum of the outputs
    that require grad (so it is None for an op without parameters on an input without grad).

    Args:
        input: a tensor, an image size (int: a batch-1 image with the op's input channels),
            a shape (tuple of ints), or a list of these: one row each.
        ops: an nn.Module or callable, or a list of them.
        n: timed repeats per row.
        device: "cpu", "0", "cpu,0", ["cpu", "cuda:1"], a torch.device, or None for the
            first GPU if any, else the CPU. One row per device per op per input.

    Returns:
        One dict per row: op, device, parameters, gflops (per forward, thop's 2 x MACs, else
        FlopCounterMode's), flops_counter, memory_gb (peak CUDA memory allocated during
        the runs, weights included; None off CUDA), forward_ms, backward_ms, input_shape,
        output_shape, error (None, or why the op failed there).

    Examples:
        >>> rows = profile(torch.rand(2, 8), nn.Linear(8, 4), n=2, device="cpu")
        >>> rows[0]["output_shape"], rows[0]["parameters"], rows[0]["forward_ms"] > 0
        ((2, 4), 36, True)
    """
    if n < 1:
        raise ValueError(f"n={n!r}: time at least one run")
    devices = parse_devices(device)
    ops = list(ops) if isinstance(ops, (list, tuple)) else [ops]
    rows = []
    for op in ops:
        op = de_parallel(op) if isinstance(op, nn.Module) else op
        for x in _inputs_list(input, op):
            gflops, counter, counted = None, None, False
            for dev in devices:
                fn = copy.deepcopy(op).to(dev) if isinstance(op, nn.Module) else op
                dtype = _param_device_dtype(fn)[1] if isinstance(fn, nn.Module) else None
                xd = _on_device(x, dev, dtype)
                row = {
                    "op": _op_name(op),
                    "device": str(dev),
                    "parameters": sum(p.numel() for p in fn.parameters()) if isinstance(fn, nn.Module) else 0,
                    "gflops": None,
                    "flops_counter": None,
                    "memory_gb": None,
                    "forward_ms": None,
                    "backward_ms": None,
                    "input_shape": tuple(xd.shape),
                    "output_shape": None,
                    "error": None,
                }
                if not counted:
                    gflops, counter = _row_flops(fn, xd)
                    counted = True
                row.update(gflops=gflops, flops_counter=counter)
                try:
                    row.update(_time_op(fn, xd, n, dev))
                except Exception as e:  # one op failing (e.g. out of memory) still gives the other rows
                    row["error"] = f"{type(e).__name__}: {e}"
                    LOGGER.warning(f"profile: {row['op']} on {dev} with input {row['input_shape']}: {row['error']}")
                rows.append(row)
                del fn, xd
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
    return rows


def _row_flops(fn: nn.Module | Callable, x: torch.Tensor) -> tuple[float | None, str | None]:
    """GFLOPs of one call and the counter that gave them; None (with a warning) when none could."""
    try:
        if isinstance(fn, nn.Module):
            report = flops(fn, inputs=x.detach())
            return report.gflops, report.counter
        total, _, _ = _torch_count(fn, (x.detach(),))
        return total / 1e9, "FlopCounterMode"
    except Exception as e:  # the timing is still worth having
        LOGGER.warning(f"profile: FLOPs of {_op_name(fn)} not counted: {type(e).__name__}: {e}")
        return None, None


def gather_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every rank's profile rows, each tagged with its "rank"; on every rank, in rank order.

    Without a process group the rows come back tagged with this process's rank (-1 alone).

    Examples:
        >>> gather_rows([{"op": "Linear"}])
        [{'rank': -1, 'op': 'Linear'}]
    """
    if not is_dist_initialized():
        rank = dist_info().rank
        return [{"rank": rank, **row} for row in rows]
    gathered = all_gather_object(rows)
    return [{"rank": rank, **row} for rank, rank_rows in enumerate(gathered) for row in rank_rows]


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, fmt)
    return str(value)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows of :func:`profile` (or :func:`gather_rows`) as an aligned text table with notes.

    Examples:
        >>> rows = profile(torch.rand(1, 4), nn.Linear(4, 2), n=1, device="cpu")
        >>> format_table(rows).splitlines()[0].split()[:3]
        ['op', 'device', 'params']
    """
    columns = [
        ("rank", "rank", ""),
        ("op", "op", ""),
        ("device", "device", ""),
        ("parameters", "params", ""),
        ("gflops", "GFLOPs", ".4g"),
        ("memory_gb", "mem(GB)", ".3f"),
        ("forward_ms", "forward(ms)", ".3f"),
        ("backward_ms", "backward(ms)", ".3f"),
        ("input_shape", "input", ""),
        ("output_shape", "output", ""),
    ]
    columns = [c for c in columns if any(c[0] in row for row in rows)]
    cells = [[title for _, title, _ in columns]]
    cells += [[_cell(row.get(key), fmt) for key, _, fmt in columns] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in cells]
    conventions = {"thop": THOP_CONVENTION, "FlopCounterMode": TORCH_CONVENTION}
    counters = sorted({row.get("flops_counter") for row in rows} & set(conventions))
    if counters:
        lines.append("GFLOPs per forward pass by " + "; ".join(conventions[c] for c in counters))
    if any(row.get("memory_gb") is None and not str(row.get("device", "")).startswith("cuda") for row in rows):
        lines.append(CPU_MEMORY_NOTE)
    lines += [f"error: {row['op']} on {row['device']}: {row['error']}" for row in rows if row.get("error")]
    return "\n".join(lines)
