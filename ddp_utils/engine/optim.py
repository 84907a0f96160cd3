"""Optimizer, learning-rate schedule, warm-up and gradient accumulation, as YOLOv5 trains them.

Parameter groups (the order of ``optimizer.param_groups``, and of results.csv's x/lr0..2):

    0. "bias": every bias, no weight decay (warm-up starts its lr high: warmup_bias_lr)
    1. "weight": the other weights (convolutions, linear layers), with weight decay
    2. "norm": weights of normalisation layers (BatchNorm, GroupNorm, LayerNorm, ...) and
       other 1-d parameters, no weight decay
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ..log import LOGGER

OPTIMIZERS = ("SGD", "Adam", "AdamW")
NBS = 64  # nominal batch size: hyperparameters are tuned for gradients accumulated to 64 images


def _is_norm(module: nn.Module) -> bool:
    norm_types = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm, nn.modules.instancenorm._InstanceNorm)
    return isinstance(module, norm_types) or "Norm" in type(module).__name__


def param_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Split the trainable parameters into "bias", "weight" (decayed) and "norm" lists.

    Examples:
        >>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
        >>> {name: len(params) for name, params in param_groups(model).items()}
        {'bias': 2, 'weight': 1, 'norm': 1}
    """
    groups: dict[str, list[nn.Parameter]] = {"bias": [], "weight": [], "norm": []}
    seen: set[int] = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))  # shared parameters go in one group only
            if name == "bias":
                groups["bias"].append(param)
            elif _is_norm(module) or param.ndim <= 1:
                groups["norm"].append(param)
            else:
                groups["weight"].append(param)
    return groups


def smart_optimizer(
    model: nn.Module,
    name: str = "SGD",
    lr: float = 0.01,
    momentum: float = 0.937,
    decay: float = 1e-5,
    *,
    fused: bool | None = None,
) -> torch.optim.Optimizer:
    """Build an optimizer with three parameter groups: biases, decayed weights, norm weights.

    A fused optimizer updates every parameter in a few kernels and takes the GradScaler's
    scale and inf flag as device tensors (a non-fused one reads the flag back: a host wait per
    step with fp16). The choice survives ``load_state_dict`` of a checkpoint saved by another
    kind (whose groups carry their own ``fused``/``foreach`` values): a post-load hook puts this
    optimizer's back.

    Args:
        model: the model (wrappers are fine: their parameters are the model's).
        name: "SGD" (with Nesterov momentum), "Adam" or "AdamW" (case-insensitive).
        lr: initial learning rate (hyp lr0).
        momentum: SGD momentum, or Adam's beta1.
        decay: weight decay of the "weight" group (scale it with :func:`scaled_weight_decay`).
        fused: use the fused implementation; None (automatic): when the parameters are on CUDA
            (on the CPU the default multi-tensor one keeps the numbers of earlier runs).

    Returns:
        The optimizer; each group has a "name" key ("bias", "weight", "norm").

    Raises:
        ValueError: an unknown optimizer name (the message lists the choices).

    Examples:
        >>> opt = smart_optimizer(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)), "SGD", decay=5e-4)
        >>> [(g["name"], len(g["params"]), g["weight_decay"]) for g in opt.param_groups]
        [('bias', 2, 0.0), ('weight', 1, 0.0005), ('norm', 1, 0.0)]
    """
    groups = param_groups(model)
    choice = {o.lower(): o for o in OPTIMIZERS}.get(str(name).lower())
    if choice is None:
        raise ValueError(f"optimizer {name!r} is not supported: choose one of {', '.join(OPTIMIZERS)}")
    if fused is None:
        fused = any(p.is_cuda for params in groups.values() for p in params)
    optimizer = _bias_group_optimizer(choice, groups["bias"], lr, momentum, fused)
    optimizer.register_load_state_dict_post_hook(_keep_implementation)
    optimizer.add_param_group({"params": groups["weight"], "weight_decay": decay, "name": "weight"})
    optimizer.add_param_group({"params": groups["norm"], "weight_decay": 0.0, "name": "norm"})
    _zero_momentum_buffers(optimizer)
    LOGGER.info(
        f"optimizer: {choice}(lr={lr}{', fused=True' * bool(fused)}) with parameter groups "
        f"{len(groups['norm'])} norm weights (no decay), "
        f"{len(groups['weight'])} weights (decay={decay}), {len(groups['bias'])} biases (no decay)"
    )
    return optimizer


def _bias_group_optimizer(
    choice: str, biases: list[nn.Parameter], lr: float, momentum: float, fused: bool
) -> torch.optim.Optimizer:
    """The ``choice`` optimizer over its first group, the biases (no decay): the other groups are added to it."""
    first = [{"params": biases, "name": "bias"}]
    if choice == "SGD":
        return torch.optim.SGD(first, lr=lr, momentum=momentum, nesterov=True, weight_decay=0.0, fused=fused or None)
    cls = torch.optim.Adam if choice == "Adam" else torch.optim.AdamW
    return cls(first, lr=lr, betas=(momentum, 0.999), weight_decay=0.0, fused=fused or None)


