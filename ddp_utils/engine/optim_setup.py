"""The optimizer, its LR schedule and warm-up, built from a hyperparameter yaml as YOLOv5's train.py builds them.

The pieces are in ``optim.py``; this module composes them for a run: gradients accumulate up to
the nominal batch size ``nbs`` (weight decay scales with it), :func:`smart_optimizer`'s three
parameter groups, a ``LambdaLR`` over ``lr_lambda(lrf, epochs)`` and the :class:`Warmup`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import torch
from torch import nn

from .optim import NBS, Warmup, accumulate_steps, lr_lambda, scaled_weight_decay, smart_optimizer


@dataclasses.dataclass(frozen=True)
class OptimizerSetup:
    """What :func:`optimizer_from_hyp` built.

    Attributes:
        optimizer: the optimizer over the model's three parameter groups.
        scheduler: the per-epoch ``LambdaLR``.
        warmup: the per-iteration warm-up of lr, momentum and accumulation.
        accumulate: batches accumulated per optimizer step after warm-up.
        lf: the LR factor per epoch.
    """

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    warmup: Warmup
    accumulate: int
    lf: Callable[[float], float]


def optimizer_from_hyp(
    model: nn.Module,
    hyp: Mapping[str, float],
    *,
    name: str = "SGD",
    batch_size: int,
    epochs: int,
    batches_per_epoch: int,
    cos_lr: bool = False,
) -> OptimizerSetup:
    """Optimizer, schedule and warm-up for ``model`` from YOLOv5's hyperparameters.

    Args:
        model: the (unwrapped) model; build this before DDP wraps it.
        hyp: ``lr0``, ``lrf``, ``momentum``, ``weight_decay``, ``warmup_epochs``, ``warmup_momentum``,
            ``warmup_bias_lr``; optional ``nbs`` (nominal batch size, default 64) and
            ``warmup_min_iters`` (default 100).
        name: "SGD", "Adam" or "AdamW".
        batch_size: the total batch size over all processes.
        epochs: the run's epochs (the schedule's length).
        batches_per_epoch: batches per epoch on one process (the warm-up's unit).
        cos_lr: a cosine schedule instead of the linear one.

    Returns:
        An :class:`OptimizerSetup`.

    Examples:
        >>> hyp = dict(lr0=0.01, lrf=0.1, momentum=0.9, weight_decay=5e-4, warmup_epochs=1.0,
        ...            warmup_momentum=0.8, warmup_bias_lr=0.1)
        >>> setup = optimizer_from_hyp(nn.Linear(4, 2), hyp, batch_size=16, epochs=10, batches_per_epoch=8)
        >>> setup.accumulate, setup.warmup.iters, setup.optimizer.param_groups[0]["lr"]
        (4, 100, 0.01)
    """
    nbs = int(hyp.get("nbs", NBS))
    accumulate = accumulate_steps(batch_size, nbs)
    weight_decay = scaled_weight_decay(hyp["weight_decay"], batch_size, accumulate, nbs)
    optimizer = smart_optimizer(model, name, hyp["lr0"], hyp["momentum"], weight_decay)
    lf = lr_lambda(hyp["lrf"], epochs, cos_lr=cos_lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lf)
    warmup = Warmup(
        optimizer,
        lf,
        batches_per_epoch,
        hyp["warmup_epochs"],
        hyp["warmup_bias_lr"],
        hyp["warmup_momentum"],
        hyp["momentum"],
        int(hyp.get("warmup_min_iters", 100)),
    )
    return OptimizerSetup(optimizer, scheduler, warmup, accumulate, lf)


__all__ = ["OptimizerSetup", "optimizer_from_hyp"]
