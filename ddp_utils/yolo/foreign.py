"""Reading YOLOv5's own checkpoints without running them.

YOLOv5's ``train.py`` pickles whole Python objects: ``ckpt["model"]`` (and ``ckpt["ema"]``) is a
``models.yolo.DetectionModel`` (``models.yolo.Model`` before v6.1) built from
``models.common.Conv``, ``C3``, ... and ``torch.nn`` layers, stored in half precision. Loading such a
file the usual way imports YOLOv5's code and runs whatever the pickle asks for.

:func:`read_yolov5_checkpoint` reads it with an unpickler that rebuilds no foreign class: a class
from the file becomes an inert record of its pickled state, and only an allow-list of plain
constructors (tensors, storages, OrderedDict, set, torch.Size, dtypes, numpy scalars) is ever
called. A pickle that asks to *call* anything else (``os.system``, a class constructor) is refused
with :class:`UnsafePickleError` naming it, before anything runs. The records are then walked for
the module tree's parameters and buffers and the plain values (``yaml``, ``names``, ``nc``,
``epoch``, ``best_fitness``). :func:`yolov5_model` puts those tensors into our :class:`Model`, built
from the checkpoint's own yaml; its parameter names are YOLOv5's already.
"""

from __future__ import annotations

import argparse
import io
import pickle
import types
import zipfile
from collections import OrderedDict
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch
from torch import nn

from .model import Model, ModelConfigError

# The classes a YOLOv5 detection checkpoint's model may be; anything else is another model.
YOLOV5_MODEL_CLASSES = ("models.yolo.DetectionModel", "models.yolo.Model")
# Tensors YOLOv5 stores that our Model derives (pre-v6.0 Detect kept the anchors in pixels as a buffer).
DERIVED_BY_US = ("stride",)
DERIVED_IN_YOLOV5 = ("anchor_grid",)


class ForeignCheckpointError(RuntimeError):
    """A checkpoint that is not a YOLOv5 detection checkpoint this reader can map onto our Model."""


class UltralyticsCheckpointError(ForeignCheckpointError):
    """An Ultralytics 8 checkpoint (``ultralytics.nn.tasks.*``): an anchor-free model, not YOLOv5's."""


class UnsafePickleError(ForeignCheckpointError):
    """The pickle asks to call something outside the allow-list; nothing was called."""


class _Record:
    """An object of a class from the file: its class path and pickled state, never the class itself."""

    class_path = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> _Record:
        record = object.__new__(cls)
        record.__dict__.update(state=None, args=args, items=[])
        return record

    def __setstate__(self, state: Any) -> None:
        self.state = state

    # a foreign list or dict subclass is filled by APPEND/SETITEMS; keep the items, call nothing
    def append(self, item: Any) -> None:
        self.items.append(item)

    def extend(self, items: Any) -> None:
        self.items.extend(items)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items.append((key, value))

    def __repr__(self) -> str:
        return f"<record of {self.class_path}>"


class _NoCall(type):
    # REDUCE calls what GLOBAL named: for a record class that would mean running foreign code
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise UnsafePickleError(
            f"the pickle calls {cls.class_path}(...) while loading; a checkpoint of weights has no reason to, "
            "so it was refused and nothing was run"
        )


def _torch_path(*parts: Any) -> str:
    if not all(isinstance(p, str) for p in parts):
        raise UnsafePickleError(f"a pickled path has non-text parts {parts!r}")
    return str(PurePosixPath(*parts))


def _reconstructor(cls: Any, base: Any, state: Any = None) -> Any:
    # copyreg._reconstructor (protocols 0 and 1): only ever makes an empty record
    if isinstance(cls, type) and issubclass(cls, _Record) and base is object:
        return cls.__new__(cls)
    raise UnsafePickleError(f"the pickle reconstructs {cls!r} from {base!r}, which this reader refuses")


def _np_dtype(spec: Any, align: bool = False, copy: bool = False) -> np.dtype:
    dtype = np.dtype(spec) if isinstance(spec, str) else None
    if dtype is None or dtype.hasobject or dtype.fields is not None:
        raise UnsafePickleError(f"the pickle holds a numpy dtype {spec!r} that is not a plain number type")
    return dtype


def _np_reconstruct(subtype: Any, shape: Any, typecode: Any) -> np.ndarray:
    if subtype is not np.ndarray:
        raise UnsafePickleError(f"the pickle rebuilds a numpy array of type {subtype!r}")
    return np.empty(0, dtype=np.uint8)  # its BUILD (ndarray.__setstate__) gives shape, dtype and data