def _keep_implementation(optimizer: torch.optim.Optimizer) -> None:
    """After ``load_state_dict``: each group's ``fused``/``foreach`` back to what the optimizer was built with.

    A state dict carries these per group, so a checkpoint from a non-fused run would otherwise
    turn a fused optimizer into a non-fused one (and a fused CUDA one into a CPU run's).
    """
    for group in optimizer.param_groups:
        for key in ("fused", "foreach"):
            if key in optimizer.defaults:
                group[key] = optimizer.defaults[key]
    _zero_momentum_buffers(optimizer)


def _zero_momentum_buffers(optimizer: torch.optim.Optimizer) -> None:
    """Give a fused SGD a zero momentum buffer for every parameter that has none yet.

    torch's fused SGD makes its buffers with ``empty_like`` at its first step and fills them in the
    kernel, which a ``found_inf`` step skips whole: when the first step is skipped (a GradScaler's
    first scales overflow fp16 gradients; a non-finite first step under the guard) the buffers stay
    uninitialised memory, and the next step adds it to the weights. On an H100, ``train.py --device 0``
    ended so with NaN weights after its second step. A zero buffer gives the first real step exactly
    what the first-step path computes, ``momentum * 0 + grad = grad`` (dampening 0, as YOLOv5's).
    """
    for group in optimizer.param_groups:
        if isinstance(optimizer, torch.optim.SGD) and group.get("fused") and group.get("momentum", 0) != 0:
            for p in group["params"]:
                state = optimizer.state[p]
                if state.get("momentum_buffer") is None:
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


@dataclass
class linear_lr:  # noqa: N801 - reads as the function YOLOv5 users know
    """LR factor falling linearly from 1 at epoch 0 to ``lrf`` at epoch ``epochs``.

    A callable object rather than a lambda so that ``LambdaLR.state_dict()`` can save it.

    Examples:
        >>> lf = linear_lr(lrf=0.01, epochs=100)
        >>> lf(0), lf(100)
        (1.0, 0.01)
    """

    lrf: float
    epochs: int

    def __call__(self, epoch: float) -> float:
        return (1.0 - epoch / self.epochs) * (1.0 - self.lrf) + self.lrf


@dataclass
class cosine_lr:  # noqa: N801
    """LR factor following half a cosine from 1 at epoch 0 to ``lrf`` at epoch ``epochs`` (YOLOv5's one_cycle).

    Examples:
        >>> lf = cosine_lr(lrf=0.01, epochs=100)
        >>> lf(0), round(lf(50), 3), round(lf(100), 6)
        (1.0, 0.505, 0.01)
    """

    lrf: float
    epochs: int

    def __call__(self, epoch: float) -> float:
        return ((1.0 - math.cos(epoch * math.pi / self.epochs)) / 2.0) * (self.lrf - 1.0) + 1.0


class one_cycle:  # noqa: N801 - YOLOv5's name and call form
    """YOLOv5's ``one_cycle(y1, y2, steps)``: a factor following half a cosine from ``y1`` at 0 to ``y2`` at ``steps``.

    ``one_cycle(1, lrf, epochs)`` is the schedule YOLOv5's train.py builds for ``--cos-lr``, the same
    as :class:`cosine_lr` ``(lrf, epochs)``. A callable object rather than YOLOv5's lambda, so that
    ``LambdaLR.state_dict()`` saves it.

    Args:
        y1: the value at 0.
        y2: the value at ``steps``.
        steps: the length of the ramp (epochs).

    Examples:
        >>> lf = one_cycle(1, 0.01, 100)
        >>> lf(0), round(lf(50), 3), round(lf(100), 6)
        (1.0, 0.505, 0.01)
        >>> one_cycle(1, 0.01, 10)(10) == cosine_lr(0.01, 10)(10)
        True
    """

    def __init__(self, y1: float = 0.0, y2: float = 1.0, steps: int = 100) -> None:
        if steps <= 0:
            raise ValueError(f"one_cycle steps={steps}: must be > 0")
        self.y1, self.y2, self.steps = float(y1), float(y2), steps

    def __call__(self, x: float) -> float:
        return ((1.0 - math.cos(x * math.pi / self.steps)) / 2.0) * (self.y2 - self.y1) + self.y1

    def __repr__(self) -> str:
        return f"one_cycle(y1={self.y1}, y2={self.y2}, steps={self.steps})"


def lr_lambda(lrf: float, epochs: int, cos_lr: bool = False) -> Callable[[float], float]:
    """The schedule train.py's ``--cos-lr`` picks: cosine when True, else linear.

    Examples:
        >>> lr_lambda(0.01, 10, cos_lr=True)
        cosine_lr(lrf=0.01, epochs=10)
    """
    return cosine_lr(lrf, epochs) if cos_lr else linear_lr(lrf, epochs)


def accumulate_steps(total_batch_size: int, nbs: int = NBS) -> int:
    """Batches to accumulate before an optimizer step so that each step sees about ``nbs`` images.

    Examples:
        >>> accumulate_steps(16), accumulate_steps(64), accumulate_steps(256)
        (4, 1, 1)
    """
    if total_batch_size < 1:
        raise ValueError(f"total_batch_size={total_batch_size}: must be >= 1")
    return max(round(nbs / total_batch_size), 1)


