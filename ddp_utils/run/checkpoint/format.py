"""The checkpoint format: a dict of plain values that ``torch.load(weights_only=True)`` reads (see the package docs)."""

from __future__ import annotations

import argparse
import enum
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import PurePath
from typing import Any

import torch
from torch import nn

from ...distributed.parallel import de_parallel
from ...version import __version__

CHECKPOINT_KEYS = (
    "model",
    "train_model",
    "model_cfg",
    "optimizer",
    "scaler",
    "ema_updates",
    "epoch",
    "best_fitness",
    "opt",
    "hyp",
    "train_state",
    "date",
    "version",
)
_PLAIN_SCALARS = (str, int, float, bool, type(None), torch.dtype, torch.device, torch.Size)


class CheckpointError(RuntimeError):
    """A checkpoint file cannot be read as a checkpoint (missing, truncated, not a torch file)."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint holds pickled Python objects, which ``weights_only`` loading refuses to run."""


class CheckpointWriteError(OSError):
    """Saving a checkpoint failed; the previous file at the target, if any, is untouched."""


def to_plain(value: Any) -> Any:
    """Convert options and hyperparameters to types a ``weights_only`` load accepts.

    Paths become str, Namespaces and Mappings become dicts, tuples and sets lists stay
    containers, numpy scalars become Python numbers and enums their value.

    Examples:
        >>> from pathlib import Path
        >>> to_plain({"save_dir": Path("runs/exp"), "imgsz": (640, 640)})
        {'save_dir': 'runs/exp', 'imgsz': [640, 640]}
    """
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, Mapping):
        return {to_plain(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_plain(v) for v in value]
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, enum.Enum):
        return to_plain(value.value)
    if hasattr(value, "item") and hasattr(value, "dtype") and getattr(value, "ndim", None) == 0:
        return value.item()  # numpy scalars (not tensors: those are plain already)
    return value


def check_plain(obj: Any, where: str = "ckpt") -> None:
    """Raise TypeError naming the first entry of ``obj`` that a ``weights_only`` load would refuse.

    Examples:
        >>> check_plain({"epoch": 3, "opt": {"name": "exp"}})
        >>> from pathlib import Path
        >>> check_plain({"opt": {"save_dir": Path("runs")}})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: ckpt['opt']['save_dir'] is a ...Path, which torch.load(weights_only=True) refuses: ...
    """
    if isinstance(obj, (torch.Tensor, _PLAIN_SCALARS)):
        return
    if isinstance(obj, dict):  # dict and OrderedDict
        for key, value in obj.items():
            check_plain(key, f"{where} key")
            check_plain(value, f"{where}[{key!r}]")
        return
    if isinstance(obj, (list, tuple, set)) and type(obj) in (list, tuple, set):
        for i, value in enumerate(obj):
            check_plain(value, f"{where}[{i}]")
        return
    raise TypeError(
        f"{where} is a {type(obj).__name__}, which torch.load(weights_only=True) refuses: "
        "convert it (to_plain) before saving"
    )


def build_checkpoint(
    model: nn.Module,
    *,
    train_model: nn.Module | None = None,
    model_cfg: Mapping[str, Any] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scaler: Any | None = None,
    ema_updates: int = 0,
    epoch: int = -1,
    best_fitness: float = 0.0,
    opt: Any = None,
    hyp: Mapping[str, Any] | None = None,
    train_state: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble a checkpoint dict of plain values (see the module docstring for the keys).

    Tensors are copied to host memory (the copy a save must make before training moves on), so the
    result is a snapshot that :class:`BackgroundWriter` can serialise while the next steps run.

    Args:
        model: the model to store, usually ``ema.ema``; wrappers are looked through.
        train_model: the raw model being trained, stored beside the EMA's weights so a resumed
            run continues exactly (None: the key holds None).
        model_cfg: the model's yaml dict; defaults to ``model.yaml`` when the model has one.
        optimizer: its ``state_dict()`` is stored.
        scaler: a GradScaler (its ``state_dict()`` is stored) or None.
        ema_updates: ``ModelEMA.updates``.
        epoch: the epoch just finished.
        best_fitness: best fitness so far.
        opt: the run's options (argparse Namespace or dict); converted with :func:`to_plain`.
        hyp: hyperparameters; converted with :func:`to_plain`.
        train_state: where training stands (``TrainState.as_dict()``), for an exact resume.

    Returns:
        The checkpoint dict, every tensor a host copy.

    Examples:
        >>> ckpt = build_checkpoint(torch.nn.Linear(2, 1), epoch=4, opt={"epochs": 10})
        >>> sorted(ckpt) == sorted(CHECKPOINT_KEYS), ckpt["epoch"], list(ckpt["model"])
        (True, 4, ['weight', 'bias'])
    """
    model = de_parallel(model)
    if model_cfg is None:
        model_cfg = getattr(model, "yaml", None)
    return {
        "model": to_host(model.state_dict()),
        "train_model": to_host(de_parallel(train_model).state_dict()) if train_model is not None else None,
        "model_cfg": to_plain(model_cfg),
        "optimizer": to_host(optimizer.state_dict()) if optimizer is not None else None,
        "scaler": to_host(scaler.state_dict()) if scaler is not None else None,
        "ema_updates": int(ema_updates),
        "epoch": int(epoch),
        "best_fitness": float(best_fitness),
        "opt": to_plain(opt) if opt is not None else {},
        "hyp": to_plain(hyp) if hyp is not None else {},
        "train_state": to_host(dict(train_state)) if train_state is not None else None,
        **_stamp(),
    }


def _stamp() -> dict[str, str]:
    """When, and by which ddp_utils version, a checkpoint was built: the last two keys of every checkpoint."""
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "version": __version__}


def to_host(obj: Any) -> Any:
    """``obj`` with every tensor replaced by a copy in host memory (containers rebuilt, other values kept).

    A state dict holds references to the live tensors (an optimizer's momentum buffers, the
    model's weights): a save copies them before the next step changes them. From a GPU the
    copies are issued without blocking and waited for once (one CPU-GPU sync point per save).

    Examples:
        >>> live = {"w": torch.ones(2), "step": 3, "groups": [{"lr": 0.1}]}
        >>> copy = to_host(live)
        >>> _ = live["w"].add_(1)
        >>> copy["w"].tolist(), copy["step"], copy["groups"]
        ([1.0, 1.0], 3, [{'lr': 0.1}])
    """
    on_device = []

    def copy(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            value = value.detach()
            if value.device.type == "cpu":
                return value.clone()
            on_device.append(value)
            return value.to("cpu", non_blocking=True)
        if isinstance(value, dict):  # OrderedDict stays one: a state dict's type is plain data too
            return type(value)((k, copy(v)) for k, v in value.items())
        if isinstance(value, Mapping):
            return {k: copy(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
            return type(value)(copy(v) for v in value)
        return value

    result = copy(obj)
    if any(t.device.type == "cuda" for t in on_device):
        torch.cuda.synchronize()  # CPU-GPU sync point: the non-blocking copies must land before the save reads them
    return result
