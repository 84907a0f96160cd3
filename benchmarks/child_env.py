"""The environment a benchmark's child process gets: the caller's ``PYTHONPATH`` kept, never replaced.

A GPU host without network puts the wheels it lacks on ``PYTHONPATH`` (``/tmp/site``: see
``shared/tools/gpu-wheels.sh``); a child that got ``PYTHONPATH=<checkout>`` alone could not import them
(``cpu_train_speed.py`` lost faster_coco_eval so). Our trainer's children get this checkout first, then the
caller's entries; YOLOv5's children get the caller's entries without this checkout (YOLOv5 imports its own
``models/`` and ``utils/`` from its directory).

It stays at the top of ``benchmarks/``, beside the groups, because scripts of four groups (parity, reproducibility,
speed, gpu) and ``readme_figures.py`` import it: each puts ``benchmarks/`` on ``sys.path`` for it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def with_pythonpath(env: Mapping[str, str] | None = None, *first: str | Path) -> dict[str, str]:
    """A copy of ``env`` (default: this process's) whose ``PYTHONPATH`` starts with ``first`` (default: this
    checkout), followed by the caller's entries; each entry once, empty ones dropped.

    Examples:
        >>> with_pythonpath({"PYTHONPATH": "/tmp/site"}, "/repo")["PYTHONPATH"].split(os.pathsep)
        ['/repo', '/tmp/site']
        >>> with_pythonpath({"PYTHONPATH": "/repo"}, "/repo")["PYTHONPATH"]
        '/repo'
    """
    env = dict(os.environ if env is None else env)
    entries = [str(path) for path in (first or (REPO,))] + env.get("PYTHONPATH", "").split(os.pathsep)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(entry for entry in entries if entry))
    return env


def without_checkout(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``env`` (default: this process's) whose ``PYTHONPATH`` keeps the caller's entries but this
    checkout (YOLOv5's side); no ``PYTHONPATH`` at all when nothing is left.

    Examples:
        >>> without_checkout({"PYTHONPATH": os.pathsep.join([str(REPO), "/tmp/site"])})["PYTHONPATH"]
        '/tmp/site'
        >>> "PYTHONPATH" in without_checkout({"PYTHONPATH": str(REPO)})
        False
    """
    env = dict(os.environ if env is None else env)
    kept = [entry for entry in env.pop("PYTHONPATH", "").split(os.pathsep) if entry and Path(entry).resolve() != REPO]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    return env