def _np_scalar(dtype: Any, data: Any = None) -> Any:
    if not isinstance(dtype, np.dtype) or dtype.hasobject or not isinstance(data, bytes):
        raise UnsafePickleError(f"the pickle holds a numpy scalar of dtype {dtype!r}")
    return np.frombuffer(data, dtype=dtype)[0]


def _latin1_bytes(text: Any, encoding: Any = "latin1") -> bytes:
    # protocol 2 writes bytes as _codecs.encode(text, "latin1")
    if not isinstance(text, str) or encoding != "latin1":
        raise UnsafePickleError(f"the pickle calls _codecs.encode with {encoding!r}")
    return text.encode("latin1")


def _allowed() -> dict[tuple[str, str], Any]:
    allowed: dict[tuple[str, str], Any] = {
        ("collections", "OrderedDict"): OrderedDict,
        ("builtins", "set"): set,
        ("builtins", "frozenset"): frozenset,
        ("builtins", "object"): object,
        ("torch", "Size"): torch.Size,
        ("torch", "device"): torch.device,
        ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
        ("torch._utils", "_rebuild_parameter"): torch._utils._rebuild_parameter,
        ("copyreg", "_reconstructor"): _reconstructor,
        ("_codecs", "encode"): _latin1_bytes,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): _np_dtype,
    }
    for name in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"):
        allowed["pathlib", name] = _torch_path  # an option's Path comes back as its text
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[module, "_reconstruct"] = _np_reconstruct
        allowed[module, "scalar"] = _np_scalar
    return allowed


_ALLOWED = _allowed()
_PY2_NAMES = {"__builtin__": "builtins", "copy_reg": "copyreg"}


class _RestrictedUnpickler(pickle.Unpickler):
    """Returns real objects only for :data:`_ALLOWED`; every other global becomes a record class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.records: dict[str, type] = {}

    def find_class(self, module: str, name: str) -> Any:
        module = _PY2_NAMES.get(module, module)  # protocol 2 spells builtins the Python 2 way
        if module.split(".")[0] == "ultralytics":  # say so at once, before any other refusal
            raise UltralyticsCheckpointError(
                f"an Ultralytics 8 checkpoint ({module}.{name}): an anchor-free model (also sold as 'YOLOv5u'), "
                "not YOLOv5's anchor-based one, so it cannot be mapped onto this detector; use a YOLOv5 checkpoint"
            )
        if (module, name) in _ALLOWED:
            return _ALLOWED[module, name]
        if module == "torch":
            dtype = getattr(torch, name, None)
            if isinstance(dtype, torch.dtype):
                return dtype
        path = f"{module}.{name}"
        if path not in self.records:
            self.records[path] = _NoCall(name, (_Record,), {"class_path": path})
        return self.records[path]


def _restricted_pickle_module() -> types.ModuleType:
    module = types.ModuleType("ddp_utils_restricted_pickle")  # what torch.load calls pickle_module
    module.Unpickler = _RestrictedUnpickler
    module.load = lambda f, **kwargs: _RestrictedUnpickler(f, **kwargs).load()
    return module


def _load_restricted(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=False, pickle_module=_restricted_pickle_module())
    except ForeignCheckpointError as exc:
        raise type(exc)(
            f"{path} is {exc}" if isinstance(exc, UltralyticsCheckpointError) else f"{path}: {exc}"
        ) from None
    except (RuntimeError, EOFError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile, io.UnsupportedOperation,
            AttributeError, TypeError, IndexError, KeyError) as exc:  # fmt: skip
        if "explicit pickle_module" in str(exc):  # TORCH_FORCE_WEIGHTS_ONLY_LOAD overrides weights_only=False
            raise ForeignCheckpointError(
                f"{path}: torch.load would not use this reader's restricted unpickler because "
                "TORCH_FORCE_WEIGHTS_ONLY_LOAD is set; unset it to read a YOLOv5 checkpoint (nothing in it is run)"
            ) from None
        raise ForeignCheckpointError(
            f"{path} is not a torch checkpoint ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        ) from None


def _state(record: Any) -> dict:
    state = record.state if isinstance(record, _Record) else None
    if isinstance(state, tuple) and state and isinstance(state[0], dict):  # (dict, slotstate)
        state = state[0]
    return state if isinstance(state, dict) else {}


def _plain(value: Any) -> Any:
    """Records of argparse.Namespace become dicts, numpy values Python numbers; other records None."""
    if isinstance(value, _Record):
        return _plain(_state(value)) if value.class_path == "argparse.Namespace" else None
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if isinstance(value, (np.ndarray, np.generic)):
        return value.item() if value.size == 1 else value.tolist()
    return value


def _module_tensors(record: Any, prefix: str, out: dict, classes: dict, attrs: dict) -> None:
    """Collect a recorded nn.Module's state_dict entries (parameters, persistent buffers) by dotted name."""
    state = _state(record)
    classes[prefix.rstrip(".")] = record.class_path
    if "eps" in state and "running_mean" in (state.get("_buffers") or {}):
        attrs[prefix.rstrip(".")] = {"eps": state["eps"], "momentum": state.get("momentum")}
    skip = state.get("_non_persistent_buffers_set") or set()
    for group in ("_parameters", "_buffers"):
        for name, tensor in (state.get(group) or {}).items():
            if tensor is None or (group == "_buffers" and name in skip):
                continue
            if not isinstance(tensor, torch.Tensor):
                raise ForeignCheckpointError(f"{prefix}{name} is a {type(tensor).__name__}, not a tensor")
            out[prefix + name] = tensor
    for name, child in (state.get("_modules") or {}).items():
        if isinstance(child, _Record):
            _module_tensors(child, f"{prefix}{name}.", out, classes, attrs)


