"""Fixtures for every test, the doctests of ddp_utils/ included, and the two test tiers.

``python -m pytest`` runs the fast tier (pyproject's ``-m "not slow"``); ``python -m pytest -m slow``
the slow one: tests that run train.py, torchrun or sbatch, or wait by design. A test outside the slow
tier whose call takes more than :data:`SLOW_SECONDS` fails, saying to mark it slow, so the fast tier
stays fast without anyone watching it.
"""

from __future__ import annotations

import os

import pytest

from ddp_utils import log

SLOW_SECONDS = 10.0  # an unmarked test's call may take this long; beyond it, it belongs to the slow tier
# Modules whose every test runs train.py (or torchrun, or sbatch of the recipes): the slow tier whole.
SLOW_MODULES = (
    "tests/test_train.py",
    "tests/test_train_resume.py",
    "tests/test_train_elastic.py",
    "tests/test_train_usage.py",
    "tests/test_slurm.py",
)


def pytest_addoption(parser):
    parser.addoption(
        "--fast-tier-seconds",
        type=float,
        default=SLOW_SECONDS,
        help=f"fail an unmarked test whose call takes longer (default {SLOW_SECONDS:g}; 0: never; "
        "raise it on a host other jobs load, where wall times stretch)",
    )


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.nodeid.partition("::")[0]
        if module in SLOW_MODULES and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Fail a passing test that is not marked slow and whose call took over ``--fast-tier-seconds``."""
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not report.passed or item.get_closest_marker("slow") is not None:
        return
    limit = item.config.getoption("--fast-tier-seconds")
    if limit and call.duration > limit:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {call.duration:.1f} s, more than the fast tier's {limit:g} s: "
            "mark it @pytest.mark.slow (with a @pytest.mark.timeout), so that it runs in "
            "`python -m pytest -m slow`, or make it faster"
        )


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread_per_xdist_worker():
    """Under pytest-xdist (a worker per core), one torch thread per worker.

    Each worker's default is a thread per core: on 2 cores, two workers plus any other job run 4+
    spinning OpenMP threads, and a 0.14 s test took 10 s (measured on this project's CI machine).
    """
    import torch

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


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


def _without_ddp_utils_settings():
    saved = {name: value for name, value in os.environ.items() if name.startswith(ENV_PREFIX)}
    for name in saved:
        del os.environ[name]
    yield
    for name in [name for name in os.environ if name.startswith(ENV_PREFIX)]:
        del os.environ[name]
    os.environ.update(saved)


@pytest.fixture(autouse=True, scope="session")
def _session_without_the_shells_ddp_utils_settings():
    """The whole session without the shell's ``DDP_UTILS_*``: module fixtures that start processes too."""
    yield from _without_ddp_utils_settings()


@pytest.fixture(autouse=True)
def _isolated_ddp_utils_environment():
    """Run every test (and doctest) without ``DDP_UTILS_*`` variables, and put them back afterwards.

    The library reads its settings from them (progress mode and interval, datasets directory, timeouts...)
    and the processes a test launches inherit them: without this, a variable in the shell that runs
    pytest, or one a test or doctest set and left, would change what a later test sees.
    """
    yield from _without_ddp_utils_settings()
