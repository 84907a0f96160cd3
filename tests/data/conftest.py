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
