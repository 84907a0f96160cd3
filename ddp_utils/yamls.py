"""Where the shipped yamls are: the repo's data/ and configs/, or their installed copies."""

from __future__ import annotations

from pathlib import Path

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


def find_asset(kind: str, name: str | Path) -> Path:
    """Resolve a name to a file: an existing path as given, else a shipped file of that kind.

    ``find_asset("data", "coco.yaml")`` finds ``data/coco.yaml`` of the repo (or the
    installed copy); ``find_asset("data", "my/own.yaml")`` returns that path when it exists.

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
    if shipped is not None and shipped.is_file() and path.parent == Path("."):
        return shipped
    where = f" or {shipped}" if shipped is not None else ""
    raise FileNotFoundError(f"{name}: no such file (looked at {path.resolve()}{where})")
