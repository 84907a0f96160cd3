"""BatchNorm across ranks on any backend (``--sync-bn``): batch statistics of the whole global batch.

On CUDA under NCCL, :func:`convert_sync_batchnorm` gives torch's :class:`torch.nn.SyncBatchNorm`.
Elsewhere (the CPU under gloo, or a GPU under gloo) it gives :class:`GroupBatchNorm`: each
rank sums its per-channel values, squares and count, one autograd-aware all-reduce
(``torch.distributed.nn.functional.all_reduce``) adds them over the group, and every rank
normalises with the statistics of the whole global batch; nothing is read back to the host (on
a GPU the step never waits here, where torch's SyncBatchNorm masks its gathered counts, a host
wait in every layer's forward). Because the all-reduce is part of
the graph, the backward pass carries the gradients of the shared mean and variance back to
every rank, so N ranks x B images compute what one process computes with N x B images.

The modules keep BatchNorm's parameters and buffers under BatchNorm's names, so a checkpoint
of a converted model loads into a plain one and back; :func:`revert_sync_batchnorm` undoes
the conversion.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .group import is_dist_initialized

_PLAIN = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
_DIMS = {nn.BatchNorm1d: 1, nn.BatchNorm2d: 2, nn.BatchNorm3d: 3}


class GroupBatchNorm(_BatchNorm):
    """BatchNorm whose training statistics are those of the whole group's batch, on any backend.

    In training with a process group of more than one rank, the per-channel sum, sum of
    squares and count are all-reduced (in float64, so that ``E[x^2] - E[x]^2`` keeps its
    digits) and every rank normalises with the group's mean and biased variance; the running
    statistics follow BatchNorm's rule (``momentum``, or the cumulative mean when it is None,
    with the unbiased variance) from the group's statistics, so they stay the same on every
    rank. In eval mode, without a group, or in a group of one, it is the plain BatchNorm.

    No value goes back to the host (a GPU never waits for it): the group's count is not checked as
    BatchNorm checks its own; a group batch of at most one value per channel (only possible when some
    ranks have empty batches) normalises with variance 0 and leaves the running statistics unchanged.

    Args:
        num_features: channels.
        eps: as :class:`torch.nn.BatchNorm2d`.
        momentum: as :class:`torch.nn.BatchNorm2d`.
        affine: as :class:`torch.nn.BatchNorm2d`.
        track_running_stats: as :class:`torch.nn.BatchNorm2d`.
        process_group: the group to share statistics with; None: the default group.
        spatial_dims: 1, 2 or 3: the plain BatchNorm it stands for (what :func:`revert_sync_batchnorm` gives).

    Examples:
        >>> bn = GroupBatchNorm(3)
        >>> x = torch.randn(4, 3, 5, 5)
        >>> plain = nn.BatchNorm2d(3)
        >>> torch.allclose(bn(x), plain(x)) and torch.allclose(bn.running_var, plain.running_var)
        True
        >>> sorted(bn.state_dict()) == sorted(plain.state_dict())
        True
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: dist.ProcessGroup | None = None,
        spatial_dims: int = 2,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_group = process_group
        self.spatial_dims = spatial_dims

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least a 2D input (batch, channels, ...), got {x.dim()}D")

    def _group_size(self) -> int:
        if not is_dist_initialized():
            return 1
        return dist.get_world_size(self.process_group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` [N, C, ...] with the group's batch statistics (training) or the running ones."""
        if not self.training or self._group_size() == 1:
            return super().forward(x)
        self._check_input_dim(x)
        return self._group_forward(x)

    def _group_forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed.nn.functional import all_reduce  # autograd-aware: its backward all-reduces too

        channels = x.shape[1]
        dims = [0, *range(2, x.dim())]
        local_count = x.new_full((1,), x.numel() // channels, dtype=torch.float64)
        stats = torch.cat((x.sum(dims, dtype=torch.float64), (x * x).sum(dims, dtype=torch.float64), local_count))
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        with warnings.catch_warnings():  # torch 2.5+ calls it deprecated; its successor has no autograd on gloo
            warnings.filterwarnings("ignore", "torch.distributed.nn.functional.all_reduce", FutureWarning)
            stats = all_reduce(stats, op=dist.ReduceOp.SUM, group=group)
        total, squares, count = stats[:channels], stats[channels : 2 * channels], stats[-1]
        # the group's count stays on the device: reading it to check BatchNorm's "more than 1 value"
        # would make the host wait for the GPU at every layer. Every rank knows its own count, and with
        # two ranks or more a group batch of one value per channel needs an empty batch on some rank.
        mean = total / count.clamp(min=1)
        var = (squares / count.clamp(min=1) - mean * mean).clamp(min=0)  # biased, as BatchNorm normalises with
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), count.detach())
        shape = [1, channels] + [1] * (x.dim() - 2)
        invstd = torch.rsqrt(var + self.eps)
        y = (x - mean.to(x.dtype).view(shape)) * invstd.to(x.dtype).view(shape)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y

    @torch.no_grad()
    def _update_running_stats(self, mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor) -> None:
        """BatchNorm's rule, with no value read back to the host (the cumulative factor stays a tensor).

        A group batch of at most one value per channel (possible only with empty batches on some ranks)
        leaves the running statistics as they were: BatchNorm would raise, which needs the count on the host.
        """
        self.num_batches_tracked.add_(1)
        if self.momentum is None:  # the cumulative mean: 1 / batches so far, computed on the device
            factor: torch.Tensor | float = 1.0 / self.num_batches_tracked.to(torch.float64)
        else:
            factor = self.momentum
        unbiased = var * count / (count - 1).clamp(min=1)
        valid = count > 1
        for buffer, value in ((self.running_mean, mean), (self.running_var, unbiased)):
            updated = buffer * (1 - factor) + value * factor
            buffer.copy_(torch.where(valid, updated, buffer))


def _spatial_dims(bn: _BatchNorm) -> int:
    return getattr(bn, "spatial_dims", None) or _DIMS.get(type(bn), 2)


def _copy_state(src: _BatchNorm, dst: _BatchNorm) -> _BatchNorm:
    """``dst`` takes ``src``'s parameters and buffers (the same tensors, as torch's converter does)."""
    if src.affine:
        with torch.no_grad():
            dst.weight = src.weight
            dst.bias = src.bias
    dst.running_mean = src.running_mean
    dst.running_var = src.running_var
    dst.num_batches_tracked = src.num_batches_tracked
    dst.training = src.training
    if hasattr(src, "qconfig"):
        dst.qconfig = src.qconfig
    return dst


def _use_torch_sync(bn: _BatchNorm, process_group: dist.ProcessGroup | None) -> bool:
    """torch's SyncBatchNorm where it works: CUDA tensors under NCCL (or CUDA before any group exists)."""
    on_cuda = any(t.is_cuda for t in [*bn.parameters(recurse=False), *bn.buffers(recurse=False)])
    if not on_cuda:
        return False
    return not is_dist_initialized() or dist.get_backend(process_group) == "nccl"


def convert_sync_batchnorm(module: nn.Module, process_group: dist.ProcessGroup | None = None) -> nn.Module:
    """Every BatchNorm layer of ``module`` made synchronised across ranks, picking the kind by device and backend.

    CUDA layers under NCCL become :class:`torch.nn.SyncBatchNorm`; all others (the CPU, gloo)
    :class:`GroupBatchNorm`. Parameters and buffers are shared with the originals, as in
    torch's ``convert_sync_batchnorm``; the state_dict keys do not change.

    Args:
        module: a model, or a BatchNorm layer itself.
        process_group: the group to synchronise over; None: the default group.

    Returns:
        ``module`` with its BatchNorm layers replaced (a new object when ``module`` is itself one).

    Examples:
        >>> model = convert_sync_batchnorm(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)))
        >>> type(model[1]).__name__, list(model.state_dict())[2:]
        ('GroupBatchNorm', ['1.weight', '1.bias', '1.running_mean', '1.running_var', '1.num_batches_tracked'])
    """
    if isinstance(module, _BatchNorm) and not isinstance(module, (nn.SyncBatchNorm, GroupBatchNorm)):
        args = (module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats)
        if _use_torch_sync(module, process_group):
            converted: _BatchNorm = nn.SyncBatchNorm(*args, process_group=process_group)
        else:
            converted = GroupBatchNorm(*args, process_group=process_group, spatial_dims=_spatial_dims(module))
        return _copy_state(module, converted)
    for name, child in module.named_children():
        new_child = convert_sync_batchnorm(child, process_group)
        if new_child is not child:
            module.add_module(name, new_child)
    return module


def revert_sync_batchnorm(module: nn.Module) -> nn.Module:
    """Undo :func:`convert_sync_batchnorm`: every synchronised BatchNorm (ours or torch's) made plain again.

    A :class:`GroupBatchNorm` becomes the BatchNorm it was converted from; torch's
    SyncBatchNorm, which does not record it, becomes :class:`torch.nn.BatchNorm2d`.
    Parameters and buffers are shared, the state_dict keys unchanged.

    Examples:
        >>> model = convert_sync_batchnorm(nn.Sequential(nn.BatchNorm1d(4)))
        >>> type(revert_sync_batchnorm(model)[0]).__name__
        'BatchNorm1d'
    """
    if isinstance(module, (nn.SyncBatchNorm, GroupBatchNorm)):
        plain = _PLAIN[_spatial_dims(module)]
        args = (module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats)
        return _copy_state(module, plain(*args))
    for name, child in module.named_children():
        new_child = revert_sync_batchnorm(child)
        if new_child is not child:
            module.add_module(name, new_child)
    return module


__all__ = ["GroupBatchNorm", "convert_sync_batchnorm", "revert_sync_batchnorm"]
