"""The finished run's last line (ddp_utils.engine.run_report.finish_run)."""

from __future__ import annotations

import logging

import pytest

from ddp_utils.engine.run_report import finish_run


@pytest.mark.parametrize(("epochs", "words"), [(1, "1 epoch done;"), (2, "2 epochs done;"), (0, "0 epochs done;")])
def test_last_line_counts_epochs_in_english(tmp_path, caplog, epochs, words):
    with caplog.at_level(logging.INFO, logger="ddp_utils"):
        finish_run(tmp_path, {"map50": 0.5, "map": 0.25}, epochs_done=epochs, plots=False)
    lines = [r.getMessage() for r in caplog.records if "done;" in r.getMessage()]
    assert lines == [f"{words} results in {tmp_path}; final mAP@0.5 0.500, mAP@0.5:0.95 0.250"]
