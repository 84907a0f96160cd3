"""The library's logger: one named logger that speaks on the first rank and is quiet elsewhere.

Everything in ddp_utils logs to the ``"ddp_utils"`` logger; nothing here touches the
root logger. Out of the box, without any call, that logger shows what a YOLOv5 user
expects to see: INFO (the label-scan summary, the device banner, the user's own lines
through :data:`LOGGER`) on global rank 0 and in a single process, warnings and errors
on every rank, each other rank's lines prefixed ``[rank N]``. It does so through one
stream handler of its own on stderr, which steps aside by itself as soon as the host
program configures logging: a handler of its own on this logger, or handlers on the root
logger (``logging.basicConfig``) that the records reach anyway. ``DDP_UTILS_VERBOSE=0``
keeps INFO quiet.

:func:`set_logging` is the explicit way: it fixes the rank and the verbosity, keeps the
same handler (so nothing prints twice) and stops propagation to the root logger.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

LOGGER_NAME = "ddp_utils"
LOGGER = logging.getLogger(LOGGER_NAME)
VERBOSE_ENV = "DDP_UTILS_VERBOSE"  # "0", "false", "no" or "off": INFO stays quiet unless set_logging says otherwise


_rank_source: Callable[[], int] | None = None  # ddp_utils.distributed.env gives its env_rank when imported


def set_rank_source(source: Callable[[], int] | None) -> None:
    """Where the logger asks for the launcher's global rank until :func:`set_logging` fixes one.

    :mod:`ddp_utils.distributed.env`, the one module that reads launcher variables, hands in its
    :func:`~ddp_utils.distributed.env_rank` when it is imported (importing ``ddp_utils`` imports it), so this
    bottom module imports nothing of the package; without a source every process logs as a single one (-1).

    Examples:
        >>> from ddp_utils.log import set_rank_source, _rank_from_env
        >>> from ddp_utils.distributed import env_rank
        >>> set_rank_source(lambda: 3); _rank_from_env()
        3
        >>> set_rank_source(env_rank)
    """
    global _rank_source
    _rank_source = source


def _rank_from_env() -> int:
    """The launcher's global rank, -1 for a single process; read when a line is logged, never at import."""
    return _rank_source() if _rank_source is not None else -1


def _verbose_from_env() -> bool:
    return os.environ.get(VERBOSE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class _RankFilter(logging.Filter):
    """Until :func:`set_logging` is called: drop INFO and below except on the main process.

    YOLOv5 does this with its logger's level; here the rank and ``DDP_UTILS_VERBOSE`` are
    read when a line is logged, so importing ddp_utils before torchrun's variables matter
    costs nothing. Once :func:`set_logging` has set the level by rank, the level alone
    decides (a host may still change it), and this filter only remembers the rank.
    """

    def __init__(self) -> None:
        super().__init__()
        self.rank: int | None = None  # set by set_logging

    def current_rank(self) -> int:
        return _rank_from_env() if self.rank is None else self.rank

    def filter(self, record: logging.LogRecord) -> bool:
        if self.rank is not None or record.levelno >= logging.WARNING:
            return True
        return _verbose_from_env() and self.current_rank() in (-1, 0)


class _RankFormatter(logging.Formatter):
    """``[rank N] `` before each line of a rank other than the first."""

    def __init__(self, rank_filter: _RankFilter) -> None:
        super().__init__("%(message)s")
        self.rank_filter = rank_filter

    def format(self, record: logging.LogRecord) -> str:
        rank = self.rank_filter.current_rank()
        text = super().format(record)
        return text if rank in (-1, 0) else f"[rank {rank}] {text}"


class _DefaultHandler(logging.StreamHandler):
    """Our one handler: speaks until the host program configures logging, unless told to stay."""

    _ddp_utils = True  # set_logging finds it by this mark

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.explicit = False  # set by set_logging: then it always speaks

    @property
    def stream(self):  # type: ignore[override]
        # sys.stderr as it is now: pytest's capsys and others swap it after import
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # the base class assigns it; the live sys.stderr wins
        pass

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.explicit and _host_configured_logging():
            return False
        return super().filter(record)


def _host_configured_logging() -> bool:
    """True when a handler other than ours would show this logger's records."""
    if any(not getattr(h, "_ddp_utils", False) for h in LOGGER.handlers):
        return True
    logger = LOGGER
    while logger.propagate and logger.parent is not None:
        logger = logger.parent
        if logger.handlers:
            return True
    return False


_rank_filter = _RankFilter()
_handler = _DefaultHandler()
_handler.setFormatter(_RankFormatter(_rank_filter))
LOGGER.addFilter(_rank_filter)
LOGGER.addHandler(_handler)
# INFO must reach our handler although the root logger's level is WARNING; the rank
# filter above keeps the other ranks at WARNING. A host program may set another level.
LOGGER.setLevel(logging.INFO)


def set_logging(rank: int | str | None = None, verbose: bool = True) -> logging.Logger:
    """Configure the ``ddp_utils`` logger for this process and return it.

    INFO is shown on the main process when ``verbose``, WARNING and above on every rank;
    lines of ranks other than 0 start with ``[rank N]``. The logger gets one stream handler
    on stderr (calling this again reconfigures it, never adds a second) and stops
    propagating to the root logger, so a host program's ``logging.basicConfig`` does not
    print each line twice.

    YOLOv5 has had both call forms: ``set_logging(rank, verbose)`` (v6.0 and before) and
    ``set_logging(name, verbose)`` (v6.1 on). A name configures that logger the same way
    (the host script's own ``LOGGER``), as well as ours, and returns it.

    Args:
        rank: global rank of this process; ``None`` reads it from the launcher's
            environment (torchrun's RANK, srun's SLURM_PROCID), -1 for a single process.
            A string is a logger's name (YOLOv5 v6.1's form); the rank is then read as for ``None``.
        verbose: log INFO on the main process when True, WARNING otherwise.

    Returns:
        The configured logger (the named one when a name was given).

    Examples:
        >>> from ddp_utils.log import set_logging
        >>> logger = set_logging(rank=0)
        >>> logger.name
        'ddp_utils'
        >>> set_logging("my_project").name
        'my_project'
    """
    name = rank if isinstance(rank, str) else None
    if rank is None or name is not None:
        rank = _rank_from_env()
    level = logging.INFO if verbose and rank in (-1, 0) else logging.WARNING
    LOGGER.setLevel(level)
    _rank_filter.rank = rank
    if _handler not in LOGGER.handlers:
        LOGGER.addHandler(_handler)
    if _rank_filter not in LOGGER.filters:
        LOGGER.addFilter(_rank_filter)
    _handler.explicit = True
    _handler.setLevel(level)
    LOGGER.propagate = False
    if name is None or name == LOGGER_NAME:
        return LOGGER
    host = logging.getLogger(name)
    host.setLevel(level)
    if _handler not in host.handlers:
        host.addHandler(_handler)
    host.propagate = False
    return host
