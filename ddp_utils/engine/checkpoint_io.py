"""Training checkpoints: plain data, written atomically by rank 0, loaded without unpickling code.

A checkpoint is a dict of plain values, so ``torch.load(..., weights_only=True)`` reads it
and a file from the internet cannot run code on load. :func:`build_checkpoint` makes one:

    ============== =============================================================
    key            value
    ============== =============================================================
    model          EMA (or model) ``state_dict()``: fp32 tensors, fp16 after
                   :func:`strip_optimizer`
    train_model    the raw training weights beside the EMA's, so a resumed run continues
                   exactly, or None; dropped by :func:`strip_optimizer`
    model_cfg      the model yaml as a dict (rebuild with ``Model(ckpt["model_cfg"])``)
    optimizer      ``optimizer.state_dict()``, or None after :func:`strip_optimizer`
    scaler         ``GradScaler.state_dict()`` or None
    ema_updates    ``ModelEMA.updates`` (int)
    epoch          the last finished epoch (int); -1 once stripped (not resumable)
    best_fitness   best fitness so far (float)
    opt            the run's options as a dict of plain values (Paths become str)
    hyp            the hyperparameter dict
    date           ISO 8601 time of saving (UTC)
    version        the ddp_utils version that wrote it
    ============== =============================================================

This module holds the format, the atomic save and the load. Built on them:
:class:`~ddp_utils.engine.checkpointer.Checkpointer` (``checkpointer.py``), what a training
loop uses for a run's ``last.pt``, ``best.pt`` and ``epochN.pt``; :func:`strip_optimizer`
(``strip.py``); :func:`restore_training` and :func:`latest_checkpoint` (``resume.py``); all of
them also from :mod:`ddp_utils.engine`.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import errno
import glob
import os
import pickle
import re
import warnings
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path, PurePath
from typing import Any, BinaryIO, Callable

import torch
from torch import nn

from ..distributed import is_main_process
from ..distributed.parallel import de_parallel
from ..files import mkstemp_shared
from ..log import LOGGER

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
) -> dict[str, Any]:
    """Assemble a checkpoint dict of plain values (see the module docstring for the keys).

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

    Returns:
        The checkpoint dict.

    Examples:
        >>> ckpt = build_checkpoint(torch.nn.Linear(2, 1), epoch=4, opt={"epochs": 10})
        >>> sorted(ckpt) == sorted(CHECKPOINT_KEYS), ckpt["epoch"], list(ckpt["model"])
        (True, 4, ['weight', 'bias'])
    """
    from .. import __version__  # lazy: the package imports engine

    model = de_parallel(model)
    if model_cfg is None:
        model_cfg = getattr(model, "yaml", None)
    return {
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "train_model": (
            {k: v.detach().clone() for k, v in de_parallel(train_model).state_dict().items()}
            if train_model is not None
            else None
        ),
        "model_cfg": to_plain(model_cfg),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "ema_updates": int(ema_updates),
        "epoch": int(epoch),
        "best_fitness": float(best_fitness),
        "opt": to_plain(opt) if opt is not None else {},
        "hyp": to_plain(hyp) if hyp is not None else {},
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "version": __version__,
    }


def _fsync_dir(directory: Path) -> None:
    # makes the rename itself durable; not every platform/file system lets a directory be opened
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove_stale_temps(path: Path) -> None:
    # A process killed mid-save (SIGKILL, OOM, node loss) leaves its temp file behind; its pid,
    # in the name, tells whether the writer is gone. Several GB of those would fill the disk.
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        match = re.match(rf"\.{re.escape(path.name)}\.(\d+)\.", tmp.name)
        if not match or int(match.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                tmp.unlink()
                LOGGER.info(f"removed {tmp}, left by a save that was killed")
        except OSError:  # the pid exists under another user: not ours to touch
            pass


def _os_error_behind(exc: BaseException) -> BaseException:
    """The OSError that caused ``exc``, else ``exc``: on a full disk torch.save raises a
    RuntimeError ("unexpected pos ...") while the ENOSPC from the file's write is its context."""
    seen = exc
    for _ in range(8):
        if isinstance(seen, OSError) and seen.errno:
            return seen
        nxt = seen.__cause__ or seen.__context__
        if nxt is None:
            break
        seen = nxt
    return exc