def _check_model_class(path: Path, model: Any) -> str:
    if isinstance(model, dict):
        raise ForeignCheckpointError(f"{path} holds a state dict, not a YOLOv5 model: load it with load_checkpoint")
    if not isinstance(model, _Record):
        raise ForeignCheckpointError(f"{path} is not a YOLOv5 checkpoint: its 'model' is {type(model).__name__}")
    # the pip package "yolov5" pickles the same classes one level down: yolov5.models.yolo.DetectionModel
    if model.class_path.removeprefix("yolov5.") not in YOLOV5_MODEL_CLASSES:
        raise ForeignCheckpointError(
            f"{path}: the model is a {model.class_path}, not a YOLOv5 detection model "
            f"({' or '.join(YOLOV5_MODEL_CLASSES)}), so its layout is unknown here"
        )
    return model.class_path


def read_yolov5_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by YOLOv5's train.py without importing or running anything from it.

    Args:
        path: the ``.pt`` file (``yolov5s.pt``, a run's ``best.pt`` or ``last.pt``).

    Returns:
        A dict: ``state_dict`` (YOLOv5's tensor names to tensors, as stored, half precision for
        released weights), ``yaml`` (the architecture dict), ``names``, ``nc``, ``epoch``,
        ``best_fitness``, ``stride`` (list), ``hyp``, ``opt`` (dicts), ``class_path``, ``bn``
        (batch-norm eps/momentum per module) and ``module_classes`` (dotted name to class path).

    Raises:
        FileNotFoundError: no such file.
        UltralyticsCheckpointError: an Ultralytics 8 checkpoint.
        UnsafePickleError: the pickle tries to call something; nothing was called.
        ForeignCheckpointError: not a torch checkpoint, or not a YOLOv5 detection checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    ckpt = _load_restricted(path)
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise ForeignCheckpointError(f"{path} is not a YOLOv5 checkpoint: no 'model' entry in a dict")
    model = ckpt.get("ema") if isinstance(ckpt.get("ema"), _Record) else ckpt["model"]  # as YOLOv5 loads it
    tensors: dict[str, torch.Tensor] = {}
    classes: dict[str, str] = {}
    bn: dict[str, dict] = {}
    if isinstance(model, _Record):
        _module_tensors(model, "", tensors, classes, bn)
    class_path = _check_model_class(path, model)
    attrs = _state(model)
    stride = attrs.get("stride", _state(_last_layer(model)).get("stride"))
    yaml_dict = _plain(attrs.get("yaml"))
    if not isinstance(yaml_dict, dict):
        raise ForeignCheckpointError(f"{path}: the model has no architecture dict ('yaml'), so it cannot be rebuilt")
    if isinstance(attrs.get("yaml_file"), str) and attrs["yaml_file"]:  # YOLOv5's name of it: "yolov5s.yaml"
        yaml_dict.setdefault("yaml_file", Path(attrs["yaml_file"]).name)
    return {
        "state_dict": tensors,
        "yaml": yaml_dict,
        "names": _plain(attrs.get("names")),
        "nc": _plain(attrs.get("nc", yaml_dict.get("nc"))),
        "epoch": _plain(ckpt.get("epoch")),
        "best_fitness": _plain(ckpt.get("best_fitness")),
        "stride": torch.as_tensor(stride).tolist() if isinstance(stride, torch.Tensor) else None,
        "hyp": _plain(attrs.get("hyp")) or {},
        "opt": _plain(ckpt.get("opt")) or {},
        "class_path": class_path,
        "bn": bn,
        "module_classes": {k: v for k, v in classes.items() if k},
    }


def _modules(record: Any) -> dict:
    return _state(record).get("_modules") or {}


def _last_layer(model: Any) -> Any:
    layers = _modules(_modules(model).get("model"))
    return list(layers.values())[-1] if layers else None


def _as_names(names: Any, nc: int) -> list[str]:
    if isinstance(names, dict):
        return [str(names.get(i, i)) for i in range(nc)]
    if isinstance(names, list) and len(names) == nc:
        return [str(n) for n in names]
    return [str(i) for i in range(nc)]


def yolov5_model(read: dict[str, Any], source: str = "checkpoint") -> tuple[Model, dict[str, Any]]:
    """Build our :class:`Model` from a :func:`read_yolov5_checkpoint` result, every tensor transferred, fp32.

    Args:
        read: what :func:`read_yolov5_checkpoint` returned.
        source: the file name for messages.

    Returns:
        The model (train mode, fp32, ``names`` set) and a report: ``transferred`` (count),
        ``derived`` (YOLOv5 tensors our Model recomputes, e.g. pre-v6 ``anchor_grid``).

    Raises:
        ForeignCheckpointError: the architecture or the tensors do not match our Model (the message
            names the first differing tensor or the unknown block).
    """
    cfg = dict(read["yaml"])
    if cfg.get("activation"):
        raise ForeignCheckpointError(
            f"{source}: its yaml sets activation {cfg['activation']!r}; this detector's Conv uses SiLU only"
        )
    nc = read["nc"] if isinstance(read["nc"], int) else cfg.get("nc")
    try:
        model = Model(cfg, ch=int(cfg.get("ch", 3)), nc=nc)
    except ModelConfigError as exc:
        raise ForeignCheckpointError(f"{source}: an architecture this detector does not build: {exc}") from None
    theirs = read["state_dict"]
    derived = sorted(k for k in theirs if k.rsplit(".", 1)[-1] in DERIVED_IN_YOLOV5)
    ours = {k: v for k, v in model.state_dict().items() if k.rsplit(".", 1)[-1] not in DERIVED_BY_US}
    missing = sorted(set(ours) - set(theirs))
    unexpected = sorted(set(theirs) - set(ours) - set(derived))
    if missing or unexpected:
        raise ForeignCheckpointError(
            f"{source}: unknown layout: {len(missing)} tensors of our Model are not in it "
            f"({', '.join(missing[:3])}) and {len(unexpected)} of its tensors have no place "
            f"({', '.join(unexpected[:3])})"
        )
    for name, tensor in ours.items():
        if theirs[name].shape != tensor.shape:
            raise ForeignCheckpointError(
                f"{source}: unknown layout: {name} is {tuple(theirs[name].shape)} there, {tuple(tensor.shape)} here"
            )
    state = {k: theirs[k].detach().float() if theirs[k].is_floating_point() else theirs[k].detach() for k in ours}
    model.load_state_dict(state, strict=False)
    _check_stride(model, read.get("stride"), source)
    _set_batchnorm(model, read.get("bn") or {})
    model.float()
    model.names = _as_names(read.get("names"), model.nc)
    return model, {"transferred": len(state), "derived": derived}


def _check_stride(model: Model, stride: list[float] | None, source: str) -> None:
    if stride is not None and [float(s) for s in stride] != model.stride.tolist():
        raise ForeignCheckpointError(
            f"{source}: its strides {stride} differ from the {model.stride.tolist()} its yaml builds here"
        )


def _set_batchnorm(model: Model, bn: dict[str, dict]) -> None:
    # YOLOv5 sets eps 1e-3 and momentum 0.03 as ours does; a checkpoint that differs keeps its own
    modules = dict(model.named_modules())
    for name, values in bn.items():
        module = modules.get(name)
        if isinstance(module, nn.BatchNorm2d):
            if isinstance(values.get("eps"), float):
                module.eps = values["eps"]
            if isinstance(values.get("momentum"), float):
                module.momentum = values["momentum"]


__all__ = [
    "ForeignCheckpointError",
    "UltralyticsCheckpointError",
    "UnsafePickleError",
    "read_yolov5_checkpoint",
    "yolov5_model",
]
