"""Fetching a dataset that a data yaml's ``download`` names: zip URLs or a trusted generator.

Each URL item may be a mapping ``{url: ..., sha256: ..., dest: ...}``: the digest is checked and
``dest`` (relative to ``path``) is where the archive is unpacked. Archives are fetched to a
temporary file, unpacked into a temporary directory beside the dataset and moved into place at
the end, so an interrupted download never leaves a dataset that looks complete. Members with
absolute paths or ``..`` are refused before anything is written.
"""

from __future__ import annotations

import importlib
import os
import re
import secrets
import shutil
import tempfile
import zipfile
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from ..downloads import _CHUNK, DownloadError, fetch_url
from ..log import LOGGER
from ..yamls import DataConfigError

TRUSTED_GENERATORS_ENV = "DDP_UTILS_TRUSTED_GENERATORS"
_GENERATOR = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def run_download(download: Any, data: dict[str, Any], where: str = "data") -> None:
    """Fetch a dataset: zip URLs (with optional sha256 and dest) or a ``"module:function"`` generator.

    A generator is called as ``function(data)`` with the resolved data dict and must
    write the dataset under ``data["path"]``; its module must be in ddp_utils or named in
    ``$DDP_UTILS_TRUSTED_GENERATORS`` (comma-separated module prefixes). Shell commands and
    Python snippets, which YOLOv5 yamls may hold, are refused: a yaml should not run
    arbitrary code.

    Args:
        download: the yaml's ``download`` value.
        data: the resolved data dict (absolute ``path``).
        where: the yaml file, for error messages.

    Raises:
        DataConfigError: ``download`` is neither URLs nor ``module:function``, or names a
            generator outside the trusted modules.
        DownloadError: fetching or unpacking failed; nothing is left at ``data["path"]``
            that was not there before.
    """
    if isinstance(download, str) and _GENERATOR.match(download) and "://" not in download:
        module_name, func_name = download.split(":")
        _check_trusted_generator(module_name, download, where)
        try:
            func = getattr(importlib.import_module(module_name), func_name)
        except (ImportError, AttributeError) as exc:
            raise DataConfigError(f"{where}: key 'download': cannot import {download} ({exc})") from exc
        func(data)
        return
    items = download if isinstance(download, list) else [download]
    specs = [_download_spec(item, where) for item in items]
    fetch_zips(specs, Path(data["path"]))


def _check_trusted_generator(module_name: str, download: str, where: str) -> None:
    # A yaml may come from a stranger: "subprocess:Popen" would run a command made of its keys,
    # and importing a module runs its code. Only ddp_utils' generators, and modules the user
    # names in the environment, are imported.
    trusted = ["ddp_utils", *(p.strip() for p in os.environ.get(TRUSTED_GENERATORS_ENV, "").split(",") if p.strip())]
    if not any(module_name == p or module_name.startswith(p + ".") for p in trusted):
        raise DataConfigError(
            f"{where}: key 'download': generator {download!r} is outside ddp_utils and was not run; "
            f"if you trust it, set {TRUSTED_GENERATORS_ENV}={module_name}"
        )


def _download_spec(item: Any, where: str) -> dict[str, Any]:
    spec = {"url": item} if isinstance(item, str) else item
    if not isinstance(spec, dict) or not isinstance(spec.get("url"), str):
        raise DataConfigError(
            f"{where}: key 'download': expected a URL, a list of URLs or module:function, got {item!r}"
        )
    if not spec["url"].startswith(("http://", "https://", "file://")):
        raise DataConfigError(
            f"{where}: key 'download': {spec['url']!r} is neither a zip URL nor module:function "
            "(scripts in yamls are not run)"
        )
    dest = spec.get("dest", ".")
    if not isinstance(dest, str) or _member_parts(dest) is None:
        raise DataConfigError(f"{where}: key 'download': dest {dest!r} of {spec['url']} must stay inside 'path'")
    digest = spec.get("sha256")
    if digest is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", str(digest)):
        raise DataConfigError(f"{where}: key 'download': sha256 of {spec['url']} is not 64 hex digits")
    return spec


def fetch_zips(specs: list[dict[str, Any]], root: Path) -> Path:
    """Download zip archives and unpack them into ``root``, atomically.

    Args:
        specs: one mapping per archive: ``url``, optional ``sha256`` and ``dest`` (a
            directory relative to ``root``; default ``root`` itself).
        root: the dataset directory.

    Returns:
        ``root``.
    """
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.partial-", dir=root.parent))
    try:
        for spec in specs:
            url = spec["url"]
            archive = staging / f"download-{secrets.token_hex(4)}.zip"
            fetch_url(url, archive, spec.get("sha256"))
            parts = _member_parts(str(spec.get("dest", ".")))
            if parts is None:
                raise DataConfigError(f"download {url}: dest {spec['dest']!r} leaves the dataset directory")
            dest = staging.joinpath("tree", *parts)
            _safe_unzip(archive, dest, strip=dest.name if parts else root.name, url=url)
            archive.unlink()
        _merge_into(staging / "tree", root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    LOGGER.info(f"dataset ready in {root}")
    return root


def _member_parts(name: str) -> list[str] | None:
    """The member's path parts, or None when it is absolute or climbs out with ``..``."""
    if PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute() or PureWindowsPath(name).drive:
        return None
    parts = [p for p in re.split(r"[\\/]+", name) if p not in ("", ".")]
    return None if ".." in parts else parts


def _safe_unzip(archive: Path, dest: Path, strip: str, url: str) -> None:
    """Unpack after checking every member; a single top folder named ``strip`` is not nested again."""
    try:
        zf = zipfile.ZipFile(archive)
    except zipfile.BadZipFile as exc:
        raise DownloadError(f"download {url}: not a zip archive ({exc})") from exc
    with zf:
        members = []
        for info in zf.infolist():
            parts = _member_parts(info.filename)
            if parts is None:
                raise DownloadError(
                    f"download {url}: member {info.filename!r} would be written outside the dataset directory; "
                    "refusing the whole archive"
                )
            if parts:
                members.append((info, parts))
        if members and all(parts[0] == strip for _, parts in members) and any(len(p) > 1 for _, p in members):
            members = [(info, parts[1:]) for info, parts in members if len(parts) > 1]
        for info, parts in members:
            target = dest.joinpath(*parts)
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, _CHUNK)


def _merge_into(tree: Path, root: Path) -> None:
    """Move the unpacked tree into place: one rename when ``root`` is new, else entry by entry."""
    if not tree.exists():
        raise DownloadError(f"download for {root}: the archives were empty")
    if not root.exists():
        try:
            os.rename(tree, root)
            return
        except OSError:
            if not root.is_dir():
                raise
            # another node sharing this disk put its copy in place first: add what is missing
    for entry in tree.iterdir():
        target = root / entry.name
        if target.is_dir() and entry.is_dir():
            _merge_into(entry, target)
        elif not target.exists():
            os.rename(entry, target)
