"""Collectives that read the same with or without a process group, over any group.

Each is a no-op, or returns the single-process answer, when no group exists. Each takes a
``group`` (None: the default group; a group from ``torch.distributed.new_group``, which only its
members may use) and ranks are global ranks, as in torch. Tensors go to the group's collective
device (the bound GPU under NCCL, the CPU under gloo) and come back on the caller's device.

The tensor collectives take ``async_op``: they return a :class:`Pending` at once, whose
:meth:`Pending.wait` finishes the collective and returns what the blocking call would have, so
the caller can start one, go on with its work, and read the answer later (the preemption poll
reads its flags one training step later: :func:`all_reduce` of a host tensor over a gloo group).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Generic, TypeVar

import torch
import torch.distributed as dist

from .group import collective_device, is_dist_initialized, is_main_process

T = TypeVar("T")

_REDUCE_OPS = ("mean", "sum", "max", "min")
_TORCH_OPS = {"mean": "SUM", "sum": "SUM", "max": "MAX", "min": "MIN"}


class Pending(Generic[T]):
    """A collective started with ``async_op=True``.

    Until :meth:`wait` returns, the tensors given to the collective must be left alone. Without a
    process group the answer is there at once and :meth:`wait` just returns it.

    Examples:
        >>> pending = reduce_tensor(torch.tensor([1.0, 2.0]), op="sum", async_op=True)  # single process
        >>> pending.is_completed(), pending.wait()
        (True, tensor([1., 2.]))
    """

    def __init__(self, work: Any, finish: Callable[[], T]) -> None:
        self._work, self._finish = work, finish
        self._done = False
        self._result: T | None = None

    def is_completed(self) -> bool:
        """Whether :meth:`wait` would return without blocking on the network."""
        return self._done or self._work is None or bool(self._work.is_completed())

    def wait(self) -> T:
        """Block until the collective is done (on NCCL: until the current stream has it queued); its result."""
        if not self._done:
            if self._work is not None:
                self._work.wait()
            self._result, self._done = self._finish(), True
            self._work = None
        return self._result  # type: ignore[return-value]


def _in_group(group: Any, what: str) -> int:
    """The group's size; a clear error on a rank outside it (torch would only warn and do nothing)."""
    if group is not None and group != dist.group.WORLD and dist.get_rank(group) < 0:
        raise ValueError(f"{what}: rank {dist.get_rank()} is not in the group it was given")
    return dist.get_world_size(group)


def _check_op(op: str) -> None:
    if op not in _REDUCE_OPS:
        raise ValueError(f"op={op!r}: choose one of {_REDUCE_OPS}")


def _done(result: T, async_op: bool) -> T | Pending[T]:
    return Pending(None, lambda: result) if async_op else result


def all_reduce(tensor: torch.Tensor, op: str = "sum", group: Any = None, async_op: bool = False) -> Any:
    """Reduce ``tensor`` over the ranks of ``group`` in place, as ``torch.distributed.all_reduce`` (and mmengine's).

    The tensor must already be where the group's collectives run (:func:`collective_device`): a host
    tensor for a gloo group, the bound GPU's under NCCL. A host tensor made with ``torch.from_numpy``
    can then be read after :meth:`Pending.wait` through its NumPy array, with no tensor op at all.

    Args:
        tensor: reduced in place.
        op: "sum", "mean", "max" or "min" ("mean" needs a floating-point tensor).
        group: the process group; None for the default one.
        async_op: return a :class:`Pending` at once instead of blocking.

    Returns:
        ``tensor`` (or a :class:`Pending` whose ``wait()`` returns it, reduced).

    Raises:
        ValueError: an unknown op, "mean" of an integer tensor, a tensor on another device than the
            group's, or a rank that is not in ``group``.

    Examples:
        >>> import numpy as np
        >>> flags = np.zeros(2, dtype=np.float32)
        >>> pending = all_reduce(torch.from_numpy(flags), op="max", async_op=True)  # single process
        >>> _ = pending.wait(); flags
        array([0., 0.], dtype=float32)
    """
    _check_op(op)
    if op == "mean" and not tensor.is_floating_point():
        raise ValueError(f"all_reduce(op='mean') of a {tensor.dtype} tensor: reduce_tensor() gives a float mean")
    if not is_dist_initialized():
        return _done(tensor, async_op)
    size = _in_group(group, "all_reduce")
    device = collective_device(group)
    if tensor.device != device:
        raise ValueError(f"all_reduce: the tensor is on {tensor.device}, the group's collectives run on {device}")
    work = dist.all_reduce(tensor, op=getattr(dist.ReduceOp, _TORCH_OPS[op]), group=group, async_op=async_op)

    def finish() -> torch.Tensor:
        return tensor.div_(size) if op == "mean" else tensor

    return Pending(work, finish) if async_op else finish()


