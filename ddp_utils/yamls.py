"""The yamls: where the shipped ones are (data/, configs/, or their installed copies); reading one as data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

_PACKAGE_DIR = Path(__file__).resolve().parent
# Installed from a wheel, the yamls sit inside the package (see pyproject's package-dir);
# in a checkout or an editable install they sit at the top of the repo.
_ROOTS = (_PACKAGE_DIR / "assets", _PACKAGE_DIR.parent)


def asset_dir(kind: str) -> Path:
    """The directory of shipped files of one kind: "data", "configs/models" or "configs/hyps".

    Examples:
        >>> asset_dir("configs/models").name
        'models'
    """
    for root in _ROOTS:
        candidate = root / kind
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"no shipped '{kind}' directory under {' or '.join(str(r) for r in _ROOTS)}")


# where YOLOv5's repository keeps the files we ship under each kind (its --cfg, --hyp and --data paths)
_YOLOV5_DIRS = {"configs/models": ("models", "models/hub"), "configs/hyps": ("data/hyps",), "data": ("data",)}


def _shipped_location(kind: str, path: Path) -> bool:
    """Whether a name that is no file here means a shipped one: a bare name, or YOLOv5's path of it."""
    parent = path.parent.as_posix()
    return parent == "." or (not path.is_absolute() and parent in _YOLOV5_DIRS.get(kind, ()))


def find_asset(kind: str, name: str | Path) -> Path:
    """Resolve a name to a file: an existing path as given, else a shipped file of that kind.

    ``find_asset("data", "coco.yaml")`` finds ``data/coco.yaml`` of the repo (or the
    installed copy); ``find_asset("data", "my/own.yaml")`` returns that path when it exists.
    YOLOv5's paths of the same files, relative to its repo, find ours when no such file is here:
    ``models/yolov5s.yaml`` (and ``models/hub/``), ``data/hyps/hyp.scratch-low.yaml``, ``data/coco.yaml``.

    Examples:
        >>> find_asset("configs/hyps", "data/hyps/hyp.scratch-low.yaml").parent.name
        'hyps'
        >>> find_asset("configs/models", "models/yolov5s.yaml").name
        'yolov5s.yaml'

    Raises:
        FileNotFoundError: neither exists; the message names both places looked at.
    """
    path = Path(name).expanduser()
    if path.is_file():
        return path
    try:
        shipped = asset_dir(kind) / path.name
    except FileNotFoundError:
        shipped = None
    if shipped is not None and shipped.is_file() and _shipped_location(kind, path):
        return shipped
    where = f" or {shipped}" if shipped is not None else ""
    raise FileNotFoundError(f"{name}: no such file (looked at {path.resolve()}{where})")


class DataConfigError(ValueError):
    """A data or hyperparameter yaml is malformed; the message names the file and key."""


def read_yaml(file: Path) -> dict[str, Any]:
    """A yaml file's mapping, read as data (``yaml.safe_load``); DataConfigError names the file otherwise."""
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


def find_yaml(kind: str, name: str | Path) -> Path:
    """:func:`find_asset`, trying ``<name>.yaml`` too when ``name`` has no yaml suffix."""
    try:
        return find_asset(kind, name)
    except FileNotFoundError:
        if str(name).endswith((".yaml", ".yml")):
            raise
        return find_asset(kind, f"{name}.yaml")
