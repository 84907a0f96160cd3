"""Fixtures for every test, the doctests of ddp_utils/ included, and the two test tiers.

``python -m pytest`` runs the fast tier (pyproject's ``-m "not slow"``); ``python -m pytest -m slow``
the slow one: tests that run train.py, torchrun or sbatch, or wait by design. A test outside the slow
tier whose call takes more than :data:`SLOW_SECONDS` is named at the end of the run, with its time and the
advice to mark it slow, and the run still passes: on a busy or slow machine wall times stretch, and a user's
verdict on a correct tree must not depend on them. CI keeps the tier fast: there (``.ci/run`` sets
``REQUIRE_FAST_TIER=1``), or with ``--enforce-fast-tier``, such a test fails instead.
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


ENFORCE_ENV = "REQUIRE_FAST_TIER"  # set (to anything but "" or "0"): an unmarked test over the limit fails
OVER_LIMIT = "fast_tier_seconds"  # the user property a report over the limit carries (crosses from xdist workers)


def pytest_addoption(parser):
    parser.addoption(
        "--fast-tier-seconds",
        type=float,
        default=SLOW_SECONDS,
        help=f"name at the end an unmarked test whose call takes longer (default {SLOW_SECONDS:g}; 0: never)",
    )
    parser.addoption(
        "--enforce-fast-tier",
        action="store_true",
        help=f"fail such a test instead of naming it (what CI does, with {ENFORCE_ENV}=1 in the environment)",
    )


def pytest_configure(config):
    config.pluginmanager.register(FastTierReport(config), "fast_tier_report")


def fast_tier_enforced(config) -> bool:
    """Whether a test over the fast tier's limit fails: ``--enforce-fast-tier``, or ``$REQUIRE_FAST_TIER`` set."""
    return config.getoption("--enforce-fast-tier") or os.environ.get(ENFORCE_ENV, "") not in ("", "0")


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.nodeid.partition("::")[0]
        if module in SLOW_MODULES and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Mark a passing test that is not marked slow and whose call took over ``--fast-tier-seconds``; fail it
    where the tier is enforced."""
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not report.passed or item.get_closest_marker("slow") is not None:
        return
    limit = item.config.getoption("--fast-tier-seconds")
    if not limit or call.duration <= limit:
        return
    report.user_properties.append((OVER_LIMIT, call.duration))
    if fast_tier_enforced(item.config):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {call.duration:.1f} s, more than the fast tier's {limit:g} s: "
            "mark it @pytest.mark.slow (with a @pytest.mark.timeout), so that it runs in "
            "`python -m pytest -m slow`, or make it faster"
        )


class FastTierReport:
    """The tests over the fast tier's limit, gathered from every report (an xdist worker's too) and named at the
    end of the run, slowest first, with the advice to mark them slow."""

    def __init__(self, config) -> None:
        self.config = config
        self.over: list[tuple[str, float]] = []

    def pytest_runtest_logreport(self, report) -> None:
        seconds = dict(report.user_properties).get(OVER_LIMIT)
        if report.when == "call" and seconds is not None:
            self.over.append((report.nodeid, seconds))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.over:
            return
        limit = self.config.getoption("--fast-tier-seconds")
        enforced = fast_tier_enforced(self.config)
        terminalreporter.section(f"over the fast tier's {limit:g} s")
        for nodeid, seconds in sorted(self.over, key=lambda over: -over[1]):
            terminalreporter.line(f"{nodeid} took {seconds:.1f} s")
        verdict = (
            "failed (the tier is enforced here)"
            if enforced
            else f"passed: a busy or slow machine stretches wall times, so only CI ({ENFORCE_ENV}=1) or "
            "--enforce-fast-tier fails them"
        )
        terminalreporter.line(
            f"{len(self.over)} test(s) not marked slow took more than {limit:g} s and {verdict}. If they take that "
            "long on an idle machine, mark them @pytest.mark.slow (with a @pytest.mark.timeout) or make them faster."
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
