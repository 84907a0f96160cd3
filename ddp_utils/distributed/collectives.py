"""Collectives that read the same with or without a process group.

Each is a no-op, or returns the single-process answer, when no group exists. Tensors go
to the group's collective device (the bound GPU under NCCL, the CPU under gloo) and come
back on the caller's device.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

from .group import collective_device, is_dist_initialized, is_main_process

T = TypeVar("T")

_REDUCE_OPS = ("mean", "sum", "max", "min")


def reduce_tensor(tensor: torch.Tensor, op: str = "mean", dst: int | None = None) -> torch.Tensor:
    """Reduce a tensor over all ranks and return the result as a new tensor.

    Args:
        tensor: the local value; it is not modified.
        op: "mean", "sum", "max" or "min".
        dst: None all-reduces (every rank gets the result); an int reduces to that
            rank only, and the other ranks get their own value back unchanged.

    Returns:
        The reduced tensor, on the input's device and dtype.

    Examples:
        >>> import torch
        >>> reduce_tensor(torch.tensor([1.0, 3.0]), op="mean")  # single process
        tensor([1., 3.])
    """
    if op not in _REDUCE_OPS:
        raise ValueError(f"op={op!r}: choose one of {_REDUCE_OPS}")
    if not is_dist_initialized():
        return tensor.detach().clone()
    # a fresh buffer: gloo's reduce leaves partial sums in the non-destination ranks' buffers
    work = tensor.detach().to(collective_device(), copy=True)
    if op == "mean" and not work.is_floating_point():
        work = work.double()
    red = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    if dst is None:
        dist.all_reduce(work, op=red[op])
    else:
        dist.reduce(work, dst=dst, op=red[op])
        if dist.get_rank() != dst:
            return tensor.detach().clone()
    if op == "mean":
        work = work / dist.get_world_size()
    return work.to(tensor.device, tensor.dtype if tensor.is_floating_point() else work.dtype)


def reduce_dict(values: Mapping[str, Any], op: str = "mean", dst: int | None = None) -> dict[str, torch.Tensor]:
    """Reduce a dict of scalars or same-shaped tensors over all ranks, key by key.

    Every rank must pass the same keys; they are reduced in sorted order in one
    collective.

    Examples:
        >>> out = reduce_dict({"box": 0.5, "cls": 1.0})
        >>> {k: round(float(v), 2) for k, v in out.items()}
        {'box': 0.5, 'cls': 1.0}
    """
    keys = sorted(values)
    if not keys:
        return {}
    stacked = torch.stack([torch.as_tensor(values[k], dtype=torch.float64).detach().cpu() for k in keys])
    reduced = reduce_tensor(stacked, op=op, dst=dst)
    return dict(zip(keys, reduced.unbind(0)))


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on any rank; ``flag`` itself without a group.

    Every rank must call it at the same point: it is one collective. Use it where one
    rank's news must stop them all together, such as early stopping or a preemption
    signal that reached one node only.

    Examples:
        >>> any_rank(False), any_rank(True)  # single process
        (False, True)
    """
    if not is_dist_initialized():
        return bool(flag)
    work = torch.tensor([1 if flag else 0], dtype=torch.int32, device=collective_device())
    dist.all_reduce(work, op=dist.ReduceOp.MAX)
    return bool(work.item())


def broadcast_object(obj: T, src: int = 0) -> T:
    """Send a picklable object from rank ``src`` to every rank and return it.

    Examples:
        >>> broadcast_object({"stop": False})
        {'stop': False}
    """
    if not is_dist_initialized():
        return obj
    box = [obj if dist.get_rank() == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]  # type: ignore[return-value]


def all_gather_object(obj: T) -> list[T]:
    """Gather a picklable object from every rank, in rank order, on every rank.

    Examples:
        >>> all_gather_object(3)
        [3]
    """
    if not is_dist_initialized():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def rank_zero_only(fn: Callable[..., T]) -> Callable[..., T | None]:
    """Decorate a function so that it runs on global rank 0 (or a single process) only.

    Examples:
        >>> @rank_zero_only
        ... def save(): return "saved"
        >>> save()
        'saved'
    """

    def wrapper(*args: Any, **kwargs: Any) -> T | None:
        return fn(*args, **kwargs) if is_main_process() else None

    wrapper.__name__ = getattr(fn, "__name__", "wrapper")
    wrapper.__doc__ = fn.__doc__
    return wrapper
