"""Whether a checkpoint file is whole: cut short, or bytes changed on the storage, and a run's last good file.

``torch.load`` reads a checkpoint cut short as "not a zip archive", and one with bytes changed
inside a tensor without a word: it checks no checksum, so the tensors come out silently wrong.
The zip archive that ``torch.save`` writes holds a CRC-32 of every record, and
:func:`check_integrity` reads them all back against it (about as long as loading the file).
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from .format import CheckpointError

_CHUNK = 16 * 2**20  # bytes read at a time while checking a record


class DamagedCheckpointError(CheckpointError):
    """A checkpoint file is damaged: cut short, or bytes changed since it was written (its checksums differ).

    Attributes:
        path: the file.
        detail: what is wrong, e.g. ``"cut short at 12.3 MB: the end of the archive is missing"``.
    """

    def __init__(self, path: str | Path, detail: str) -> None:
        super().__init__(f"checkpoint {path} is damaged ({detail})")
        self.path, self.detail = Path(path), detail

    def __reduce__(self):  # pickles (broadcast to other ranks) with both arguments
        return type(self), (self.path, self.detail)


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size} bytes"


def check_integrity(path: str | Path) -> None:
    """Raise :class:`DamagedCheckpointError` when ``path`` is a checkpoint archive that is not whole.

    An empty file, one that begins with zeros (blocks lost in a crash read back as zeros), a zip
    archive without its end (cut short), with an unreadable directory or record,
    or whose records do not match their CRC-32 (records saved with torch's ``compute_crc32`` off
    carry none and are not checked). A file that is no zip archive at all (text, a legacy torch
    file) is not judged here: :func:`~ddp_utils.run.checkpoint.load_checkpoint` says what it is.

    Raises:
        DamagedCheckpointError: the message names the file and what is wrong.
        FileNotFoundError: there is no such file.

    Examples:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "last.pt"
        >>> torch.save({"w": torch.ones(1000)}, path)
        >>> check_integrity(path)
        >>> _ = path.write_bytes(path.read_bytes()[:2500])
        >>> try:
        ...     check_integrity(path)
        ... except DamagedCheckpointError as exc:
        ...     print(exc.detail)
        cut short at 2500 bytes: the end of the archive is missing
    """
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        raise DamagedCheckpointError(path, "the file is empty")
    with open(path, "rb") as f:
        head = f.read(4096)
    if not head.strip(b"\0"):
        raise DamagedCheckpointError(path, f"it begins with {len(head)} zero bytes: its data never reached the storage")
    if not head.startswith(b"PK\x03\x04"):
        return
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        if "not a zip file" in str(exc):  # no end-of-archive record: the end is missing
            detail = f"cut short at {_size(size)}: the end of the archive is missing"
            raise DamagedCheckpointError(path, detail) from None
        raise DamagedCheckpointError(path, f"its zip directory is unreadable: {exc}") from None
    except (ValueError, UnicodeDecodeError, EOFError, OSError) as exc:
        raise DamagedCheckpointError(path, f"its zip directory is unreadable: {type(exc).__name__}") from None
    with archive:
        for record in archive.infolist():
            try:
                with archive.open(record) as data:
                    while data.read(_CHUNK):
                        pass
            except zipfile.BadZipFile as exc:
                if "CRC" in str(exc):
                    if record.CRC == 0:  # saved without checksums
                        continue
                    raise DamagedCheckpointError(
                        path, f"{record.filename} does not match its CRC-32: bytes changed on the storage or in a copy"
                    ) from None
                raise DamagedCheckpointError(path, f"{record.filename} is unreadable: {exc}") from None
            except (ValueError, EOFError, OSError) as exc:
                raise DamagedCheckpointError(path, f"{record.filename} is unreadable: {exc}") from None


def _peek(path: Path) -> dict[str, Any] | None:
    """The checkpoint at ``path`` with its tensors memory-mapped, not read (cheap); None when it does not load."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # any file that does not load is no candidate
        return None
    return ckpt if isinstance(ckpt, dict) else None


def last_good_checkpoint(
    paths: Iterable[str | Path], progress: Callable[[Mapping[str, Any]], Any], resumable: bool = True
) -> tuple[Path, dict[str, Any]] | None:
    """Of ``paths``, the checkpoint furthest on (by ``progress``) that can resume training and is whole.

    Each file is opened cheaply (memory-mapped) to read what it records; with ``resumable``, one
    without optimizer state (stripped, converted) is passed over. The furthest on is then checked
    whole (:func:`check_integrity`) and loaded; if it fails, the next one is tried.

    Args:
        paths: the candidates (e.g. a run's ``best.pt`` and ``epochN.pt``).
        progress: a sortable key of how far a checkpoint is (e.g. its epoch and batch).
        resumable: only checkpoints with optimizer state and the run's options (False: any with weights).

    Returns:
        ``(path, checkpoint)`` loaded with ``weights_only``, or None when none qualifies.
    """
    candidates = []
    for path in map(Path, paths):
        ckpt = _peek(path)
        if ckpt is None or not isinstance(ckpt.get("model"), Mapping):
            continue
        if not resumable or (ckpt.get("optimizer") is not None and isinstance(ckpt.get("opt"), Mapping)):
            candidates.append((progress(ckpt), path.stat().st_mtime, path))
    for _, _, path in sorted(candidates, key=lambda c: c[:2], reverse=True):
        try:
            check_integrity(path)
            return path, torch.load(path, map_location="cpu", weights_only=True)  # as load_checkpoint reads it
        except Exception:  # damaged after all, or gone: the next one
            continue
    return None
