"""Make a final, smaller checkpoint: :func:`strip_optimizer` (YOLOv5's call form).

Our checkpoints are stripped as plain data. A checkpoint in YOLOv5's layout that pickles a
ddp_utils ``Model`` is read with ``weights_only`` and an allow-list of exactly the classes it
needs (ddp_utils' and torch.nn's modules, plain numpy and pathlib data), so nothing foreign runs.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...log import LOGGER
from ...yolo.foreign import ForeignCheckpointError
from ...yolo.repickle import save_records, strip_yolov5_records
from .disk import _unsupported_global, atomic_torch_save, atomic_write_bytes, load_checkpoint
from .format import CheckpointError, UnsafeCheckpointError

_DATA_GLOBALS = frozenset(
    {
        "numpy.ndarray",
        "numpy.dtype",
        "numpy.core.multiarray._reconstruct",
        "numpy.core.multiarray.scalar",
        "numpy._core.multiarray._reconstruct",
        "numpy._core.multiarray.scalar",
        "pathlib.Path",
        "pathlib.PosixPath",
        "pathlib.WindowsPath",
        "pathlib.PurePosixPath",
        "pathlib.PureWindowsPath",
    }
)


def _is_allowed(name: str, obj: Any) -> bool:
    module_name = name.rpartition(".")[0]
    if module_name.split(".")[0] == "ddp_utils" or module_name.startswith("torch.nn.modules."):
        return isinstance(obj, type) and issubclass(obj, nn.Module)
    return name in _DATA_GLOBALS or (module_name == "numpy.dtypes" and name.endswith("DType"))


def _own_module_classes(path: Path) -> list[Any]:
    """What a pickled-model checkpoint needs, when it is only ddp_utils' or torch.nn's modules and plain data.

    Raises:
        UnsafeCheckpointError: it pickles anything else (a YOLOv5/Ultralytics model, a function).
    """
    allowed = []
    needed = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    for name in needed:
        module_name, _, qualname = name.rpartition(".")
        obj = None
        with contextlib.suppress(ImportError, AttributeError):
            obj = getattr(importlib.import_module(module_name), qualname)
        if obj is None or not _is_allowed(name, obj):
            raise UnsafeCheckpointError(
                f"checkpoint {path} pickles {name}, which is not a ddp_utils or torch.nn module, so it was "
                "not loaded: unpickling it could run code. A YOLOv5 checkpoint converts with "
                "`python -m ddp_utils convert`; a file you trust loads with load_checkpoint(path, trusted=True)."
            )
        allowed.append(obj)
    if any(name.startswith("numpy.") for name in needed):
        import numpy as np  # the dtype classes an array's dtype rebuilds from are not named in the file

        allowed += [getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith("DType")]
    return allowed


def _strip_pickled_model(ckpt: dict[str, Any], half: bool) -> None:
    """YOLOv5's layout (``model``/``ema`` are pickled modules): keep the EMA as the model, in fp16, frozen."""
    if isinstance(ckpt.get("ema"), nn.Module):
        ckpt["model"] = ckpt["ema"]
    ckpt.update(optimizer=None, best_fitness=None, ema=None, updates=None, epoch=-1)
    if half:
        ckpt["model"].half()
    for param in ckpt["model"].parameters():
        param.requires_grad = False


def _is_yolov5_checkpoint(path: Path) -> bool:
    """Whether ``path`` pickles YOLOv5's own model classes (``models.yolo.*``, ``models.common.*``)."""
    if not path.is_file():
        return False
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except Exception:  # not a zip checkpoint: load_checkpoint says what it is
        return False
    return any(name.removeprefix("yolov5.").startswith(("models.yolo.", "models.common.")) for name in names)


def _strip_yolov5(source: Path, target: Path, half: bool) -> Path:
    """YOLOv5's own checkpoint: stripped as its records, written back under YOLOv5's class names."""
    try:
        ckpt = strip_yolov5_records(source, half)
    except ForeignCheckpointError as exc:
        raise UnsafeCheckpointError(
            f"{exc}; it was not stripped (nothing in it was run): strip it with YOLOv5's own strip_optimizer, "
            "or convert it with `python -m ddp_utils convert` and strip the result"
        ) from None
    buffer = io.BytesIO()
    save_records(ckpt, buffer)
    atomic_write_bytes(buffer.getvalue(), target)
    saved_as = f", saved as {target}" if target != source else ""
    LOGGER.info(f"Optimizer stripped from {source}{saved_as}, {target.stat().st_size / 1e6:.1f}MB")
    return target


def strip_optimizer(
    f: str | Path = "best.pt",
    s: str | Path | None = "",
    half: bool = True,
) -> Path:
    """Make a final, smaller checkpoint: drop the optimizer state, store fp16 weights (YOLOv5's call form).

    ``strip_optimizer(f="best.pt", s="")`` as YOLOv5 calls it: ``s`` empty (or None) overwrites
    ``f``. Our checkpoints (:func:`build_checkpoint`) lose ``optimizer``, ``scaler`` and
    ``train_model`` and ``train_state``, get fp16 weights and ``epoch = -1`` (not resumable), and
    stay loadable with ``weights_only``. A checkpoint in YOLOv5's layout holding a pickled ddp_utils
    ``Model`` (what YOLOv5's train.py saves when it trains our model) is read without running foreign
    code and stripped as YOLOv5 strips it: ``ema`` becomes ``model`` (fp16, frozen), and ``optimizer``,
    ``best_fitness``, ``ema``, ``updates`` become None. Written atomically by whichever process calls
    it (as YOLOv5's, the caller decides: its train.py calls it on rank 0).

    Args:
        f: the checkpoint file.
        s: where to write; ``f`` itself when empty or None.
        half: convert floating-point weights to fp16.

    Returns:
        The written path.

    Raises:
        FileNotFoundError: ``f`` does not exist.
        UnsafeCheckpointError: ``f`` pickles classes other than ddp_utils' and torch.nn's modules.
        CheckpointError: ``f`` has no model to strip.
    """
    source = Path(f)
    target = Path(s or source)
    if _is_yolov5_checkpoint(source):
        return _strip_yolov5(source, target, half)
    try:
        ckpt = load_checkpoint(source)
    except UnsafeCheckpointError:
        try:
            with torch.serialization.safe_globals(_own_module_classes(source)):
                ckpt = torch.load(source, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            raise UnsafeCheckpointError(
                f"checkpoint {source} holds objects beyond ddp_utils/torch.nn modules and plain data"
                f"{_unsupported_global(str(exc))}, so it was not loaded; load it with "
                "load_checkpoint(path, trusted=True) if you trust it"
            ) from None
    model = ckpt.get("model") if isinstance(ckpt, dict) else None
    if isinstance(model, nn.Module) or isinstance(ckpt.get("ema") if isinstance(ckpt, dict) else None, nn.Module):
        _strip_pickled_model(ckpt, half)
    elif isinstance(model, Mapping):
        if half:
            ckpt["model"] = {k: v.half() if v.is_floating_point() else v for k, v in model.items()}
        ckpt.update(optimizer=None, scaler=None, epoch=-1)
        ckpt.pop("train_model", None)
        ckpt.pop("train_state", None)
    else:
        raise CheckpointError(f"checkpoint {source} has no 'model' (a state_dict or a module) to strip")
    atomic_torch_save(ckpt, target)
    saved_as = f", saved as {target}" if target != source else ""
    LOGGER.info(f"Optimizer stripped from {source}{saved_as}, {target.stat().st_size / 1e6:.1f}MB")
    return target
