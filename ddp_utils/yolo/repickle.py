"""Writing a YOLOv5 checkpoint back without running it: the inert records under their own class names.

:mod:`~ddp_utils.yolo.foreign` reads YOLOv5's pickled ``models.yolo.DetectionModel`` as inert
records (class path + pickled state; nothing of YOLOv5 is imported or called). This module edits
those records as YOLOv5's ``utils.torch_utils.strip_optimizer`` edits the live objects, and pickles
them again under the same class paths, so YOLOv5 (or anything with its ``models`` package) loads the
result as it loads its own file: :func:`strip_yolov5_records`, then :func:`save_records`.
"""

from __future__ import annotations

import copyreg
import pickle
import types
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .foreign import ForeignCheckpointError, _check_model_class, _load_restricted, _modules, _Record, _state


class _RecordPickler(pickle._Pickler):  # the Python pickler: its save_global can be told to write a name as is
    """Pickles a record as its class path (``GLOBAL``) and its state (``NEWOBJ`` + ``BUILD``), as pickle wrote it."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _Record):
            if obj.items:  # a foreign list/dict subclass: whether APPEND or SETITEM filled it is not recorded
                raise ForeignCheckpointError(f"cannot write back a {obj.class_path} that holds items")
            return copyreg.__newobj__, (type(obj), *obj.args), obj.state
        return NotImplemented

    def save_global(self, obj: Any, name: str | None = None) -> None:
        if isinstance(obj, type) and issubclass(obj, _Record):
            module, _, qualname = obj.class_path.rpartition(".")
            self.write(pickle.GLOBAL + f"{module}\n{qualname}\n".encode())
            self.memoize(obj)
            return
        super().save_global(obj, name)


def _record_pickle_module() -> types.ModuleType:
    module = types.ModuleType("ddp_utils_record_pickle")  # what torch.save calls pickle_module
    module.Pickler = _RecordPickler
    return module


def _converted(tensor: Any, half: bool, parameter: bool) -> Any:
    if not isinstance(tensor, torch.Tensor):
        return tensor
    if half and tensor.is_floating_point():
        tensor = tensor.detach().half()
    return nn.Parameter(tensor.detach(), requires_grad=False) if parameter else tensor


def _strip_module(record: Any, half: bool) -> None:
    """``module.half()`` (when ``half``) and ``requires_grad = False`` on a recorded module tree."""
    state = _state(record)
    for group in ("_parameters", "_buffers"):
        tensors = state.get(group) or {}
        for name, tensor in tensors.items():
            tensors[name] = _converted(tensor, half, parameter=group == "_parameters")
    for child in _modules(record).values():
        if isinstance(child, _Record):
            _strip_module(child, half)


def _half_head(model: Any) -> None:
    """YOLOv5's model ``_apply`` also converts its Detect's plain attributes: stride, grid, anchor_grid."""
    layers = list(_modules(_modules(model).get("model")).values())
    head = _state(layers[-1]) if layers else {}
    for name in ("stride", "grid", "anchor_grid"):
        value = head.get(name)
        if isinstance(value, list):
            head[name] = [_converted(t, True, parameter=False) for t in value]
        elif isinstance(value, torch.Tensor):
            head[name] = _converted(value, True, parameter=False)


def strip_yolov5_records(source: str | Path, half: bool = True) -> dict[str, Any]:
    """Strip a checkpoint YOLOv5's train.py wrote, as YOLOv5's ``strip_optimizer`` does, running none of it.

    ``ema`` (when present) becomes ``model``; ``optimizer``, ``best_fitness``, ``ema`` and ``updates``
    become None and ``epoch`` -1; the model's floating-point tensors become fp16 and its parameters
    stop requiring gradients. The records keep their class paths (``models.yolo.DetectionModel``,
    ``models.common.C3``...), so the file is YOLOv5's layout still.

    Args:
        source: the checkpoint YOLOv5 wrote (a run's ``last.pt``/``best.pt``).
        half: convert the model to fp16 (YOLOv5 always does).

    Returns:
        The stripped checkpoint (a dict holding records), for :func:`save_records`.

    Raises:
        ForeignCheckpointError: not a YOLOv5 detection checkpoint, or it holds what cannot be written back.
        UnsafePickleError: its pickle calls something; nothing was called.

    Examples:
        >>> import tempfile
        >>> plain = Path(tempfile.mkdtemp()) / "plain.pt"
        >>> torch.save({"model": {"w": torch.zeros(1)}}, plain)
        >>> strip_yolov5_records(plain)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ddp_utils.yolo.foreign.ForeignCheckpointError: ...plain.pt holds a state dict, not a YOLOv5 model: ...
    """
    source = Path(source)
    ckpt = _load_restricted(source)
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise ForeignCheckpointError(f"{source} is not a YOLOv5 checkpoint: no 'model' entry in a dict")
    if isinstance(ckpt.get("ema"), _Record):
        ckpt["model"] = ckpt["ema"]
    _check_model_class(source, ckpt["model"])
    ckpt.update(optimizer=None, best_fitness=None, ema=None, updates=None, epoch=-1)
    _strip_module(ckpt["model"], half)
    if half:
        _half_head(ckpt["model"])
    return ckpt


def save_records(ckpt: Any, file: Any) -> None:
    """``torch.save`` a structure holding records, each written under its own class path (nothing imported).

    Args:
        ckpt: what to save: plain values, tensors and records (from :func:`strip_yolov5_records`).
        file: a path or a binary file object.

    Examples:
        >>> import io
        >>> buffer = io.BytesIO()
        >>> save_records({"epoch": -1, "w": torch.ones(2)}, buffer)
        >>> torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)["epoch"]
        -1
    """
    torch.save(ckpt, file, pickle_module=_record_pickle_module())
