"""A benchmark script (``benchmarks/<group>/<name>.py``, or one at the top, ``benchmarks/<name>.py``) found by its
name and loaded by path as a module, for the tests of its parts."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def benchmark_path(name: str) -> Path:
    """The script ``name`` names: ``"<group>/<name>"`` (``benchmarks/<group>/<name>.py``), or a bare ``"<name>"``
    found at the top of ``benchmarks/`` or in whichever group holds it (names are unique across the groups)."""
    if "/" in name:
        found = [path for path in [BENCHMARKS / f"{name}.py"] if path.is_file()]
    else:
        found = sorted(BENCHMARKS.glob(f"{name}.py")) + sorted(BENCHMARKS.glob(f"*/{name}.py"))
    if len(found) != 1:
        raise FileNotFoundError(f"benchmark {name!r}: {len(found)} scripts under {BENCHMARKS} ({found})")
    return found[0]


def load_benchmark(name: str) -> ModuleType:
    """The script ``name`` names (see :func:`benchmark_path`) executed as a module named by its file's stem
    (benchmarks/ is no package)."""
    path = benchmark_path(name)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
