"""Counting the FLOPs of one forward pass, with thop and with PyTorch's FlopCounterMode.

The two counters disagree by convention, so :func:`flops` runs both and says which is which:

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode  # the base FlopCounterMode itself is built on
from torch.utils.flop_counter import FlopCounterMode

from ..distributed import de_parallel
from ..log import LOGGER
from .inputs import as_args, example_input, param_device_dtype, shape_of

THOP_CONVENTION = "thop: 2 x MACs of the layers thop has rules for (YOLOv5's GFLOPs)"
TORCH_CONVENTION = "FlopCounterMode: FLOPs of matmul/conv/attention aten ops (2 per multiply-add)"

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


def thop_count(work: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[float, set[type]]:
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


def torch_count(work: nn.Module | Callable, args: tuple[torch.Tensor, ...]) -> tuple[int, dict, dict[str, int]]:
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
    # a module shared by several parents (Conv's one SiLU) is a child under each of its names
    modules = work.named_modules(remove_duplicate=False)
    children = {name: [f"{name}.{c}" if name else c for c, _ in m.named_children()] for name, m in modules}

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
    args = as_args(inputs) if inputs is not None else (example_input(model, imgsz, batch),)
    device, _ = param_device_dtype(model)
    shape = shape_of(args[0]) if len(args) == 1 else shape_of(list(args))
    report = FlopsReport(input_shape=shape, device=str(device))
    work = copy.deepcopy(model).eval()

    module_flops = None
    try:
        total, module_flops, report.torch_uncounted = torch_count(work, args)
        report.torch_gflops = total / 1e9
    except Exception as e:  # a failed count is reported, the other counter may still serve
        report.notes.append(f"FlopCounterMode failed: {type(e).__name__}: {e}")

    try:
        macs, rules = thop_count(work, args)
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
