"""A user's mistake under a launcher: said once per node by its first process; the others linger, then exit 2."""

from __future__ import annotations

import logging

import pytest

from ddp_utils.distributed import errors

LAUNCHED = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize(("rank", "says", "lingers"), [(0, True, False), (1, False, True)])
def test_the_first_process_says_it_and_a_follower_lingers_before_exiting(monkeypatch, caplog, rank, says, lingers):
    for key, value in {**LAUNCHED, "RANK": str(rank), "LOCAL_RANK": str(rank)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    slept = []
    monkeypatch.setattr(errors.time, "sleep", slept.append)
    message = "train.py: error: --batch-size 3 does not divide by WORLD_SIZE=2: use a multiple of 2"
    with caplog.at_level(logging.ERROR, logger=errors.LOGGER.name), pytest.raises(SystemExit) as exit_:
        errors.exit_usage_error(message)
    assert exit_.value.code == 2
    assert (message in caplog.text) is says
    assert slept == ([errors.FOLLOWER_EXIT_GRACE_S] if lingers else [])
