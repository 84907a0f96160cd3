"""opt.yaml, results.csv across a resume, and TensorBoard when (not) installed (run directories: test_run_dir.py)."""

from __future__ import annotations

import csv
import importlib.util
import logging
from pathlib import Path

import pytest
import yaml

from ddp_utils.run import RESULTS_COLUMNS, ResultsLogger, results_values, yaml_save

HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


def values(epoch: int) -> dict[str, float]:
    metrics = {"precision": 0.1 * epoch, "recall": 0.2, "map50": 0.3, "map": 0.04 * epoch}
    return results_values([1.0 / (epoch + 1), 0.5, 0.25], metrics, [0.9, 0.8, 0.7], [0.01, 0.02, 0.03])


def read_rows(path: Path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_yaml_save_writes_plain_yaml(tmp_path):
    import argparse

    opt = argparse.Namespace(save_dir=tmp_path / "exp", imgsz=(320, 320), hyp={"lr0": 0.01}, name="exp")
    path = yaml_save(tmp_path / "exp" / "opt.yaml", opt)
    loaded = yaml.safe_load(path.read_text())
    assert loaded == {"save_dir": str(tmp_path / "exp"), "imgsz": [320, 320], "hyp": {"lr0": 0.01}, "name": "exp"}


def test_results_csv_rows_and_header(tmp_path):
    logger = ResultsLogger(tmp_path, tensorboard=False)
    for epoch in range(3):
        logger.log(epoch, values(epoch))
    logger.close()
    rows = read_rows(tmp_path / "results.csv")
    assert tuple(rows[0]) == RESULTS_COLUMNS
    assert [r[0] for r in rows[1:]] == ["0", "1", "2"]
    assert float(rows[2][RESULTS_COLUMNS.index("metrics/precision")]) == pytest.approx(0.1)
    assert float(rows[3][RESULTS_COLUMNS.index("train/box_loss")]) == pytest.approx(1 / 3, rel=1e-5)
    assert float(rows[1][RESULTS_COLUMNS.index("x/lr2")]) == 0.03


def test_results_csv_survives_a_resume(tmp_path):
    logger = ResultsLogger(tmp_path, tensorboard=False)
    for epoch in range(5):  # epochs 3 and 4 were logged, but the checkpoint is from epoch 2
        logger.log(epoch, values(epoch))
    resumed = ResultsLogger(tmp_path, start_epoch=3, tensorboard=False)
    assert [r[0] for r in read_rows(tmp_path / "results.csv")] == ["epoch", "0", "1", "2"]
    for epoch in range(3, 6):
        resumed.log(epoch, values(epoch))
    rows = read_rows(tmp_path / "results.csv")
    assert [r[0] for r in rows] == ["epoch", "0", "1", "2", "3", "4", "5"]
    assert sum(tuple(r) == RESULTS_COLUMNS for r in rows) == 1
    assert list(tmp_path.glob(".*tmp")) == []


def test_results_csv_reads_yolov5_padded_header(tmp_path):
    header = ",".join(f"{c:>23s}" for c in RESULTS_COLUMNS)
    row = ",".join(f"{v:>23.5g}" for v in [0, *values(0).values()])
    (tmp_path / "results.csv").write_text(f"{header}\n{row}\n")
    ResultsLogger(tmp_path, start_epoch=1, tensorboard=False).log(1, values(1))
    assert [r[0].strip() for r in read_rows(tmp_path / "results.csv")] == ["epoch", "0", "1"]


def test_a_disabled_logger_writes_nothing_and_truncates_nothing(tmp_path):
    """The other ranks of a DDP run: train.py passes enabled=False there."""
    first = ResultsLogger(tmp_path, tensorboard=False)
    first.log(0, values(0))
    before = (tmp_path / "results.csv").read_bytes()
    other_rank = ResultsLogger(tmp_path, start_epoch=0, tensorboard=False, enabled=False)
    other_rank.log(1, values(1))
    other_rank.close()
    assert (tmp_path / "results.csv").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]


def test_foreign_csv_and_missing_columns_are_named(tmp_path):
    (tmp_path / "results.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="results.csv has columns"):
        ResultsLogger(tmp_path, start_epoch=1, tensorboard=False)
    logger = ResultsLogger(tmp_path / "other", tensorboard=False)
    with pytest.raises(KeyError, match="metrics/recall"):
        logger.log(0, {k: v for k, v in values(0).items() if k != "metrics/recall"})
    with pytest.raises(ValueError, match="got 13 numbers for 14 columns"):
        results_values([1, 2, 3], {"precision": 0, "recall": 0, "map50": 0, "map": 0}, [1, 2, 3], [0.1, 0.1])


def test_a_disabled_logger_makes_no_run_directory(tmp_path):
    logger = ResultsLogger(tmp_path / "run", enabled=False)
    logger.log(0, values(0))
    logger.close()
    assert not logger.enabled and not (tmp_path / "run").exists()


@pytest.mark.skipif(HAS_TENSORBOARD, reason="tensorboard is installed here")
def test_tensorboard_missing_is_one_info_line(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="ddp_utils"):
        logger = ResultsLogger(tmp_path)
        logger.log(0, values(0))
        logger.close()
    lines = [r.getMessage() for r in caplog.records if "TensorBoard" in r.getMessage()]
    assert len(lines) == 1 and "not installed" in lines[0]
    assert logger.tb is None and (tmp_path / "results.csv").exists()
    assert not list(tmp_path.glob("events.out.tfevents.*"))


@pytest.mark.skipif(not HAS_TENSORBOARD, reason="tensorboard is not installed")
def test_tensorboard_events_when_installed(tmp_path):
    logger = ResultsLogger(tmp_path)
    logger.log(0, values(0))
    logger.close()
    events = list(tmp_path.glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def test_a_half_written_last_row_is_dropped_on_resume(tmp_path):
    logger = ResultsLogger(tmp_path, tensorboard=False)
    for epoch in range(3):
        logger.log(epoch, values(epoch))
    with open(tmp_path / "results.csv", "a") as f:
        f.write("3,0.25,0.5")  # killed mid-append: no newline, most columns missing
    resumed = ResultsLogger(tmp_path, start_epoch=3, tensorboard=False)
    resumed.log(3, values(3))
    rows = read_rows(tmp_path / "results.csv")
    assert [r[0] for r in rows] == ["epoch", "0", "1", "2", "3"]
    assert all(len(r) == len(RESULTS_COLUMNS) for r in rows)


def test_incomplete_rows_are_dropped_even_before_the_resumed_epoch(tmp_path, caplog):
    logger = ResultsLogger(tmp_path, tensorboard=False)
    logger.log(0, values(0))
    with open(tmp_path / "results.csv", "a") as f:
        f.write("1,0.25\n")
    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        ResultsLogger(tmp_path, start_epoch=10, tensorboard=False)
    assert [r[0] for r in read_rows(tmp_path / "results.csv")] == ["epoch", "0"]
    assert any("incomplete row" in r.getMessage() for r in caplog.records)
