"""Fetching a URL to a file: streamed with a progress bar, its length and sha256 checked.

Used for datasets (:mod:`ddp_utils.data.download`) and YOLOv5's released weights
(:func:`released_weights`: ``--weights yolov5s.pt`` when no such file is here, as YOLOv5 does). The
caller writes to a temporary file and renames it, so an interrupted download never looks complete.
"""

from __future__ import annotations

import hashlib
import logging
import os
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

from .files import mkstemp_shared
from .log import LOGGER
from .progress import progress

_CHUNK = 1 << 20
# YOLOv5's v7.0 release assets of its detection models (what its attempt_download fetches by name)
YOLOV5_RELEASE_URL = "https://github.com/ultralytics/yolov5/releases/download/v7.0"
YOLOV5_RELEASED = tuple(f"yolov5{size}{p6}.pt" for size in "nsmlx" for p6 in ("", "6"))
RELEASE_URL_ENV = "DDP_UTILS_YOLOV5_RELEASE_URL"  # another base URL (a mirror inside a cluster)
WEIGHTS_DIR_ENV = "DDP_UTILS_WEIGHTS_DIR"  # where downloaded weights are kept


class DownloadError(RuntimeError):
    """A download failed or gave a damaged or unsafe file; the message names the URL."""


def _stream(url: str, target: Path, digest: Any) -> int | None:
    """Copy the URL's body to ``target``, feeding ``digest``; returns the announced length."""
    show = LOGGER.isEnabledFor(logging.INFO)
    with urllib.request.urlopen(url, timeout=60) as response, open(target, "wb") as f:
        total = int(response.headers.get("Content-Length") or 0) or None
        with progress(
            total, desc=f"downloading {url}", mode=None if show else "off", unit="B", unit_scale=True, unit_divisor=1024
        ) as bar:
            while chunk := response.read(_CHUNK):
                f.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
    return total


def fetch_url(url: str, target: Path, sha256: str | None = None) -> str:
    """Copy ``url`` to ``target``; DownloadError names the URL when it fails, is short or mismatches ``sha256``.

    Returns:
        The sha256 hex digest of what was received.
    """
    digest = hashlib.sha256()
    try:
        total = _stream(url, target, digest)
    except OSError as exc:  # URLError, HTTPError, timeouts, a full disk
        raise DownloadError(f"download {url}: {exc}") from exc
    received = target.stat().st_size
    if total is not None and received != total:  # http.client does not raise when the server hangs up early
        raise DownloadError(f"download {url}: incomplete, got {received} of {total} bytes (connection closed)")
    if sha256 is not None and digest.hexdigest() != sha256.lower():
        raise DownloadError(f"download {url}: sha256 mismatch (expected {sha256.lower()}, got {digest.hexdigest()})")
    return digest.hexdigest()


def weights_dir() -> Path:
    """Where :func:`released_weights` keeps downloads: ``$DDP_UTILS_WEIGHTS_DIR``, else ``~/.cache/ddp_utils/weights``.

    Examples:
        >>> weights_dir().name
        'weights'
    """
    configured = os.environ.get(WEIGHTS_DIR_ENV, "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "ddp_utils" / "weights"


def release_url(name: str) -> str:
    """The URL of one of YOLOv5's released checkpoints (``$DDP_UTILS_YOLOV5_RELEASE_URL`` replaces the base).

    Examples:
        >>> os.environ.pop(RELEASE_URL_ENV, None) and None
        >>> release_url("yolov5s.pt")
        'https://github.com/ultralytics/yolov5/releases/download/v7.0/yolov5s.pt'
    """
    base = os.environ.get(RELEASE_URL_ENV, "").strip() or YOLOV5_RELEASE_URL
    return f"{base.rstrip('/')}/{name}"


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _check_zip(path: Path, url: str) -> None:
    """A torch checkpoint is a zip archive with a CRC per member: a damaged download fails here."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError) as exc:
        raise DownloadError(f"download {url}: not a torch checkpoint ({exc})") from None
    if bad is not None:
        raise DownloadError(f"download {url}: damaged, member {bad} fails its CRC check")


def released_weights(name: str | Path) -> Path | None:
    """YOLOv5's released checkpoint ``name`` (``yolov5s.pt``...), downloaded into :func:`weights_dir` on first use.

    For ``--weights yolov5s.pt`` when no such file is here, as YOLOv5 does. The download goes to a
    temporary file in the cache directory; its announced length and every zip member's CRC are
    checked, and its sha256 is recorded beside it (``yolov5s.pt.sha256``) before it is renamed
    into place. A cached copy is used when it still has that sha256; otherwise it is fetched again.
    The file is only downloaded: read it with the safe reader
    (:func:`ddp_utils.run.checkpoint.load_pretrained`), which runs nothing in it.

    Args:
        name: a bare file name; other names (a path, another file) get None.

    Returns:
        The local file, or None when ``name`` is not a YOLOv5 release asset.

    Raises:
        DownloadError: the download failed or gave a damaged file; one line naming the URL to
            fetch by hand and where to put it.

    Examples:
        >>> released_weights("runs/exp/weights/best.pt") is None  # not a release asset: not fetched
        True
    """
    name = str(name)
    if Path(name).name != name or name not in YOLOV5_RELEASED:
        return None
    directory, url = weights_dir(), release_url(name)
    target, recorded = directory / name, directory / f"{name}.sha256"
    if target.is_file():
        if recorded.is_file() and recorded.read_text().strip() == _file_sha256(target):
            return target
        LOGGER.warning(f"{target}: not the file downloaded before (sha256 differs or is missing), fetching it again")
    tmp = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = mkstemp_shared(directory, prefix=f".{name}.")
        os.close(fd)
        LOGGER.info(f"{name} is not here: downloading YOLOv5's release from {url} to {target}")
        sha256 = fetch_url(url, Path(tmp))
        _check_zip(Path(tmp), url)
        recorded.write_text(sha256 + "\n")
        os.replace(tmp, target)
        tmp = None
    except (DownloadError, OSError) as exc:
        cause = str(exc).removeprefix(f"download {url}: ").splitlines()[0] if str(exc) else type(exc).__name__
        raise DownloadError(
            f"{name}: no such file here, and YOLOv5's release could not be downloaded ({cause}); "
            f"fetch {url} by hand and give its path, or put it in {directory}"
        ) from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return target
