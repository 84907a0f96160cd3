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


def test_torchruns_root_cause_is_the_process_that_says_it_though_a_follower_wrote_its_file_first(monkeypatch, tmp_path):
    # the follower (rank 1) meets the failure a moment before the first process, across a second's boundary, and is
    # then stopped by torchrun (SIGTERM, -15) once the first process exits with its code: the report's root cause
    # must be the first process, with its own code
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    slept = []
    monkeypatch.setattr(errors.time, "sleep", slept.append)
    message = "train.py: save failed: training ended after epoch 2 but could not save last.pt"
    failures = {}
    for rank, now, code in ((1, 1000.9, -15), (0, 1001.1, 74)):  # the follower first
        for key, value in {**LAUNCHED, "RANK": str(rank), "LOCAL_RANK": str(rank)}.items():
            monkeypatch.setenv(key, value)
        error_file = tmp_path / f"{rank}" / "error.json"
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
        monkeypatch.setattr(errors.time, "time", lambda now=now: now)
        with pytest.raises(SystemExit):
            errors.exit_usage_error(message, code=74)
        failures[rank] = ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=code, error_file=str(error_file))
    root, failure = ChildFailedError("train.py", failures).get_first_failure()
    assert (root, failure.exitcode, failure.message["message"]) == (0, 74, message)
    assert slept == [errors.FOLLOWER_EXIT_GRACE_S]  # the follower lingered