def reduce_tensor(
    tensor: torch.Tensor, op: str = "mean", dst: int | None = None, group: Any = None, async_op: bool = False
) -> Any:
    """Reduce a tensor over the ranks of ``group`` and return the result as a new tensor.

    Args:
        tensor: the local value; it is not modified.
        op: "mean", "sum", "max" or "min".
        dst: None all-reduces (every rank gets the result); a global rank reduces to that rank
            only, and the other ranks get their own value back unchanged.
        group: the process group; None for the default one.
        async_op: return a :class:`Pending` at once; its ``wait()`` returns the reduced tensor.

    Returns:
        The reduced tensor, on the input's device and dtype (an integer mean: float64), or a :class:`Pending`.

    Raises:
        ValueError: an unknown op, or a rank that is not in ``group``.

    Examples:
        >>> import torch
        >>> reduce_tensor(torch.tensor([1.0, 3.0]), op="mean")  # single process
        tensor([1., 3.])
    """
    _check_op(op)
    if not is_dist_initialized():
        return _done(tensor.detach().clone(), async_op)
    size = _in_group(group, "reduce_tensor")
    # a fresh buffer: gloo's reduce leaves partial sums in the non-destination ranks' buffers
    work = tensor.detach().to(collective_device(group), copy=True)
    if op == "mean" and not work.is_floating_point():
        work = work.double()
    red = getattr(dist.ReduceOp, _TORCH_OPS[op])
    if dst is None:
        handle = dist.all_reduce(work, op=red, group=group, async_op=async_op)
    else:
        handle = dist.reduce(work, dst=dst, op=red, group=group, async_op=async_op)

    def finish() -> torch.Tensor:
        if dst is not None and dist.get_rank() != dst:
            return tensor.detach().clone()
        out = work / size if op == "mean" else work
        return out.to(tensor.device, tensor.dtype if tensor.is_floating_point() else out.dtype)

    return Pending(handle, finish) if async_op else finish()


def reduce_dict(
    values: Mapping[str, Any], op: str = "mean", dst: int | None = None, group: Any = None
) -> dict[str, torch.Tensor]:
    """Reduce a dict of scalars or same-shaped tensors over the ranks of ``group``, key by key.

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
    reduced = reduce_tensor(stacked, op=op, dst=dst, group=group)
    return dict(zip(keys, reduced.unbind(0)))


def any_rank(flag: bool, group: Any = None, async_op: bool = False) -> Any:
    """True on every rank when ``flag`` is true on any rank of ``group``; ``flag`` itself without a group.

    Every rank of the group must call it at the same point: it is one collective. Use it where one
    rank's news must stop them all together, such as early stopping or a preemption signal that
    reached one node only. With ``async_op`` it returns a :class:`Pending` whose ``wait()`` gives the
    answer (reading it back from the GPU under NCCL): start it, train a step, then read it.

    Examples:
        >>> any_rank(False), any_rank(True)  # single process
        (False, True)
        >>> any_rank(True, async_op=True).wait()
        True
    """
    if not is_dist_initialized():
        return _done(bool(flag), async_op)
    _in_group(group, "any_rank")
    work = torch.tensor([1 if flag else 0], dtype=torch.int32, device=collective_device(group))
    handle = dist.all_reduce(work, op=dist.ReduceOp.MAX, group=group, async_op=async_op)

    def finish() -> bool:
        return bool(work.item())

    return Pending(handle, finish) if async_op else finish()


def broadcast_object(obj: T, src: int = 0, group: Any = None) -> T:
    """Send a picklable object from global rank ``src`` to every rank of ``group`` and return it.

    Examples:
        >>> broadcast_object({"stop": False})
        {'stop': False}
    """
    if not is_dist_initialized():
        return obj
    _in_group(group, "broadcast_object")
    box = [obj if dist.get_rank() == src else None]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]  # type: ignore[return-value]


def all_gather_object(obj: T, group: Any = None) -> list[T]:
    """Gather a picklable object from every rank of ``group``, in rank order, on every rank of it.

    Examples:
        >>> all_gather_object(3)
        [3]
    """
    if not is_dist_initialized():
        return [obj]
    gathered: list[Any] = [None] * _in_group(group, "all_gather_object")
    dist.all_gather_object(gathered, obj, group=group)
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
