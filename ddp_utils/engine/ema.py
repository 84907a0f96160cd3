"""An exponential moving average of a model's weights, the copy that gets evaluated and saved."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

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

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pairs": None}  # a copy pairs afresh with its own tensors

    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000, updates: int = 0) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"ModelEMA decay={decay}: must be in [0, 1)")
        if tau <= 0:
            raise ValueError(f"ModelEMA tau={tau}: must be > 0")
        self.ema = copy.deepcopy(de_parallel(model)).float().eval()
        for p in self.ema.parameters():
            p.requires_grad_(False)
        self.updates = int(updates)
        self._pairs: _Pairs | None = None
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
        copied by one ``torch._foreach_copy_``. The model's tensors are paired with the EMA's once
        (by state-dict name) and the pairing is only checked afterwards (an identity test per
        entry), so an update costs no ``state_dict()``. Nothing here waits for the device: the
        decay is a host float from the counter.
        """
        self.updates += 1
        d = self.decay()
        pairs = self._pairs_for(de_parallel(model))
        if pairs.ema_float:
            source = pairs.source_float
            if pairs.cast:  # a half model: its values in the EMA's dtype and device
                source = [s.to(e.device, e.dtype) for s, e in zip(source, pairs.ema_float)]
            torch._foreach_mul_(pairs.ema_float, d)
            torch._foreach_add_(pairs.ema_float, source, alpha=1.0 - d)
        if pairs.ema_other:
            torch._foreach_copy_(pairs.ema_other, pairs.source_other)

    def _pairs_for(self, model: nn.Module) -> _Pairs:
        """The pairing of ``model``'s entries with the EMA's, made at the first update and when they changed."""
        pairs = self._pairs
        if pairs is None or pairs.model is not model or not pairs.current():
            pairs = self._pairs = _pair_state(self.ema, model)
        return pairs

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


def _state_entries(module: nn.Module, prefix: str = "") -> Iterator[tuple[dict, str, str]]:
    """``(owner dict, key, state-dict name)`` of every entry ``module.state_dict()`` would list, in its order."""
    for key, param in module._parameters.items():
        if param is not None:
            yield module._parameters, key, prefix + key
    for key, buf in module._buffers.items():
        if buf is not None and key not in module._non_persistent_buffers_set:
            yield module._buffers, key, prefix + key
    for key, child in module._modules.items():
        if child is not None:
            yield from _state_entries(child, f"{prefix}{key}.")


@dataclass
class _Pairs:
    """The EMA's tensors and the model's matching ones, split into floating-point and other."""

    model: nn.Module
    ema_float: list[torch.Tensor] = field(default_factory=list)
    source_float: list[torch.Tensor] = field(default_factory=list)
    ema_other: list[torch.Tensor] = field(default_factory=list)
    source_other: list[torch.Tensor] = field(default_factory=list)
    cast: bool = False
    entries: list[tuple[dict, str, torch.Tensor]] = field(default_factory=list)

    def current(self) -> bool:
        """True while every paired tensor is still the one its module holds (``.to()`` replaces buffers)."""
        return all(owner.get(key) is tensor for owner, key, tensor in self.entries)


def _pair_state(ema: nn.Module, model: nn.Module) -> _Pairs:
    """Pair the EMA's state entries with ``model``'s by name, checking names and shapes."""
    current = {name: (owner, key) for owner, key, name in _state_entries(model)}
    pairs = _Pairs(model)
    for ema_owner, ema_key, name in _state_entries(ema):
        value = ema_owner[ema_key]
        if name not in current:
            raise KeyError(f"ModelEMA.update: the model has no entry {name!r}; was its architecture changed?")
        owner, key = current[name]
        source = owner[key]
        if source.shape != value.shape:
            raise ValueError(
                f"ModelEMA.update: {name!r} has shape {tuple(source.shape)} in the model but "
                f"{tuple(value.shape)} in the EMA; was its architecture changed?"
            )
        pairs.entries += [(owner, key, source), (ema_owner, ema_key, value)]
        if value.is_floating_point():
            pairs.ema_float.append(value.detach())
            pairs.source_float.append(source.detach())
            pairs.cast = pairs.cast or source.dtype != value.dtype or source.device != value.device
        else:
            pairs.ema_other.append(value)
            pairs.source_other.append(source)
    return pairs
