"""Data yamls and hyperparameter yamls: load, resolve paths, check, and fetch missing data.

A data yaml in the YOLOv5/Ultralytics format names a dataset root ``path``, the splits
``train``, ``val`` and ``test`` (each a directory, a ``.txt`` list of images, or a list of
these, relative to ``path``), the class ``names`` (a list or ``{id: name}``), optionally
``nc`` and a ``download``.

Where a relative ``path`` points:

1. against the yaml file's directory, when that directory exists there
   (``path: ../datasets/coco128`` beside a checkout works as written);
2. otherwise under the datasets directory, ``$DDP_UTILS_DATASETS_DIR`` or else
   ``./datasets`` of the current working directory, with leading ``..`` parts and a
   leading ``datasets/`` dropped (``../datasets/coco128`` -> ``<datasets dir>/coco128``).
   Shipped yamls name bare directories, so their data lands there.

A yaml without ``path`` keeps its splits relative to its own directory; a dict (no file)
resolves against the current working directory, then the datasets directory.

``download`` is a zip URL, a list of them, or a ``"module:function"`` generator. Each URL
item may be a mapping ``{url: ..., sha256: ..., dest: ...}``: the digest is checked and
``dest`` (relative to ``path``) is where the archive is unpacked. Archives are fetched to
a temporary file, unpacked into a temporary directory beside the dataset and moved into
place at the end, so an interrupted download never leaves a dataset that looks complete.
Members with absolute paths or ``..`` are refused before anything is written.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import re
import secrets
import shutil
import tempfile
import urllib.request
import zipfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import yaml
from tqdm import tqdm

from ..distributed import dist_info, torch_distributed_zero_first
from ..log import LOGGER
from ..yamls import find_asset

DATASETS_DIR_ENV = "DDP_UTILS_DATASETS_DIR"
# Module prefixes, comma-separated, whose generators a yaml's ``download`` may name besides ddp_utils'.
TRUSTED_GENERATORS_ENV = "DDP_UTILS_TRUSTED_GENERATORS"
_SPLITS = ("train", "val", "test")
MAX_CLASSES = 100_000  # ImageNet-21k has 21,841; far beyond any detection dataset
_GENERATOR = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_CHUNK = 1 << 20


class DataConfigError(ValueError):
    """A data or hyperparameter yaml is malformed; the message names the file and key."""


class DownloadError(RuntimeError):
    """Fetching a dataset failed or gave an unsafe or damaged archive; the message names the URL."""


def datasets_dir() -> Path:
    """Where datasets named by relative paths land: ``$DDP_UTILS_DATASETS_DIR``, else ``./datasets``.

    Examples:
        >>> datasets_dir().is_absolute()
        True
    """
    env = os.environ.get(DATASETS_DIR_ENV, "").strip()
    return Path(env).expanduser().resolve() if env else Path.cwd().resolve() / "datasets"


def _read_yaml(file: Path) -> dict[str, Any]:
    try:
        text = file.read_text()
    except OSError as exc:
        raise DataConfigError(f"{file}: cannot read ({exc})") from exc
    try:
        content = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise DataConfigError(f"{file}: not valid YAML ({exc})") from exc
    if not isinstance(content, dict):
        raise DataConfigError(
            f"{file}: expected a mapping of keys (path, train, val, names, ...), got {type(content).__name__}"
        )
    return content


def _find_yaml(kind: str, name: str | Path) -> Path:
    try:
        return find_asset(kind, name)
    except FileNotFoundError:
        if str(name).endswith((".yaml", ".yml")):
            raise
        return find_asset(kind, f"{name}.yaml")


def _normalise_names(data: dict[str, Any], where: str) -> dict[int, str]:
    names, nc = data.get("names"), data.get("nc")
    if nc is not None and (isinstance(nc, bool) or not isinstance(nc, int) or nc < 1):
        raise DataConfigError(f"{where}: key 'nc' must be a positive integer, got {nc!r}")
    if nc is not None and nc > MAX_CLASSES:  # placeholder names for a typo'd 10**12 would never finish
        raise DataConfigError(f"{where}: key 'nc' is {nc}, more than {MAX_CLASSES} classes; check the value")
    if names is None:
        if nc is None:
            raise DataConfigError(f"{where}: key 'names' is missing (a list of class names, or nc)")
        return {i: f"class{i}" for i in range(nc)}
    if isinstance(names, list):
        mapping = dict(enumerate(names))
    elif isinstance(names, dict):
        try:
            mapping = {int(k): v for k, v in names.items()}
        except (TypeError, ValueError):
            raise DataConfigError(
                f"{where}: key 'names' must map integer ids to names, got keys {list(names)}"
            ) from None
        if sorted(mapping) != list(range(len(mapping))):
            raise DataConfigError(f"{where}: key 'names' ids must be 0..{len(mapping) - 1}, got {sorted(mapping)}")
    else:
        raise DataConfigError(f"{where}: key 'names' must be a list or a mapping, got {type(names).__name__}")
    if not mapping:
        raise DataConfigError(f"{where}: key 'names' is empty")
    if nc is not None and nc != len(mapping):
        raise DataConfigError(f"{where}: key 'nc' is {nc} but 'names' has {len(mapping)} entries")
    return {i: str(mapping[i]) for i in sorted(mapping)}


def _resolve_root(data: dict[str, Any], yaml_file: Path | None, where: str) -> Path:
    raw = data.get("path")
    base = yaml_file.parent if yaml_file is not None else Path.cwd()
    if raw in (None, ""):
        return base.resolve()
    if not isinstance(raw, str):
        raise DataConfigError(f"{where}: key 'path' must be a string, got {raw!r}")
    path = Path(raw).expanduser()
    if path.is_absolute():
        return path
    beside = (base / path).resolve()
    if beside.is_dir():
        return beside
    parts = list(path.parts)
    while parts and parts[0] in ("..", "."):
        parts.pop(0)
    if parts[:1] == ["datasets"] and len(parts) > 1:
        parts.pop(0)
    return datasets_dir() / Path(*parts) if parts else datasets_dir()


def _resolve_split(value: Any, root: Path, key: str, where: str) -> str | list[str] | None:
    if value in (None, "", []):
        return None
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(item, str) and item for item in items):
        raise DataConfigError(f"{where}: key '{key}' must be a path or a list of paths, got {value!r}")
    resolved = [str(root / Path(item).expanduser()) for item in items]
    return resolved if isinstance(value, list) else resolved[0]


def _missing(data: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for key in ("train", "val"):
        value = data.get(key)
        for item in value if isinstance(value, list) else [value]:
            if item is not None and not Path(item).exists():
                out.append((key, item))
    return out


def check_dataset(data: str | Path | dict[str, Any], autodownload: bool = True) -> dict[str, Any]:
    """Load a data yaml (or dict), resolve its paths, and fetch the data when it is missing.

    Args:
        data: a bare shipped name ("coco128.yaml", "shapes"), a path to a yaml, or a dict.
        autodownload: run the yaml's ``download`` when train or val data is missing.

    Returns:
        The yaml's keys with absolute ``path``, ``train``, ``val``, ``test`` (str, list of
        str or None), ``names`` as ``{id: name}``, ``nc`` and ``yaml_file`` (None for a dict).

    Raises:
        DataConfigError: the yaml is malformed; the message names the file and key.
        FileNotFoundError: the yaml, or the data it names, does not exist.

    Examples:
        >>> d = check_dataset({"path": "/tmp", "train": ".", "val": ".", "names": ["cat"]})
        >>> d["nc"], d["names"], d["train"]
        (1, {0: 'cat'}, '/tmp')
    """
    if isinstance(data, dict):
        yaml_file, content = None, dict(data)
    else:
        yaml_file = _find_yaml("data", data).resolve()
        content = _read_yaml(yaml_file)
    where = str(yaml_file) if yaml_file is not None else "data dict"
    for key in ("train", "val"):
        if content.get(key) in (None, "", []):
            raise DataConfigError(f"{where}: key '{key}' is missing (a directory, an image list .txt, or a list)")
    names = _normalise_names(content, where)
    root = _resolve_root(content, yaml_file, where)
    content.update(path=str(root), names=names, nc=len(names), yaml_file=str(yaml_file) if yaml_file else None)
    for key in _SPLITS:
        content[key] = _resolve_split(content.get(key), root, key, where)

    # Every process enters the section, so the sections pair up across ranks even when
    # only some of them see the data missing; the node's first process fetches.
    with torch_distributed_zero_first(dist_info().local_rank):
        missing = _missing(content)
        if missing and content.get("download") and autodownload:
            listed = ", ".join(path for _, path in missing)
            LOGGER.info(f"{where}: dataset not found ({listed}); fetching it")
            run_download(content["download"], content, where)
            missing = _missing(content)
            if missing:
                key, path = missing[0]
                raise FileNotFoundError(
                    f"{where}: key '{key}': {path} is still missing after the download; "
                    "the archive's layout does not match the yaml"
                )
    if missing:
        key, path = missing[0]
        hint = "autodownload is off" if content.get("download") else "there is no 'download' key to fetch it"
        raise FileNotFoundError(f"{where}: key '{key}': {path} does not exist ({hint})")
    return content


def load_hyp(name_or_path: str | Path) -> dict[str, Any]:
    """Load a hyperparameter yaml: a bare name resolves to the shipped ``configs/hyps/``.

    Args:
        name_or_path: "hyp.scratch-low.yaml", "hyp.shapes" (suffix optional) or a path.

    Returns:
        The hyperparameters as a dict of numbers, in file order.

    Raises:
        FileNotFoundError: no such file, shipped or given.
        DataConfigError: the file is not a mapping of numbers; names the file and key.

    Examples:
        >>> hyp = load_hyp("hyp.scratch-low.yaml")
        >>> hyp["lr0"], hyp["mosaic"]
        (0.01, 1.0)
    """
    file = _find_yaml("configs/hyps", name_or_path)
    hyp = _read_yaml(file)
    for key, value in hyp.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DataConfigError(f"{file}: key '{key}' must be a number, got {value!r}")
    return hyp


# --- download -----------------------------------------------------------------------------------


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
            _fetch(url, archive, spec.get("sha256"))
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


def _stream(url: str, target: Path, digest: Any) -> int | None:
    """Copy the URL's body to ``target``, feeding ``digest``; returns the announced length."""
    show = LOGGER.isEnabledFor(logging.INFO)
    with urllib.request.urlopen(url, timeout=60) as response, open(target, "wb") as f:
        total = int(response.headers.get("Content-Length") or 0) or None
        with tqdm(
            total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=f"downloading {url}", disable=not show
        ) as bar:
            while chunk := response.read(_CHUNK):
                f.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
    return total


def _fetch(url: str, target: Path, sha256: str | None) -> None:
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


def hyp_value(hyp: Mapping[str, float] | None, key: str, default: float = 0.0) -> float:
    """A hyperparameter, or ``default`` when it or the whole dict is missing."""
    if not hyp:
        return default
    value = hyp.get(key, default)
    return default if value is None else float(value)
