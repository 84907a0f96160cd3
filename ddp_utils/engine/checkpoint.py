"""The checkpoint file: its format, atomic writing, pickle-free reading (ours or YOLOv5's), stripping.

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
    train_state    where training stands, so a resume continues at the next batch
                   (:class:`~ddp_utils.engine.resume.TrainState`'s dict), or None;
                   dropped by :func:`strip_optimizer`
    date           ISO 8601 time of saving (UTC)
    version        the ddp_utils version that wrote it
    ============== =============================================================

Writing: :func:`atomic_torch_save` and :func:`atomic_write_bytes` leave either the old file or
the whole new one; :class:`BackgroundWriter` does the serialising and writing in a thread, in
order, after the caller copied the state to host memory (:func:`to_host`). Reading:
:func:`load_checkpoint` (``weights_only``), :func:`load_pretrained` (ours, or YOLOv5's read
without running its pickle). :func:`strip_optimizer` makes the final, smaller file. A run's
files (``last.pt``, ``best.pt``, ``epochN.pt``) and resuming are in ``resume.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import errno
import glob
import importlib
import io
import os
import pickle
import re
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path, PurePath
from typing import Any, BinaryIO, Callable

import torch
from torch import nn

from ..distributed import is_main_process
from ..distributed.parallel import de_parallel
from ..downloads import DownloadError, released_weights
from ..files import mkstemp_shared
from ..log import LOGGER
from ..yolo.foreign import ForeignCheckpointError, read_yolov5_checkpoint, yolov5_model
from ..yolo.repickle import save_records, strip_yolov5_records

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
    from .. import __version__  # lazy: the package imports engine

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
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "version": __version__,
    }


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


class BackgroundWriter:
    """Serialise a checkpoint and write it to its files in a thread, one save after another, in order.

    The caller makes the snapshot first (:func:`build_checkpoint` copies every tensor to host
    memory), so training goes on while ``torch.save`` and the disk work: the step is held up only
    for the copy. A save waits for the one before it, so files are never written out of order (a
    periodic ``last.pt`` can never land after a newer one), and :meth:`wait` returns when
    everything handed over is on disk. A failed write is raised at the next :meth:`submit` or
    :meth:`wait`, in the caller's thread, as the :class:`CheckpointWriteError` it was.

    Examples:
        >>> import tempfile
        >>> writer = BackgroundWriter()
        >>> target = Path(tempfile.mkdtemp()) / "last.pt"
        >>> writer.submit({"epoch": 3}, [target])
        >>> writer.wait()
        >>> load_checkpoint(target)["epoch"]
        3
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last_seconds = 0.0  # how long the last save took in its thread (serialise and write)

    def submit(self, ckpt: Mapping[str, Any], paths: Sequence[str | Path]) -> None:
        """Write ``ckpt`` (a host snapshot) to ``paths`` in the background, after any save still running.

        Raises:
            CheckpointWriteError: an earlier background save failed.
        """
        self.wait()
        check_plain(dict(ckpt))
        # not a daemon: an interpreter that exits (a stopped run) still finishes the file
        self._thread = threading.Thread(target=self._write, args=(ckpt, list(paths)), name="checkpoint-writer")
        self._thread.start()

    def _write(self, ckpt: Mapping[str, Any], paths: list[str | Path]) -> None:
        start = time.perf_counter()
        try:
            buffer = io.BytesIO()
            torch.save(dict(ckpt), buffer)
            data = buffer.getvalue()
            for path in paths:
                atomic_write_bytes(data, path)
        except BaseException as exc:  # handed to the caller's thread at the next submit or wait
            self._error = exc
        self.last_seconds = time.perf_counter() - start

    def wait(self) -> None:
        """Return when every save handed over is on disk.

        Raises:
            CheckpointWriteError: a background save failed (the previous files are intact).
        """
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    @property
    def busy(self) -> bool:
        """Whether a save is still being written."""
        return self._thread is not None and self._thread.is_alive()


def _unsupported_global(message: str) -> str:
    match = re.search(r"Unsupported global: GLOBAL ([\w.]+)", message)
    if match:
        return f" (first refused object: {match.group(1)})"
    return ""


