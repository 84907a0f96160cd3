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

:class:`Checkpointer` is what a training loop uses: it owns a run's ``last.pt``,
``best.pt`` and ``epochN.pt``, builds the checkpoint once per epoch and writes the same
bytes to each file that is due.
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
import tempfile
import warnings
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path, PurePath
from typing import Any, BinaryIO, Callable

import torch
from torch import nn

from ..dist import is_main_process
from ..log import LOGGER
from .modules import de_parallel

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
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
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
                "A YOLOv5 checkpoint is read without running it by ddp_utils.detect.read_yolov5_checkpoint "
                "(train.py --weights takes it; python -m ddp_utils.convert converts it); for any other file "
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
                "`python -m ddp_utils.convert`; a file you trust loads with load_checkpoint(path, trusted=True)."
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


def strip_optimizer(
    f: str | Path = "best.pt",
    s: str | Path | None = "",
    half: bool = True,
    *,
    path: str | Path | None = None,
    out: str | Path | None = None,
) -> Path | None:
    """Make a final, smaller checkpoint: drop the optimizer state, store fp16 weights (YOLOv5's call form).

    ``strip_optimizer(f="best.pt", s="")`` as YOLOv5 calls it: ``s`` empty (or None) overwrites
    ``f``. Our checkpoints (:func:`build_checkpoint`) lose ``optimizer``, ``scaler`` and
    ``train_model``, get fp16 weights and ``epoch = -1`` (not resumable), and stay loadable with
    ``weights_only``. A checkpoint in YOLOv5's layout holding a pickled ddp_utils ``Model`` (what
    YOLOv5's train.py saves when it trains our model) is read without running foreign code and
    stripped as YOLOv5 strips it: ``ema`` becomes ``model`` (fp16, frozen), and ``optimizer``,
    ``best_fitness``, ``ema``, ``updates`` become None. Written atomically, on the main process
    only (others return None).

    Args:
        f: the checkpoint file.
        s: where to write; ``f`` itself when empty or None.
        half: convert floating-point weights to fp16.
        path: our former name of ``f`` (keyword only).
        out: our former name of ``s`` (keyword only).

    Returns:
        The written path, or None on other ranks.

    Raises:
        FileNotFoundError: ``f`` does not exist.
        UnsafeCheckpointError: ``f`` pickles classes other than ddp_utils' and torch.nn's modules.
        CheckpointError: ``f`` has no model to strip.
    """
    source = Path(path if path is not None else f)
    target = Path(out or s or source)
    if not is_main_process():
        return None
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
    else:
        raise CheckpointError(f"checkpoint {source} has no 'model' (a state_dict or a module) to strip")
    atomic_torch_save(ckpt, target)
    saved_as = f", saved as {target}" if target != source else ""
    LOGGER.info(f"Optimizer stripped from {source}{saved_as}, {target.stat().st_size / 1e6:.1f}MB")
    return target


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


class Checkpointer:
    """Own a run's checkpoint files: ``weights/last.pt``, ``best.pt`` and ``epochN.pt``.

    Each :meth:`save` builds the checkpoint once (EMA weights, the raw training weights,
    optimizer, scaler, options, hyperparameters), serialises it once, and writes the same
    bytes atomically to every file that is due. Only the main process writes; elsewhere
    :meth:`save` returns an empty list at once, so every rank may call it.

    Args:
        save_dir: the run directory; files go to ``save_dir/weights``.
        opt: the run's options (stored in every checkpoint).
        hyp: the hyperparameters the run used (stored as given: the same as ``hyp.yaml``).
        save_period: also keep ``epoch{N}.pt`` every ``save_period`` epochs (<= 0: never).

    Examples:
        >>> import tempfile
        >>> from ddp_utils.engine import ModelEMA
        >>> model = nn.Linear(2, 1)
        >>> ckpts = Checkpointer(tempfile.mkdtemp(), opt={"epochs": 3}, hyp={"lr0": 0.01}, save_period=1)
        >>> [p.name for p in ckpts.save(0, model, ModelEMA(model), best=True)]
        ['last.pt', 'best.pt', 'epoch0.pt']
    """

    def __init__(
        self, save_dir: str | Path, opt: Any = None, hyp: Mapping[str, Any] | None = None, save_period: int = -1
    ) -> None:
        self.weights_dir = Path(save_dir) / "weights"
        self.last = self.weights_dir / "last.pt"
        self.best = self.weights_dir / "best.pt"
        self.opt = to_plain(opt) if opt is not None else {}
        self.hyp = to_plain(dict(hyp)) if hyp is not None else {}
        self.save_period = int(save_period)

    def targets(self, epoch: int, best: bool = False, periodic: bool = True) -> list[Path]:
        """The files a save after ``epoch`` writes: last, then best when ``best``, then epochN when due."""
        paths = [self.last]
        if best:
            paths.append(self.best)
        if periodic and self.save_period > 0 and (epoch + 1) % self.save_period == 0:
            paths.append(self.weights_dir / f"epoch{epoch}.pt")
        return paths

    def save(
        self,
        epoch: int,
        model: nn.Module,
        ema: Any,
        optimizer: torch.optim.Optimizer | None = None,
        scaler: Any | None = None,
        best_fitness: float = 0.0,
        best: bool = False,
        periodic: bool = True,
    ) -> list[Path]:
        """Write the checkpoint of ``epoch`` to last.pt (and best.pt, epochN.pt when due).

        Args:
            epoch: the last finished epoch (-1: none yet; resuming redoes epoch 0).
            model: the model being trained (wrappers are looked through).
            ema: its :class:`~ddp_utils.engine.ModelEMA`; ``ema.ema`` is the checkpoint's ``model``.
            optimizer: its state is stored for resuming.
            scaler: a GradScaler; stored only when enabled.
            best_fitness: the best fitness so far.
            best: this epoch is the best so far: also write best.pt.
            periodic: whether epochN.pt may be due (False for a save of an interrupted epoch).

        Returns:
            The paths written (empty on other ranks).

        Raises:
            CheckpointWriteError: a write failed; the previous file there is intact.
        """
        if not is_main_process():
            return []
        enabled = scaler is not None and getattr(scaler, "is_enabled", lambda: True)()
        ckpt = build_checkpoint(
            ema.ema,
            train_model=model,
            optimizer=optimizer,
            scaler=scaler if enabled else None,
            ema_updates=ema.updates,
            epoch=epoch,
            best_fitness=best_fitness,
            opt=self.opt,
            hyp=self.hyp,
        )
        check_plain(ckpt)
        buffer = io.BytesIO()
        torch.save(ckpt, buffer)
        data = buffer.getvalue()
        return [atomic_write_bytes(data, path) for path in self.targets(epoch, best, periodic)]
