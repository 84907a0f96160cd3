"""Resuming a run: find its last checkpoint and put the model, EMA, optimizer and scaler back."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..distributed.parallel import de_parallel
from .checkpoint_io import CheckpointError


def restore_training(
    ckpt: Mapping[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    ema: Any | None = None,
    scaler: Any | None = None,
) -> tuple[int, float]:
    """Put a resumed run back where the checkpoint left it.

    Loads the weights into ``model`` (the raw ``train_model`` weights when the checkpoint
    has them, else the EMA's) and into ``ema.ema`` (restoring ``ema.updates``), the
    optimizer and the scaler state when given and present.

    Returns:
        ``(start_epoch, best_fitness)``: the epoch to start from (checkpoint epoch + 1).

    Raises:
        CheckpointError: the checkpoint was stripped (epoch -1) or has no optimizer state
            while an optimizer was given.
    """
    epoch = int(ckpt.get("epoch", -1))
    # epoch -1 with an optimizer state is a run stopped during its first epoch: resumable
    if optimizer is not None and ckpt.get("optimizer") is None:
        raise CheckpointError(
            "this checkpoint cannot resume training: it was stripped (no optimizer state, epoch -1); "
            "start a new run with it as pretrained weights instead"
        )
    de_parallel(model).load_state_dict(ckpt.get("train_model") or ckpt["model"])
    if ema is not None:
        ema.ema.load_state_dict(ckpt["model"])
        ema.updates = int(ckpt.get("ema_updates", 0))
    if optimizer is not None:
        optimizer.load_state_dict(ckpt["optimizer"])
    if scaler is not None and ckpt.get("scaler") is not None:
        scaler.load_state_dict(ckpt["scaler"])
    return epoch + 1, float(ckpt.get("best_fitness", 0.0))


def latest_checkpoint(project: str | Path, run_key: str | None = None) -> Path | None:
    """The newest ``<project>/<run>/weights/last.pt``, for ``--resume`` without a path.

    Args:
        project: the directory that holds the runs (``runs/train``).
        run_key: when given, only runs whose ``opt.yaml`` records this ``run_key`` count: an
            elastic restart finds its own run, never another job's in the same project.

    Returns:
        The path, or None when there is none.

    Examples:
        >>> latest_checkpoint("no/such/project") is None
        True
    """
    import yaml  # lazy: only resuming needs it

    candidates = sorted(Path(project).glob("*/weights/last.pt"), key=lambda p: p.stat().st_mtime, reverse=True)
    for candidate in candidates:
        if run_key is None:
            return candidate
        opt_file = candidate.parent.parent / "opt.yaml"
        try:
            recorded = (yaml.safe_load(opt_file.read_text()) or {}).get("run_key")
        except (OSError, yaml.YAMLError, AttributeError):
            continue
        if recorded == run_key:
            return candidate
    return None