def _what_file(path: Path) -> str:
    """What a file that is no torch checkpoint looks like, for the one-line error.

    Examples:
        >>> import tempfile
        >>> f = Path(tempfile.mkdtemp()) / "x.pt"
        >>> _ = f.write_text("epochs: 3\\n")
        >>> _what_file(f)
        'a text file of 10 bytes beginning "epochs: 3"'
    """
    try:
        with open(path, "rb") as f:
            head = f.read(64)
        size = path.stat().st_size
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if size == 0:
        return "the file is empty"
    if head.startswith(b"PK\x03\x04"):
        return f"a zip archive of {size} bytes without a torch checkpoint in it, or one cut short"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return f"{size} bytes of binary data that torch cannot read (truncated, or another format)"
    first = text.strip().splitlines()[0][:40] if text.strip() else ""
    return f'a text file of {size} bytes beginning "{first}"'


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
    except (RuntimeError, EOFError, KeyError, IndexError, ValueError, TypeError, AttributeError) as exc:
        # torch's unpickler on a text file raises whatever the first bytes make it do ("KeyError: 101")
        raise CheckpointError(f"checkpoint {path} is not a torch checkpoint: {_what_file(path)}") from exc
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


# ---- stripping: the final, smaller file ----

# plain data that YOLOv5's checkpoints pickle beside the model (best_fitness is a numpy array, opt holds paths)
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


# ---- reading a checkpoint to start from: ours, or YOLOv5's without running its pickle ----

FOREIGN_KEY = "foreign"  # set in load_pretrained's dict when the file was YOLOv5's, not ours


def yolov5_to_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a YOLOv5 checkpoint and return it in our checkpoint format (fp32, epoch -1: not resumable).

    Besides the :data:`~ddp_utils.engine.CHECKPOINT_KEYS`, it has ``names`` (the class names)
    and ``converted_from`` (the source file).

    Raises:
        FileNotFoundError, ForeignCheckpointError: see :func:`~ddp_utils.yolo.foreign.read_yolov5_checkpoint`.
    """
    read = read_yolov5_checkpoint(path)
    model, report = yolov5_model(read, str(path))
    best = read["best_fitness"]
    ckpt = build_checkpoint(
        model, epoch=-1, best_fitness=float(best) if isinstance(best, (int, float)) else 0.0, hyp=read["hyp"]
    )
    ckpt.update(names=list(model.names), converted_from=str(path))
    derived = f", {len(report['derived'])} derived ones recomputed" if report["derived"] else ""
    LOGGER.info(
        f"{path}: read {report['transferred']} tensors of a {read['class_path']} without unpickling it{derived}"
    )
    return ckpt


def convert_yolov5_checkpoint(src: str | Path, dst: str | Path | None = None) -> Path:
    """Write a YOLOv5 checkpoint as ours; ``dst`` defaults to ``<stem>-ddp.pt`` beside ``src``.

    Examples:
        >>> convert_yolov5_checkpoint("yolov5s.pt")  # doctest: +SKIP
        PosixPath('yolov5s-ddp.pt')
    """
    src = Path(src)
    dst = Path(dst) if dst is not None else src.with_name(f"{src.stem}-ddp.pt")
    ckpt = yolov5_to_checkpoint(src)
    save_checkpoint(ckpt, dst)
    return dst


def load_pretrained(path: str | Path) -> dict[str, Any]:
    """A checkpoint dict in our format from our checkpoint or from YOLOv5's (read without running it).

    For a YOLOv5 file the dict has ``ckpt["foreign"] == "yolov5"``: fine for ``--weights``, not for
    ``--resume`` (no optimizer, another program's options).

    A bare name of YOLOv5's released weights (``yolov5s.pt``, ``yolov5n6.pt``...) that is not a
    file here is downloaded first (:func:`~ddp_utils.downloads.released_weights`), as YOLOv5 does.

    Raises:
        FileNotFoundError: no such file (for a release name: nor could it be downloaded; the message
            names the URL to fetch by hand).
        CheckpointError: not a torch checkpoint.
        ForeignCheckpointError: a pickled model this reader cannot map (an Ultralytics 8 model, a
            pickle that tries to call something, an unknown layout).
    """
    if not Path(path).exists():  # YOLOv5's habit: --weights yolov5s.pt fetches its release by name
        try:
            path = released_weights(path) or path
        except DownloadError as exc:
            raise FileNotFoundError(str(exc)) from None
    try:
        return load_checkpoint(path)
    except UnsafeCheckpointError:
        pass  # pickled objects: YOLOv5's layout, read without unpickling
    ckpt = yolov5_to_checkpoint(path)
    ckpt[FOREIGN_KEY] = "yolov5"
    return ckpt


def foreign_resume_message(path: str | Path) -> str:
    """The one-line refusal for ``--resume`` of a checkpoint :func:`load_pretrained` marked foreign."""
    return f"{path} is a YOLOv5 checkpoint: resume is only for ddp_utils runs; fine-tune from it with --weights {path}"
