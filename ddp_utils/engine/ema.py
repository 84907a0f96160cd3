"""An exponential moving average of a model's weights, the copy that gets evaluated and saved."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

from ..distributed import is_dist_initialized
from ..distributed.parallel import de_parallel


class ModelEMA:
    """Keep a moving average of a model's floating-point state (parameters and buffers).

    The average lives in ``self.ema``: an fp32, eval-mode, gradient-free copy of the
    unwrapped model. Its decay ramps up from 0 as ``decay * (1 - exp(-updates / tau))``
    so the first few hundred updates, when the model changes fast, are not averaged
    against the random initialisation. Integer buffers (BatchNorm's
    ``num_batches_tracked``) are copied, not averaged.

    A checkpoint stores ``ema.ema.state_dict()`` and ``ema.updates``; pass ``updates``
    back on resume so the ramp continues where it stopped.

    Args:
        model: the model to follow; DataParallel/DDP wrappers are looked through.
        decay: the decay the ramp approaches.
        tau: ramp time constant in updates (the decay reaches 63% of ``decay`` after ``tau``).
        updates: updates already done (from a checkpoint).

    Examples:
        >>> from torch import nn
        >>> model = nn.Linear(2, 1)
        >>> ema = ModelEMA(model)
        >>> ema.update(model)
        >>> ema.updates, ema.ema.training, ema.ema.weight.requires_grad
        (1, False, False)
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000, updates: int = 0) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"ModelEMA decay={decay}: must be in [0, 1)")
        if tau <= 0:
            raise ValueError(f"ModelEMA tau={tau}: must be > 0")
        self.ema = copy.deepcopy(de_parallel(model)).float().eval()
        for p in self.ema.parameters():
            p.requires_grad_(False)
        self.updates = int(updates)
        self.decay_max = float(decay)
        self.tau = float(tau)

    def decay(self, updates: int | None = None) -> float:
        """The decay used at update number ``updates`` (default: the current count).

        Examples:
            >>> ema = ModelEMA(torch.nn.Linear(1, 1), decay=0.9, tau=1)
            >>> round(ema.decay(0), 3), round(ema.decay(100), 3)
            (0.0, 0.9)
        """
        n = self.updates if updates is None else updates
        return self.decay_max * (1.0 - math.exp(-n / self.tau))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the average one step towards ``model``'s current state (call after each optimizer step).

        The floating-point entries are averaged by two multi-tensor kernels
        (``torch._foreach_mul_`` and ``torch._foreach_add_``: the same arithmetic, in the same
        order, as one ``mul_``/``add_`` per tensor, hence the same numbers), integer buffers are
        copied. Nothing here waits for the device: the decay is a host float from the counter.
        """
        self.updates += 1
        d = self.decay()
        ema_float, source_float, ema_other, source_other = self._paired_state(de_parallel(model))
        if ema_float:
            torch._foreach_mul_(ema_float, d)
            torch._foreach_add_(ema_float, source_float, alpha=1.0 - d)
        for value, source in zip(ema_other, source_other):
            value.copy_(source)

    def _paired_state(self, model: nn.Module) -> tuple[list, list, list, list]:
        """The EMA's entries and the model's matching ones, split into floating-point and other."""
        current = model.state_dict()
        ema_float, source_float, ema_other, source_other = [], [], [], []
        for name, value in self.ema.state_dict().items():
            if name not in current:
                raise KeyError(f"ModelEMA.update: the model has no entry {name!r}; was its architecture changed?")
            source = current[name].detach()
            if source.shape != value.shape:
                raise ValueError(
                    f"ModelEMA.update: {name!r} has shape {tuple(source.shape)} in the model but "
                    f"{tuple(value.shape)} in the EMA; was its architecture changed?"
                )
            if value.is_floating_point():
                ema_float.append(value)
                # a no-op for an fp32 model on the EMA's device; a cast for a half model
                source_float.append(source.to(value.device, value.dtype))
            else:
                ema_other.append(value)
                source_other.append(source)
        return ema_float, source_float, ema_other, source_other

    @torch.no_grad()
    def sync(self, src: int = 0) -> None:
        """Make every rank's EMA equal to rank ``src``'s (a collective; a no-op without a process group).

        DDP keeps the parameters equal on every rank, but BatchNorm running statistics are
        updated from each rank's own batches, so the EMAs drift apart slightly. Call this
        before a distributed evaluation so every rank evaluates the weights rank 0 saves.
        """
        if not is_dist_initialized():
            return
        for value in self.ema.state_dict().values():
            dist.broadcast(value, src=src)

    def update_attr(
        self, model: nn.Module, include: Iterable[str] = (), exclude: Iterable[str] = ("process_group", "reducer")
    ) -> None:
        """Copy plain attributes (e.g. ``nc``, ``names``, ``hyp``, ``stride``) from ``model`` to the EMA copy.

        Args:
            model: the (possibly wrapped) model to copy from.
            include: attribute names to copy; empty copies every public attribute that is not a
                submodule, parameter or buffer.
            exclude: names never copied.

        Examples:
            >>> model = torch.nn.Linear(1, 1)
            >>> ema = ModelEMA(model)
            >>> model.names = ["cat"]
            >>> ema.update_attr(model, include=["names"])
            >>> ema.ema.names
            ['cat']
        """
        source = de_parallel(model)
        include, exclude = tuple(include), tuple(exclude)
        for name, value in vars(source).items():
            if (include and name not in include) or name.startswith("_") or name in exclude:
                continue
            if name == "training":
                continue
            setattr(self.ema, name, value)
