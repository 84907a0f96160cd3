"""How fast a model is, per op and per device: forward and backward time, peak memory, and rows by rank."""

from __future__ import annotations

import copy
import statistics
from collections.abc import Sequence
from typing import Any, Callable, Union

import torch
import torch.nn as nn

from ..device import available_devices, parse_device, time_synchronized
from ..distributed import all_gather_object, de_parallel, dist_info, is_dist_initialized
from ..log import LOGGER
from .flop_counters import flops, torch_count
from .inputs import example_input, param_device_dtype, shape_of, tensors_in

Input = Union[torch.Tensor, int, Sequence[Any]]
Devices = Union[str, int, torch.device, Sequence[Union[str, int, torch.device]], None]


def parse_devices(device: Devices) -> list[torch.device]:
    """Turn "cpu,0", "0,1", ["cpu", "cuda:1"] or a torch.device into a list of devices that are here.

    Each name is read by :func:`ddp_utils.device.parse_device`, the one parser of device
    strings. Unlike :func:`ddp_utils.device.select_device` this binds nothing (no
    CUDA_VISIBLE_DEVICES): it names the devices to profile on, by their current numbers,
    so the CPU and GPUs may be mixed and a device may repeat. None or "" means the first
    GPU if there is one, else the CPU.

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
    devices = [_one_device(name, device, here) for name in names]
    if not devices:
        raise ValueError(f"device {device!r} names no device")
    return devices


def _one_device(name: str, request: Devices, here: list[str]) -> torch.device:
    """One name of a device list as a torch.device that is here; ``request`` is the whole list, for messages."""
    try:
        parsed = parse_device(name)
        if len(parsed.indices) > 1:  # one name, one device: "0,1" inside a list is two names in one
            raise ValueError(name)
    except ValueError:
        raise ValueError(f"device {name!r} in {request!r} is not valid: use cpu, mps, 0 or cuda:0") from None
    if parsed.kind == "auto":
        parsed = parse_device("0" if torch.cuda.is_available() else "cpu")
    dev = torch.device("cuda", parsed.indices[0]) if parsed.kind == "cuda" else torch.device(parsed.kind)
    if str(dev) not in here:
        raise ValueError(f"device {name!r} in {request!r} is not there; devices here: {', '.join(here)}")
    return dev


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
        outputs = [t for t in tensors_in(y) if t.requires_grad]
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
        "output_shape": shape_of(y),
    }


def profile(
    input: Input,
    ops: nn.Module | Callable | Sequence[nn.Module | Callable],
    n: int = 10,
    device: Devices = None,
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
                dtype = param_device_dtype(fn)[1] if isinstance(fn, nn.Module) else None
                xd = _on_device(x, dev, dtype)
                row = _blank_row(op, dev, fn, xd)
                if not counted:
                    gflops, counter = _row_flops(fn, xd)
                    counted = True
                row.update(gflops=gflops, flops_counter=counter)
                _time_row(row, fn, xd, n, dev)
                rows.append(row)
                del fn, xd
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
    return rows


def _blank_row(
    op: nn.Module | Callable, dev: torch.device, fn: nn.Module | Callable, x: torch.Tensor
) -> dict[str, Any]:
    """A row with every key set before anything can fail, so a failed op's row has the same keys as the others."""
    return {
        "op": _op_name(op),
        "device": str(dev),
        "parameters": sum(p.numel() for p in fn.parameters()) if isinstance(fn, nn.Module) else 0,
        "gflops": None,
        "flops_counter": None,
        "memory_gb": None,
        "forward_ms": None,
        "backward_ms": None,
        "input_shape": tuple(x.shape),
        "output_shape": None,
        "error": None,
    }


def _time_row(row: dict[str, Any], fn: nn.Module | Callable, x: torch.Tensor, n: int, dev: torch.device) -> None:
    """Time ``fn`` into ``row``; a failure becomes the row's error, so profile's loop goes on to the next row."""
    try:
        row.update(_time_op(fn, x, n, dev))
    except Exception as e:  # one op failing (e.g. out of memory) still gives the other rows
        row["error"] = f"{type(e).__name__}: {e}"
        LOGGER.warning(f"profile: {row['op']} on {dev} with input {row['input_shape']}: {row['error']}")


def _row_flops(fn: nn.Module | Callable, x: torch.Tensor) -> tuple[float | None, str | None]:
    """GFLOPs of one call and the counter that gave them; None (with a warning) when none could."""
    try:
        if isinstance(fn, nn.Module):
            report = flops(fn, inputs=x.detach())
            return report.gflops, report.counter
        total, _, _ = torch_count(fn, (x.detach(),))
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
