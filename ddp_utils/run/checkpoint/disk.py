"""Writing checkpoints atomically (at once or in a background thread) and reading them without unpickling code."""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import pickle
import re
import secrets
import shutil
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
from .integrity import check_integrity

_COPY_CHUNK = 16 * 2**20  # bytes per read where a further file of a save is copied, not linked


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


def _atomic_write(path: str | Path, write: Callable[[BinaryIO], Any], same_as: Path | None = None) -> Path:
    """Fill a temp file beside ``path`` with ``write`` (or hard-link ``same_as``, a finished file, to one), then
    fsync it, rename it over ``path`` and fsync the directory; a failure removes the temp file."""
    path = Path(path)
    tmp_name: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(path)
        prefix = f".{path.name}.{os.getpid()}."
        if same_as is not None:
            tmp_name = _link_temp(same_as, path.parent, prefix)  # its bytes are fsynced already
        if tmp_name is None:
            fd, tmp_name = mkstemp_shared(path.parent, prefix=prefix)
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


def _link_temp(source: Path, directory: Path, prefix: str) -> str | None:
    """A new hard link to ``source`` named like a temp file of ``directory``; None where links fail (another
    device, a file system without them), and the caller copies instead."""
    for _ in range(100):
        name = os.path.join(directory, f"{prefix}{secrets.token_hex(4)}.tmp")
        try:
            os.link(source, name)
        except FileExistsError:
            continue
        except OSError:
            return None
        return name
    return None


def _copy_from(source: Path) -> Callable[[BinaryIO], Any]:
    def copy(f: BinaryIO) -> None:
        with open(source, "rb") as src:
            shutil.copyfileobj(src, f, _COPY_CHUNK)

    return copy


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
    """``torch.save`` a checkpoint once, streamed into the first path's temp file, and give every further path the
    same bytes; each path atomically (temp file, fsync, rename, directory fsync), in order.

    No serialised copy is held in memory: ``torch.save`` writes each tensor of the snapshot straight
    to the file. A further path (``best.pt``, ``epochN.pt`` beside ``last.pt``) is a hard link of the
    file just written, under a temp name renamed into place, or a chunked copy of it where links fail
    (another device, a file system without them). The files of one save may so share their bytes on
    disk: replace them (as every writer here does), never write into them. The caller checks the
    checkpoint first (:func:`~ddp_utils.run.checkpoint.check_plain`): a background save checks in
    its caller's thread, before handing over.

    Returns:
        The paths written.

    Raises:
        CheckpointWriteError: a write failed; the file there is as it was, the ones before it are new.

    Examples:
        >>> import tempfile
        >>> weights = Path(tempfile.mkdtemp())
        >>> last, best = write_serialised({"epoch": 3}, [weights / "last.pt", weights / "best.pt"])
        >>> last.read_bytes() == best.read_bytes(), load_checkpoint(best)["epoch"]
        (True, 3)
    """
    if not paths:
        return []
    first = _atomic_write(paths[0], lambda f: torch.save(dict(ckpt), f))
    return [first] + [_atomic_write(path, _copy_from(first), same_as=first) for path in paths[1:]]


