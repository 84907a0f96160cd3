"""Hyperparameter yamls: :func:`load_hyp` (shipped names or paths) and :func:`hyp_value`.

At the bottom of the package beside ``yamls.py``: a hyperparameter yaml is a flat mapping of
YOLOv5's names to numbers (``lr0``, ``mosaic``, ...); the data pipeline, the loss and the
optimizer read it, none of them owns it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .yamls import DataConfigError, find_yaml, read_yaml


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
    file = find_yaml("configs/hyps", name_or_path)
    hyp = read_yaml(file)
    for key, value in hyp.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DataConfigError(f"{file}: key '{key}' must be a number, got {value!r}")
    return hyp


def hyp_value(hyp: Mapping[str, float] | None, key: str, default: float = 0.0) -> float:
    """A hyperparameter, or ``default`` when it or the whole dict is missing.

    Examples:
        >>> hyp_value({"mosaic": 1}, "mosaic"), hyp_value(None, "mosaic"), hyp_value({"mixup": None}, "mixup", 0.5)
        (1.0, 0.0, 0.5)
    """
    if not hyp:
        return default
    value = hyp.get(key, default)
    return default if value is None else float(value)


__all__ = ["hyp_value", "load_hyp"]
