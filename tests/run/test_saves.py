"""A run's saves and what they say (ddp_utils/run/saves.py): "saved" only once the file is whole on disk, and a
failed stop save names where ``--resume`` really continues. Real files; the writes fail for real (a file-size limit)."""

from __future__ import annotations

import contextlib
import logging
import re
import resource
import signal
import threading

import pytest
import torch

from ddp_utils.distributed import DistInfo
from ddp_utils.engine import EpochStats, ModelEMA, TrainingDiverged, TrainStep
from ddp_utils.log import LOGGER
from ddp_utils.run import Checkpointer, StepControl, TrainState, load_checkpoint
from ddp_utils.run.saves import RunSaves, on_disk
from ddp_utils.run.training import Training
from tests.workers.engine_scenarios import small_model

SAVED = re.compile(r"saved (\S+) at epoch (\d+), batch (\d+)/(\d+) ")


class _Lines(logging.Handler):
    """The ddp_utils log's lines; at each "saved" line, what the file it names holds at that moment."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.on_disk_when_said: list[tuple[str, str | None]] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        self.lines.append(line)
        if match := SAVED.match(line):
            self.on_disk_when_said.append((f"epoch {match[2]}, batch {match[3]}/{match[4]}", on_disk(match[1])))


@contextlib.contextmanager
def lines_logged():
    handler, level = _Lines(), LOGGER.level
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(level)


@contextlib.contextmanager
def files_limited_to(size: int):
    """Writes past ``size`` bytes fail with EFBIG in this process (a disk that filled up, without root or a mount)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of the process dying
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def _saves(tmp_path) -> tuple[RunSaves, Training]:
    torch.manual_seed(0)
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    step = TrainStep(model, optimizer, scaler, ModelEMA(model), lambda pred, targets: (pred.sum(), pred.sum()))
    fit = Training(step, None, None, None, [], TrainState(epoch=0, batches=12, batch_size=8))
    checkpoints = Checkpointer(tmp_path, opt={"epochs": 3}, hyp={"lr0": 0.01}, background=True)
    return RunSaves(checkpoints, StepControl(), DistInfo()), fit


def test_saved_is_said_once_the_file_is_whole_on_disk_and_never_for_a_save_that_failed(tmp_path):
    saves, fit = _saves(tmp_path)
    last = saves.checkpoints.last
    with lines_logged() as log:
        saves.periodic(fit, EpochStats(torch.zeros(3), batch=2))
        saves.checkpoints.wait()
        with files_limited_to(1024):  # the disk is full: the next saves fail
            for batch in (4, 6):
                saves.periodic(fit, EpochStats(torch.zeros(3), batch=batch))
                assert not saves.checkpoints.wait()
        saves.periodic(fit, EpochStats(torch.zeros(3), batch=8))  # the space is back: this one lands
        saves.checkpoints.wait()
    said = [line for line in log.lines if SAVED.match(line)]
    assert len(said) == 2 and "batch 2/12" in said[0] and "batch 8/12" in said[1], log.lines
    assert all(re.search(r"\(training waited [\d.]+ s, written in [\d.]+ s\)$", line) for line in said), said
    # each "saved" came when its own file was on disk, whole
    assert log.on_disk_when_said == [("epoch 1, batch 2/12", "epoch 1, batch 2/12"), ("epoch 1, batch 8/12",) * 2]
    failed = [line for line in log.lines if line.startswith(f"could not save checkpoint {last}")]
    assert len(failed) == 2 and all("File too large" in line and "intact" in line for line in failed), log.lines
    assert TrainState.from_checkpoint(load_checkpoint(last)).batch == 8


def test_a_failed_stop_save_says_where_resume_really_continues(tmp_path):
    saves, fit = _saves(tmp_path)
    last = saves.checkpoints.last
    with lines_logged() as log:
        saves.periodic(fit, EpochStats(torch.zeros(3), batch=3))
        saves.checkpoints.wait()  # on disk before the disk fills up
        with files_limited_to(1024), saves.control:
            saves.stop(fit, EpochStats(torch.zeros(3), batch=7))
    final = saves.failed  # the run's last line (train.py: exit 74), not a warning among others
    assert final.startswith(f"stopped at epoch 1, batch 7/12: could not save {last}"), final
    assert f"python train.py --resume {last} continues from epoch 1, batch 3/12, not from here" in final, final
    assert "saved" not in final and not any(line.startswith("stopped at") for line in log.lines), log.lines
    assert log.lines[-1] == f"could not save checkpoint {last}: File too large; the previous {last} is intact"
    assert TrainState.from_checkpoint(load_checkpoint(last)).batch == 3  # what the line says is what is there


