"""Fixtures shared by the data tests."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture
def ddp_log(caplog):
    """caplog that sees the ddp_utils logger even after set_logging() stopped its propagation."""
    from ddp_utils.log import LOGGER

    old = LOGGER.level
    LOGGER.addHandler(caplog.handler)
    LOGGER.setLevel(logging.INFO)
    yield caplog
    LOGGER.removeHandler(caplog.handler)
    LOGGER.setLevel(old)


class WarningLines(logging.Handler):
    """The ddp_utils logger's warnings, one string each (caplog may see a record twice)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def said():
    """The warnings the ddp_utils logger gives during the test, as lines."""
    from ddp_utils.log import LOGGER

    handler = WarningLines()
    LOGGER.addHandler(handler)
    yield handler.lines
    LOGGER.removeHandler(handler)
