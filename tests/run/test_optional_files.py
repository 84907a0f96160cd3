"""A run's optional files on a full disk (ddp_utils/run/optional_files.py): a plot, a results.csv row or a
TensorBoard event that cannot be written is one warning, the first time, and the run goes on; a picture is written
whole or not at all; a results.csv row the disk refused is written with the next one, and no half row is left. A
full disk in epoch 1 (train_batch2.jpg) ended the run with a traceback."""

from __future__ import annotations

import errno
import logging
import os

import numpy as np
import pytest
import torch

from ddp_utils.log import LOGGER
from ddp_utils.run import ResultsLogger, results_values
from ddp_utils.run import loggers as loggers_module
from ddp_utils.run import plots as plots_module
from ddp_utils.run.optional_files import OptionalFiles
from ddp_utils.run.report import finish_run, first_batches_plotter

from .test_loggers import read_rows, values

OPTIONAL = "it is optional, so the run goes on"


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_the_first_optional_write_that_fails_is_one_warning_naming_the_file_and_the_rest_say_nothing(caplog):
    optional = OptionalFiles()

    def full_disk() -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    caplog.set_level(logging.WARNING, logger=LOGGER.name)
    for name in ("train_batch1.jpg", "train_batch2.jpg", "results.csv"):
        assert optional.write(f"runs/exp/{name}", full_disk) is None  # never raised: the run goes on
    assert optional.failures == 3 and optional.write("runs/exp/results.png", lambda: "drawn") == "drawn"
    (line,) = warnings_of(caplog)
    assert line.startswith(f"could not write runs/exp/train_batch1.jpg: No space left on device; {OPTIONAL}"), line


def test_a_picture_a_full_disk_refuses_leaves_nothing_behind(tmp_path, monkeypatch):
    # /dev/full: every write fails with a real ENOSPC from the kernel
    placeholder = tmp_path / ".train_batch0.jpg.tmp"
    placeholder.touch()
    full = os.open("/dev/full", os.O_WRONLY)
    monkeypatch.setattr(plots_module, "mkstemp_shared", lambda *args, **kwargs: (full, str(placeholder)))
    with pytest.raises(OSError) as raised:
        plots_module.write_image(tmp_path / "train_batch0.jpg", b"\xff\xd8" * 50_000)
    assert raised.value.errno == errno.ENOSPC
    assert sorted(tmp_path.iterdir()) == []  # no half image, no temp file


def test_first_batches_a_full_disk_refuses_are_one_warning_and_training_goes_on(tmp_path, caplog):
    save_dir = tmp_path / "a file, not a directory"
    save_dir.write_text("")  # every picture's write fails with a real OSError (NotADirectoryError)
    caplog.set_level(logging.WARNING, logger=LOGGER.name)
    optional = OptionalFiles()
    plot = first_batches_plotter(save_dir, {0: "circle"}, optional=optional)
    imgs, targets = torch.zeros(2, 3, 64, 64, dtype=torch.uint8), torch.tensor([[0, 0, 0.5, 0.5, 0.2, 0.2]])
    for i in range(3):
        plot(i, imgs, targets, ["a.jpg", "b.jpg"])
    (line,) = warnings_of(caplog)
    assert line.startswith(f"could not write {save_dir}/train_batch0.jpg: ") and OPTIONAL in line, line
    assert optional.failures == 3


def test_a_finished_runs_last_words_come_whatever_the_disk_refuses(tmp_path, caplog):
    logger = ResultsLogger(tmp_path, tensorboard=False)
    for epoch in range(2):
        logger.log(epoch, values(epoch))
    (tmp_path / "results.png").mkdir()  # results.png cannot be written there: a real OSError (IsADirectoryError)
    caplog.set_level(logging.INFO, logger=LOGGER.name)
    finish_run(tmp_path, {"map50": 0.5, "map": 0.25}, epochs_done=2)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[-1].startswith("2 epochs done; results in "), messages
    (line,) = warnings_of(caplog)
    assert line.startswith(f"could not write {tmp_path / 'results.png'}: ") and OPTIONAL in line, line


class FillsUp:
    """A file on a disk with ``room[0]`` bytes left: a longer write writes what fits, then fails as a full disk does."""

    def __init__(self, f, room: list[int]) -> None:
        self.f, self.room = f, room

    def write(self, text: str) -> int:
        if len(text) > self.room[0]:
            self.f.write(text[: self.room[0]])
            self.f.flush()
            self.room[0] = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room[0] -= len(text)
        return self.f.write(text)

    def __enter__(self) -> FillsUp:
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()


def test_a_row_a_full_disk_refuses_is_written_with_the_next_and_no_half_row_is_left(tmp_path, monkeypatch, caplog):
    logger = ResultsLogger(tmp_path, tensorboard=False)
    logger.log(0, values(0))
    room, real_open = [10], open  # 10 bytes left: epoch 1's row is cut there, epoch 2's finds no room at all
    monkeypatch.setattr(loggers_module, "open", lambda path, mode="r", **kw: FillsUp(real_open(path, mode, **kw), room),
                        raising=False)  # fmt: skip
    caplog.set_level(logging.WARNING, logger=LOGGER.name)
    logger.log(1, values(1))
    logger.log(2, values(2))
    assert [row[0] for row in read_rows(tmp_path / "results.csv")] == ["epoch", "0"]  # whole rows only
    (line,) = warnings_of(caplog)
    assert line.startswith(f"could not write {tmp_path / 'results.csv'}: No space left on device; {OPTIONAL}")
    room[0] = 10**6  # the disk freed
    logger.log(3, values(3))
    rows = read_rows(tmp_path / "results.csv")
    assert [row[0] for row in rows] == ["epoch", "0", "1", "2", "3"]  # every epoch once, in order
    assert {len(row) for row in rows} == {len(rows[0])}  # no row cut short
    expected = results_values([1.0 / 3, 0.5, 0.25], {"precision": 0.2, "recall": 0.2, "map50": 0.3, "map": 0.08},
                              [0.9, 0.8, 0.7], [0.01, 0.02, 0.03])  # fmt: skip
    assert np.allclose([float(x) for x in rows[3][1:]], list(expected.values()), rtol=1e-5)
