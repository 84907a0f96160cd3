"""Unwrap models that DistributedDataParallel or DataParallel hold."""

from __future__ import annotations

from torch import nn

_PARALLEL_TYPES = (nn.parallel.DataParallel, nn.parallel.DistributedDataParallel)


def is_parallel(model: nn.Module) -> bool:
    """True when ``model`` is wrapped in DataParallel or DistributedDataParallel.

    Examples:
        >>> from torch import nn
        >>> is_parallel(nn.Linear(2, 2)), is_parallel(nn.DataParallel(nn.Linear(2, 2)))
        (False, True)
    """
    return isinstance(model, _PARALLEL_TYPES)


def de_parallel(model: nn.Module) -> nn.Module:
    """Return the module inside a DataParallel/DDP wrapper, or ``model`` itself.

    Examples:
        >>> from torch import nn
        >>> inner = nn.Linear(2, 2)
        >>> de_parallel(nn.DataParallel(inner)) is inner, de_parallel(inner) is inner
        (True, True)
    """
    return model.module if is_parallel(model) else model
