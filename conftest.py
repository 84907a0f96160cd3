"""Fixtures for every test, the doctests of ddp_utils/ included."""

from __future__ import annotations

import os

import pytest

from ddp_utils import log


@pytest.fixture(autouse=True)
def _library_logger_as_imported():
    """Put the ``ddp_utils`` logger back as the test found it.

    ``set_logging`` (a doctest calls it) stops propagation to the root logger, where pytest's
    ``caplog`` listens: without this, whether a later test on the same xdist worker sees the
    library's lines would depend on the order the tests were dealt out.
    """
    logger = log.LOGGER
    saved = (logger.level, logger.propagate, list(logger.handlers), list(logger.filters))
    handler_state = (log._handler.level, log._handler.explicit, log._rank_filter.rank)
    yield
    logger.setLevel(saved[0])
    logger.propagate = saved[1]
    logger.handlers[:] = saved[2]
    logger.filters[:] = saved[3]
    log._handler.setLevel(handler_state[0])
    log._handler.explicit, log._rank_filter.rank = handler_state[1:]


ENV_PREFIX = "DDP_UTILS_"


@pytest.fixture(autouse=True)
def _isolated_ddp_utils_environment():
    """Run every test (and doctest) without ``DDP_UTILS_*`` variables, and put them back afterwards.

    The library reads its settings from them (progress mode and interval, datasets directory, timeouts...)
    and the processes a test launches inherit them: without this, a variable in the shell that runs
    pytest, or one a test or doctest set and left, would change what a later test sees.
    """
    saved = {name: value for name, value in os.environ.items() if name.startswith(ENV_PREFIX)}
    for name in saved:
        del os.environ[name]
    yield
    for name in [name for name in os.environ if name.startswith(ENV_PREFIX)]:
        del os.environ[name]
    os.environ.update(saved)
