"""Writing checkpoints atomically (at once or in a background thread) and reading them without unpickling code."""

from __future__ import annotations

import contextlib
import errno
import glob
import io
import os
import pickle
import re
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Callable

import torch

from ...files import mkstemp_shared
from ...log import LOGGER
from .format import CheckpointError, CheckpointWriteError, UnsafeCheckpointError, check_plain


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


def save_checkpoint(ckpt: Mapping[str, Any], path: str | Path) -> Path:
    """Save a checkpoint atomically (on whichever process calls it: in DDP, the caller makes that rank 0).

    Args:
        ckpt: a dict of plain values (:func:`build_checkpoint`); checked with :func:`check_plain`
            first so a checkpoint that could not be loaded safely is never written.
        path: the target file (``weights/last.pt``); its directory is created.

    Returns:
        The path written.

    Raises:
        TypeError: an entry is not a plain type (the message names it).
        CheckpointWriteError: the write failed; the previous file is intact.
    """
    check_plain(dict(ckpt))
    atomic_torch_save(dict(ckpt), path)
    return Path(path)


def write_serialised(ckpt: Mapping[str, Any], paths: Sequence[str | Path]) -> list[Path]:
    """``torch.save`` a checkpoint once and write the same bytes atomically to every path, in order.

    The caller checks it first (:func:`~ddp_utils.engine.checkpoint.check_plain`): a background save
    checks in its caller's thread, before handing over.

    Raises:
        CheckpointWriteError: a write failed; the file there is as it was, the ones before it are new.
    """
    buffer = io.BytesIO()
    torch.save(dict(ckpt), buffer)
    data = buffer.getvalue()
    return [atomic_write_bytes(data, path) for path in paths]


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
            write_serialised(ckpt, paths)
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
