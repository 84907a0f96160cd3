"""The run directory's name: ``runs/train/exp``, or ``exp2``, ``exp3``, ... when taken, as YOLOv5 names it.

:func:`increment_path` must be called on rank 0 alone and its answer broadcast
(``ddp_utils.broadcast_object``), or two ranks could pick different directories:
:func:`ddp_utils.run.start.make_run_dir` does both for a run; ``python -m ddp_utils val`` names its
``runs/val/exp`` with it too.
"""

from __future__ import annotations

from pathlib import Path


def increment_path(path: str | Path, exist_ok: bool = False, sep: str = "", mkdir: bool = False) -> Path:
    """Return ``path``, or the first free ``path2``, ``path3``, ... when it exists.

    Args:
        path: e.g. ``runs/train/exp``; a file path keeps its suffix (``exp.txt`` -> ``exp2.txt``).
        exist_ok: return ``path`` unchanged even when it exists (resume into the same directory).
        sep: between the name and the number (``"_"`` gives ``exp_2``).
        mkdir: create the directory. The creation claims the name atomically, so two jobs
            started at once never share one.

    Examples:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> [increment_path(root / "exp", mkdir=True).name for _ in range(3)]
        ['exp', 'exp2', 'exp3']
    """
    path = Path(path)
    if exist_ok:
        if mkdir:
            path.mkdir(parents=True, exist_ok=True)
        return path
    stem, suffix = (path.with_suffix(""), path.suffix) if path.is_file() else (path, "")
    candidate, n = path, 2
    while True:
        if mkdir:
            try:
                candidate.parent.mkdir(parents=True, exist_ok=True)
                candidate.mkdir()
                return candidate
            except FileExistsError:
                pass
        elif not candidate.exists():
            return candidate
        candidate = Path(f"{stem}{sep}{n}{suffix}")
        n += 1


__all__ = ["increment_path"]
