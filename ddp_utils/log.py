"""The library's logger: one named logger, quiet on every rank but the first.

Libraries should not configure the root logger, so everything here logs to the
``"ddp_utils"`` logger. :func:`set_logging` gives it one stream handler whose level
depends on the rank: INFO on the main process, WARNING elsewhere, so a
4-process job prints its progress once but still shows every rank's warnings.
"""

from __future__ import annotations

import logging
import os
import sys

LOGGER_NAME = "ddp_utils"
LOGGER = logging.getLogger(LOGGER_NAME)


def _rank_from_env() -> int:
    for name in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(name, "")
        if value.strip().lstrip("-").isdigit():
            return int(value)
    return -1


def set_logging(rank: int | None = None, verbose: bool = True) -> logging.Logger:
    """Configure the ``ddp_utils`` logger for this process and return it.

    Args:
        rank: global rank of this process; ``None`` reads it from the environment
            (RANK, then SLURM_PROCID), -1 for a single process.
        verbose: log INFO on the main process when True, WARNING otherwise.

    Returns:
        The configured logger.

    Examples:
        >>> from ddp_utils.log import set_logging
        >>> logger = set_logging(rank=0)
        >>> logger.name
        'ddp_utils'
    """
    if rank is None:
        rank = _rank_from_env()
    level = logging.INFO if verbose and rank in (-1, 0) else logging.WARNING
    LOGGER.setLevel(level)
    if not any(getattr(h, "_ddp_utils", False) for h in LOGGER.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler._ddp_utils = True  # type: ignore[attr-defined]
        LOGGER.addHandler(handler)
        LOGGER.propagate = False
    prefix = "" if rank in (-1, 0) else f"[rank {rank}] "
    for handler in LOGGER.handlers:
        if getattr(handler, "_ddp_utils", False):
            handler.setFormatter(logging.Formatter(prefix + "%(message)s"))
            handler.setLevel(level)
    return LOGGER