def atomic_torch_save(obj: Any, path: str | Path) -> Path:
    """Write ``obj`` with ``torch.save`` so that ``path`` is either the old file or the whole new one.

    The data goes to a temp file in the same directory, is flushed and fsynced, then
    renamed over ``path`` (``os.replace`` is atomic on POSIX and Windows) and the
    directory is fsynced. Any failure removes the temp file and leaves ``path`` as it was.

    Raises:
        CheckpointWriteError: the write failed (e.g. ENOSPC); the message names the target,
            the cause and whether a previous file is intact there. ``errno`` is the cause's.
    """
    return _atomic_write(path, lambda f: torch.save(obj, f))


def atomic_write_bytes(data: bytes, path: str | Path) -> Path:
    """Write ``data`` (e.g. a checkpoint serialised once) atomically, as :func:`atomic_torch_save` does.

    Raises:
        CheckpointWriteError: the write failed; the previous file at ``path`` is intact.
    """
    return _atomic_write(path, lambda f: f.write(data))


def _atomic_write(path: str | Path, write: Callable[[BinaryIO], Any]) -> Path:
    path = Path(path)
    tmp_name: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(path)
        fd, tmp_name = mkstemp_shared(path.parent, prefix=f".{path.name}.{os.getpid()}.")
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException as exc:
        if tmp_name is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
        if not isinstance(exc, Exception):  # KeyboardInterrupt etc.: clean up, then let it through
            raise
        kept = f"the previous {path} is intact" if path.is_file() else f"no file was written at {path}"
        cause = _os_error_behind(exc)
        code = getattr(cause, "errno", None) or errno.EIO
        reason = os.strerror(cause.errno) if getattr(cause, "errno", None) else f"{type(exc).__name__}: {exc}"
        raise CheckpointWriteError(code, f"could not save checkpoint {path}: {reason}; {kept}") from exc
    _fsync_dir(path.parent)
    return path


def save_checkpoint(ckpt: Mapping[str, Any], path: str | Path) -> bool:
    """Save a checkpoint atomically on the main process; other ranks do nothing.

    Args:
        ckpt: a dict of plain values (:func:`build_checkpoint`); checked with :func:`check_plain`
            first so a checkpoint that could not be loaded safely is never written.
        path: the target file (``weights/last.pt``); its directory is created.

    Returns:
        True when this process wrote the file, False on other ranks.

    Raises:
        TypeError: an entry is not a plain type (the message names it).
        CheckpointWriteError: the write failed; the previous file is intact.
    """
    if not is_main_process():
        return False
    check_plain(dict(ckpt))
    atomic_torch_save(dict(ckpt), path)
    return True


def _unsupported_global(message: str) -> str:
    match = re.search(r"Unsupported global: GLOBAL ([\w.]+)", message)
    if match:
        return f" (first refused object: {match.group(1)})"
    return ""


def load_checkpoint(path: str | Path, map_location: Any = "cpu", trusted: bool = False) -> dict[str, Any]:
    """Load a checkpoint with ``torch.load(weights_only=True)``.

    Args:
        path: the checkpoint file.
        map_location: where tensors go (default CPU; move the model afterwards).
        trusted: when the file holds pickled Python objects (a whole ``nn.Module``, a
            YOLOv5/Ultralytics ``.pt``), load it anyway with ``weights_only=False``. Only
            for files you made or trust: unpickling can run arbitrary code.

    Returns:
        The checkpoint dict.

    Raises:
        FileNotFoundError: there is no such file.
        UnsafeCheckpointError: the file needs unpickling and ``trusted`` is False.
        CheckpointError: the file is empty, truncated or not a torch checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        if not trusted:
            raise UnsafeCheckpointError(
                f"checkpoint {path} contains arbitrary Python objects{_unsupported_global(str(exc))}, "
                "not only tensors and plain values, so it was not loaded: unpickling it could run code. "
                "A YOLOv5 checkpoint is read without running it by ddp_utils.yolo.read_yolov5_checkpoint "
                "(train.py --weights takes it; python -m ddp_utils convert converts it); for any other file "
                "you trust, load_checkpoint(path, trusted=True)."
            ) from None
        unsafe = exc
    except (RuntimeError, EOFError, KeyError, IndexError, ValueError) as exc:  # torch's unpickler on a text file
        raise CheckpointError(f"checkpoint {path} is empty, truncated or not a torch checkpoint: {exc}") from exc
    warnings.warn(
        f"loading {path} with weights_only=False because trusted=True: it holds pickled Python objects"
        f"{_unsupported_global(str(unsafe))}",
        stacklevel=2,
    )
    try:
        return torch.load(path, map_location=map_location, weights_only=False)
    except ModuleNotFoundError as exc:
        raise CheckpointError(
            f"checkpoint {path} pickles objects from module {exc.name!r}, which is not importable here "
            "(a YOLOv5/Ultralytics .pt needs their code on sys.path)"
        ) from exc
