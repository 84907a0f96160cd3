"""Data yamls: load, resolve paths, check, and fetch missing data (hyperparameter yamls: ``ddp_utils.hyp``).

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

import os
from pathlib import Path
from typing import Any

from ..distributed import dist_info, torch_distributed_zero_first
from ..downloads import DownloadError
from ..log import LOGGER
from ..yamls import DataConfigError, find_yaml, read_yaml
from .download import run_download

DATASETS_DIR_ENV = "DDP_UTILS_DATASETS_DIR"
# Module prefixes, comma-separated, whose generators a yaml's ``download`` may name besides ddp_utils'.
_SPLITS = ("train", "val", "test")
MAX_CLASSES = 100_000  # ImageNet-21k has 21,841; far beyond any detection dataset


def datasets_dir() -> Path:
    """Where datasets named by relative paths land: ``$DDP_UTILS_DATASETS_DIR``, else ``./datasets``.

    Examples:
        >>> datasets_dir().is_absolute()
        True
    """
    env = os.environ.get(DATASETS_DIR_ENV, "").strip()
    return Path(env).expanduser().resolve() if env else Path.cwd().resolve() / "datasets"


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


def _user_path(value: str, key: str, where: str) -> Path:
    """A path from the yaml, ``~`` expanded; one that cannot name a file is a :class:`DataConfigError`."""
    if "\x00" in value:  # the OS refuses it with a ValueError far from the yaml
        raise DataConfigError(f"{where}: key '{key}' has a NUL character: {value!r}")
    try:
        return Path(value).expanduser()
    except RuntimeError:  # "~someone" with no such user
        raise DataConfigError(f"{where}: key '{key}': {value!r} names no home directory") from None


def _resolve_root(data: dict[str, Any], yaml_file: Path | None, where: str) -> Path:
    raw = data.get("path")
    base = yaml_file.parent if yaml_file is not None else Path.cwd()
    if raw in (None, ""):
        return base.resolve()
    if not isinstance(raw, str):
        raise DataConfigError(f"{where}: key 'path' must be a string, got {raw!r}")
    path = _user_path(raw, "path", where)
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
    resolved = [str(root / _user_path(item, key, where)) for item in items]
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
        DownloadError: the data is missing and fetching it failed (offline, say): one line naming the URL.

    Examples:
        >>> d = check_dataset({"path": "/tmp", "train": ".", "val": ".", "names": ["cat"]})
        >>> d["nc"], d["names"], d["train"]
        (1, {0: 'cat'}, '/tmp')
    """
    if isinstance(data, dict):
        yaml_file, content = None, dict(data)
    else:
        yaml_file = find_yaml("data", data).resolve()
        content = read_yaml(yaml_file)
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
    with torch_distributed_zero_first(dist_info().local_rank, key=f"dataset:{root}"):
        missing = _missing(content)
        if missing and content.get("download") and autodownload:
            listed = ", ".join(path for _, path in missing)
            LOGGER.info(f"{where}: dataset not found ({listed}); fetching it")
            try:
                run_download(content["download"], content, where)
            except DownloadError as exc:
                raise DownloadError(f"{where}: could not fetch the dataset: {exc}; put it in {root} by hand") from None
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
