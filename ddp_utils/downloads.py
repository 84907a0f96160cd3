"""Fetching a URL to a file: streamed with a progress bar, its length and sha256 checked.

Used for datasets (:mod:`ddp_utils.data.download`) and released weights. The caller writes to a
temporary file and renames it, so an interrupted download never looks complete.
"""

from __future__ import annotations

import hashlib
import logging
import urllib.request
from pathlib import Path
from typing import Any

from .log import LOGGER
from .progress import progress

_CHUNK = 1 << 20


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


def fetch_url(url: str, target: Path, sha256: str | None = None) -> None:
    """Copy ``url`` to ``target``; DownloadError names the URL when it fails, is short or mismatches ``sha256``."""
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
