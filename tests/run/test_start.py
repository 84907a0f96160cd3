"""The run's record at its start (ddp_utils/run/start.py): hyp.yaml and opt.yaml, which an elastic restart finds its
run by, are no optional files: a disk that cannot take them ends the run before it trains, in one line (train.py:
exit 74); it ended with a traceback."""

from __future__ import annotations

import logging

import yaml

from ddp_utils.distributed import DistInfo
from ddp_utils.log import LOGGER
from ddp_utils.run.start import record_run

from .test_training import a_run


def test_the_runs_record_is_written_and_its_hyperparameters_logged(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER.name)
    run = a_run(save_dir=tmp_path)
    assert record_run(run, DistInfo()) is None
    assert yaml.safe_load((tmp_path / "opt.yaml").read_text())["run_key"] == "test"
    assert yaml.safe_load((tmp_path / "hyp.yaml").read_text()) == run.hyp
    assert any(r.getMessage().startswith("hyperparameters: lr0=") for r in caplog.records)


def test_a_record_the_disk_refuses_is_the_runs_last_line_and_nothing_trains(tmp_path):
    save_dir = tmp_path / "a file, not a directory"
    save_dir.write_text("")  # every write in it fails with a real OSError
    said = record_run(a_run(save_dir=save_dir), DistInfo())
    assert said.startswith(f"could not write {save_dir / 'hyp.yaml'}: File exists; "), said  # the error's own words
    assert said.endswith("; nothing was trained, and nothing is on disk to resume from: free the disk, then start the "
                         "run again"), said  # fmt: skip
