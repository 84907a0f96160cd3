"""Unwrapping a model from the wrappers that distributed training puts around it."""

from __future__ import annotations

import sys

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


def _is_compiled(model: nn.Module) -> bool:
    # torch.compile's wrapper lives in torch._dynamo, which a compiled model has imported
    # already; looking it up in sys.modules keeps the costly import off every other path.
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    optimized = getattr(eval_frame, "OptimizedModule", None)
    return optimized is not None and isinstance(model, optimized)


def de_parallel(model: nn.Module) -> nn.Module:
    """The bare model inside DataParallel, DistributedDataParallel and torch.compile wrappers.

    Wrappers nest in either order (``torch.compile(DDP(model))`` or ``DDP(torch.compile(model))``);
    every layer is taken off. Save and load the state dict of what this returns: its keys
    carry no ``module.`` or ``_orig_mod.`` prefix.

    Examples:
        >>> from torch import nn
        >>> inner = nn.Linear(2, 2)
        >>> de_parallel(nn.DataParallel(inner)) is inner, de_parallel(inner) is inner
        (True, True)
    """
    while True:
        if is_parallel(model):
            model = model.module
        elif _is_compiled(model):
            model = model._orig_mod
        else:
            return model