class BackgroundWriter:
    """Serialise a checkpoint and write it to its files in a thread, one save after another, in order.

    The caller makes the snapshot first (:func:`build_checkpoint` copies every tensor to host
    memory), so training goes on while ``torch.save`` and the disk work: the step is held up only
    for the copy. A save waits for the one before it, so files are never written out of order (a
    periodic ``last.pt`` can never land after a newer one).

    A failed write is reported at once, from the writer thread: one warning on
    :data:`~ddp_utils.log.LOGGER` naming the file, the cause and whether the previous file is intact
    (the :class:`CheckpointWriteError`'s message). It costs no later save: the next :meth:`submit`
    writes as usual, and :meth:`wait` tells whether the last save landed.

    Attributes:
        last_seconds: how long the last finished save took in its thread (serialise and write).
        last_error: the :class:`CheckpointWriteError` of the last save that failed (None: none has);
            a later save that lands leaves it, :meth:`wait` says whether the latest one did.
        failures: how many saves failed so far.

    Examples:
        >>> import tempfile
        >>> writer = BackgroundWriter()
        >>> target = Path(tempfile.mkdtemp()) / "last.pt"
        >>> writer.submit({"epoch": 3}, [target])
        >>> writer.wait(), writer.failures, load_checkpoint(target)["epoch"]
        (True, 0, 3)
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._landed = True  # whether the last save handed over is on disk (nothing handed over: nothing lost)
        self.last_seconds = 0.0
        self.last_error: CheckpointWriteError | None = None
        self.failures = 0

    def submit(
        self,
        ckpt: Mapping[str, Any],
        paths: Sequence[str | Path],
        landed: Callable[[float], None] | None = None,
        goes_on: bool = True,
    ) -> None:
        """Write ``ckpt`` (a host snapshot) to ``paths`` in the background, after any save still running.

        An earlier save that failed was reported when it failed; this one is written all the same.
        ``landed`` is called in the writer's thread, with the seconds the write took, once every file is whole
        on disk (renamed into place and fsynced); never for a save that failed. ``goes_on``: training goes on
        after this save, so the warning of a failed write says that the next save is tried; False for a run's
        final or stop save, whose failure the run itself reports.

        Raises:
            TypeError: an entry of ``ckpt`` is not a plain type (checked here, in the caller's thread).
        """
        self.wait()
        check_plain(dict(ckpt))
        self._landed = False
        # not a daemon: an interpreter that exits (a stopped run) still finishes the file
        args = (ckpt, list(paths), landed, goes_on)
        self._thread = threading.Thread(target=self._write, args=args, name="checkpoint-writer")
        self._thread.start()

    def _write(
        self, ckpt: Mapping[str, Any], paths: list[str | Path], landed: Callable[[float], None] | None, goes_on: bool
    ) -> None:
        start = time.perf_counter()
        try:
            write_serialised(ckpt, paths)
            self._landed = True
            if landed is not None:
                landed(time.perf_counter() - start)
        except Exception as exc:  # whatever it is, training goes on and the next save is tried
            if not isinstance(exc, CheckpointWriteError):  # not the disk (those come wrapped): said the same way
                reason = f"{type(exc).__name__}: {exc}"
                exc = CheckpointWriteError(errno.EIO, f"could not save checkpoint {paths[0]}: {reason}")
            self.last_error = exc
            self.failures += 1
            LOGGER.warning(
                f"{exc.strerror}; training goes on, the next save is tried as usual" if goes_on else exc.strerror
            )
        finally:
            self.last_seconds = time.perf_counter() - start

    def wait(self) -> bool:
        """Return, when every save handed over is written or has failed, whether the last one is on disk.

        Returns:
            True when the last save handed over landed (or none was), False when it failed (it was
            reported when it failed; :attr:`last_error` holds it).
        """
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return self._landed

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
        return f"a zip archive of {size} bytes without a torch checkpoint in it"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return f"{size} bytes of binary data that torch cannot read (truncated, or another format)"
    first = text.strip().splitlines()[0][:40] if text.strip() else ""
    return f'a text file of {size} bytes beginning "{first}"'


def _raise_if_damaged(path: Path, error: BaseException) -> None:
    """Raise :class:`DamagedCheckpointError` from ``error`` when ``path`` is a checkpoint archive that is not whole."""
    try:
        check_integrity(path)
    except OSError:  # gone or unreadable since: the loader's own error says enough
        return
    except CheckpointError as damaged:
        raise damaged from error


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
        DamagedCheckpointError: the file is a checkpoint that is not whole: empty, cut short, or with
            bytes changed (a :class:`CheckpointError`; found when the load fails: a change inside a
            tensor loads without error, :func:`~ddp_utils.run.checkpoint.check_integrity` finds it).
        CheckpointError: not a torch checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        _raise_if_damaged(path, exc)  # changed bytes in its pickle read as a refused object
        if not trusted:
            raise UnsafeCheckpointError(
                f"checkpoint {path} contains arbitrary Python objects{_unsupported_global(str(exc))}, "
                "not only tensors and plain values, so it was not loaded: unpickling it could run code. "
                "A YOLOv5 checkpoint is read without running it by ddp_utils.yolo.read_yolov5_checkpoint "
                "(train.py --weights takes it; python -m ddp_utils convert converts it); for any other file "
                "you trust, load_checkpoint(path, trusted=True)."
            ) from None
        unsafe = exc
    except (RuntimeError, EOFError, KeyError, IndexError, ValueError, TypeError, AttributeError, OSError) as exc:
        # torch's unpickler on a text file raises whatever the first bytes make it do ("KeyError: 101"),
        # its zip reader an OSError (EINVAL) on some archives cut short
        _raise_if_damaged(path, exc)
        if isinstance(exc, OSError):  # a read error, not the file's content
            raise
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