def test_a_failed_stop_save_without_any_file_says_there_is_nothing_to_resume(tmp_path):
    saves, fit = _saves(tmp_path)
    with files_limited_to(1024), saves.control:
        saves.stop(fit, EpochStats(torch.zeros(3), batch=7))
    assert "none is on disk: nothing to resume from" in saves.failed and "--resume" not in saves.failed, saves.failed


def test_a_final_save_that_fails_promises_no_next_save_and_is_the_runs_failure(tmp_path):
    # the issue's 30 MiB disk: epoch 1's save lands, the last epoch's does not; the run said "2 epochs done", exit 0
    saves, fit = _saves(tmp_path)
    last = saves.checkpoints.last
    fit.state = TrainState(epoch=1, batches=12, batch_size=8)  # epoch 1 done
    with lines_logged() as log:
        saves.save(fit)
        saves.finish(fit)
        assert saves.failed is None  # it landed: the run may say "done"
        fit.state = TrainState(epoch=2, batches=12, batch_size=8)  # epoch 2, the last, done
        with files_limited_to(1024):
            saves.save(fit, final=True)
            saves.finish(fit)
    assert log.lines == [f"could not save checkpoint {last}: File too large; the previous {last} is intact"]
    assert saves.failed == (
        f"training ended after epoch 2 but could not save {last} (the warning above says why); the {last} on disk "
        f"is from the end of epoch 1: python train.py --resume {last} continues from the end of epoch 1, not from here"
    )


def test_a_stop_requeues_the_job_only_once_its_save_is_on_disk(tmp_path, monkeypatch):
    # SLURM's requeue signal: scontrol requeue after the stop save; after a save that failed, never (the requeued job
    # would restart from an older last.pt, or from nothing, saying it restarts from "the saved last.pt")
    from tests.test_slurm import JOB_ID, srun_env, stand_in_scontrol

    log = tmp_path / "scontrol.log"
    stand_in_scontrol(tmp_path / "bin", log)
    monkeypatch.setattr("os.environ", srun_env(0, 1, 29500, tmp_path / "bin"))
    for limited, requeued in ((True, False), (False, True)):
        saves, fit = _saves(tmp_path / str(limited))
        saves.control.preemption.requeue = True  # the requeue signal came
        with lines_logged() as lines, files_limited_to(1024) if limited else contextlib.nullcontext(), saves.control:
            saves.stop(fit, EpochStats(torch.zeros(3), batch=7))
        assert log.exists() is requeued and (saves.failed is None) is requeued, lines.lines
    last = saves.checkpoints.last
    assert log.read_text().split() == ["requeue", JOB_ID]
    assert lines.lines[-1] == f"requeued SLURM job {JOB_ID}: it restarts from {last} (epoch 1, batch 7/12)"


def test_a_stop_at_once_names_the_save_being_written_and_what_is_on_disk(tmp_path):
    saves, fit = _saves(tmp_path)
    last = saves.checkpoints.last
    assert saves.at_once_words() == f"no {last} is on disk: nothing to resume from"
    saves.periodic(fit, EpochStats(torch.zeros(3), batch=3))
    saves.checkpoints.wait()
    resume = f"python train.py --resume {last} continues from epoch 1, batch 3/12"
    assert saves.at_once_words() == f"the {last} on disk is from epoch 1, batch 3/12: {resume}"
    held = threading.Event()
    original = saves.checkpoints.writer._write

    def slow_write(*args):  # the write of the stop's save, still going when the second Ctrl-C comes
        held.wait(30)
        original(*args)

    saves.checkpoints.writer._write = slow_write
    saves.save(fit, EpochStats(torch.zeros(3), batch=7), final=True)
    try:
        words = saves.at_once_words()
    finally:
        held.set()
        saves.checkpoints.wait()
    assert words == f"the save of {last} being written is not finished, the {last} on disk is from epoch 1, batch " \
        f"3/12: {resume}"  # fmt: skip


def test_a_persistent_fp16_overflow_stop_names_the_gradscaler_and_amp_off(tmp_path):
    """The control's counts as a run of 25 GradScaler overflows leaves them (tests/engine/test_guard.py makes them)."""
    saves, fit = _saves(tmp_path)
    fit.step.amp = "fp16"
    control = saves.control
    control.reason, control.in_a_row, control.skipped, control.overflows = "diverged", 25, 27, 25
    with saves.control, pytest.raises(TrainingDiverged) as raised:
        saves.stop(fit, EpochStats(torch.zeros(3), batch=7))
    message = str(raised.value)
    assert message.startswith("training diverged at epoch 1, batch 7/12: 25 optimizer steps in a row"), message
    assert "(27 skipped in all, 25 of them the GradScaler's fp16 overflows)" in message, message
    assert f"saved {saves.checkpoints.last} in " in message and "try --amp off (now fp16)" in message, message