def scaled_weight_decay(weight_decay: float, total_batch_size: int, accumulate: int, nbs: int = NBS) -> float:
    """Scale the weight decay to the images per optimizer step (``total_batch_size * accumulate``).

    Examples:
        >>> scaled_weight_decay(0.0005, 16, 4)
        0.0005
        >>> scaled_weight_decay(0.0005, 128, 1)
        0.001
    """
    return weight_decay * total_batch_size * accumulate / nbs


def _interp(x: float, x1: float, y0: float, y1: float) -> float:
    if x1 <= 0:
        return y1
    t = min(max(x / x1, 0.0), 1.0)
    return y0 * (1.0 - t) + y1 * t


class Warmup:
    """Ramp learning rates, momentum and accumulation over the first iterations.

    Over ``n = max(round(warmup_epochs * nb), min_iters)`` iterations (0 when
    ``warmup_epochs`` is 0), linearly in the iteration number ``ni``:

    - the "bias" group's lr falls from ``warmup_bias_lr`` to ``initial_lr * lf(epoch)``,
    - the other groups' lr rises from 0 to ``initial_lr * lf(epoch)``,
    - momentum (Adam: beta1) rises from ``warmup_momentum`` to ``momentum``,
    - :meth:`accumulate` rises from 1 to the target accumulation.

    Args:
        optimizer: from :func:`smart_optimizer` (group 0 is treated as "bias" without names).
        lf: the LR lambda (:func:`linear_lr` / :func:`cosine_lr`).
        nb: batches per epoch.
        warmup_epochs: hyp warmup_epochs (may be fractional).
        warmup_bias_lr: hyp warmup_bias_lr.
        warmup_momentum: hyp warmup_momentum.
        momentum: hyp momentum (the value warm-up ends at).
        min_iters: the least number of warm-up iterations.

    Examples:
        >>> model = nn.Linear(2, 1)
        >>> opt = smart_optimizer(model, lr=0.01)
        >>> warmup = Warmup(opt, linear_lr(0.01, 10), nb=10, warmup_epochs=3)
        >>> warmup.iters, warmup.epochs  # min_iters: 100 iterations, 10 epochs of 10 batches
        (100, 10.0)
        >>> warmup.step(0, epoch=0), opt.param_groups[0]["lr"], opt.param_groups[1]["lr"]
        (True, 0.1, 0.0)
        >>> warmup.step(100, epoch=0), opt.param_groups[0]["lr"], opt.param_groups[1]["lr"]
        (True, 0.01, 0.01)
        >>> warmup.step(101, epoch=0)
        False
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        lf: Callable[[float], float],
        nb: int,
        warmup_epochs: float = 3.0,
        warmup_bias_lr: float = 0.1,
        warmup_momentum: float = 0.8,
        momentum: float = 0.937,
        min_iters: int = 100,
    ) -> None:
        self.optimizer = optimizer
        self.lf = lf
        self.iters = max(round(warmup_epochs * nb), min_iters) if warmup_epochs > 0 else 0
        self.nb = nb
        self.warmup_bias_lr = warmup_bias_lr
        self.warmup_momentum = warmup_momentum
        self.momentum = momentum
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])  # a LambdaLR built first has set it already

    @property
    def epochs(self) -> float:
        """The warm-up's length in epochs: ``warmup_epochs``, or more where ``min_iters`` lengthens it."""
        return self.iters / self.nb if self.nb else 0.0

    def active(self, ni: int) -> bool:
        """True while iteration ``ni`` (counted from the start of training) is in the warm-up."""
        return ni <= self.iters and self.iters > 0

    def step(self, ni: int, epoch: int) -> bool:
        """Set lr and momentum for iteration ``ni`` of ``epoch``; return False (and change nothing) after warm-up."""
        if not self.active(ni):
            return False
        for j, group in enumerate(self.optimizer.param_groups):
            is_bias = group.get("name", "bias" if j == 0 else "") == "bias"
            start = self.warmup_bias_lr if is_bias else 0.0
            group["lr"] = _interp(ni, self.iters, start, group["initial_lr"] * self.lf(epoch))
            beta1 = _interp(ni, self.iters, self.warmup_momentum, self.momentum)
            if "momentum" in group:
                group["momentum"] = beta1
            elif "betas" in group:
                group["betas"] = (beta1, group["betas"][1])
        return True

    def accumulate(self, ni: int, target: int) -> int:
        """Batches to accumulate at iteration ``ni``: from 1 up to ``target`` during warm-up.

        Examples:
            >>> w = Warmup(torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1), linear_lr(0.1, 5), nb=100)
            >>> w.accumulate(0, 4), w.accumulate(150, 4), w.accumulate(10_000, 4)
            (1, 2, 4)
        """
        if not self.active(ni):
            return target
        return max(1, round(_interp(ni, self.iters, 1.0, float(target))))
