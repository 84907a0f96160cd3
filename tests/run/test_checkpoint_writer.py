"""The checkpoint writer: a failed background write is one warning and costs no later save, the caller waits
for the snapshot only, a save holds no serialised copy in memory, and a save's further files reuse the first."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from ddp_utils.engine import ModelEMA
from ddp_utils.files import current_umask
from ddp_utils.run import Checkpointer, CheckpointWriteError, TrainState, load_checkpoint
from ddp_utils.run.checkpoint import BackgroundWriter
from ddp_utils.run.checkpoint.disk import write_serialised
from tests.multiproc import REPO_ROOT, launcher_env


def temp_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def training(model: nn.Module, ema: ModelEMA, optimizer: torch.optim.Optimizer | None = None) -> SimpleNamespace:
    """What Checkpointer.save takes besides the state: the model, its EMA and optimizer, as a TrainStep has them."""
    return SimpleNamespace(model=model, ema=ema, optimizer=optimizer)


def a_model() -> tuple[nn.Module, ModelEMA, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    return model, ModelEMA(model), torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def test_a_failed_background_write_is_one_warning_at_once_and_the_next_saves_land(tmp_path, monkeypatch, caplog):
    model, ema, optimizer = a_model()
    checkpoints = Checkpointer(tmp_path, opt={"epochs": 3}, background=True)
    real_save, calls = torch.save, []

    def disk_full_once(obj, f, *args, **kwargs):  # the second save (a periodic one) meets a full disk
        calls.append(obj["epoch"])
        if len(calls) == 2:
            f.write(b"PK\x03\x04partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full_once)
    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        checkpoints.save(TrainState(epoch=1), training(model, ema, optimizer))
        assert checkpoints.wait() is True and checkpoints.writer.failures == 0
        checkpoints.save(TrainState(epoch=2, batch=1), training(model, ema, optimizer))  # fails in the writer thread
        checkpoints.save(TrainState(epoch=3, batch=1), training(model, ema, optimizer))  # the stop save: written
        assert checkpoints.wait() is True  # the last save handed over landed
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert warnings[0].threadName == "checkpoint-writer"  # said when it failed, not at the next call
    message = warnings[0].getMessage()
    assert str(checkpoints.last) in message and "No space left on device" in message, message
    assert "the previous" in message and "is intact" in message, message
    writer = checkpoints.writer
    assert writer.failures == 1 and isinstance(writer.last_error, CheckpointWriteError)
    assert writer.last_error.errno == errno.ENOSPC
    assert calls == [0, 1, 2] and load_checkpoint(checkpoints.last)["epoch"] == 2
    assert temp_files(checkpoints.weights_dir) == []


def test_wait_is_false_when_the_last_save_failed_and_an_inline_save_still_raises(tmp_path, caplog):
    (tmp_path / "weights").write_text("a file where the directory should be")
    model, ema, optimizer = a_model()
    background = Checkpointer(tmp_path, background=True)
    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        background.save(TrainState(epoch=1), training(model, ema, optimizer))  # fails in the thread
        assert background.wait() is False
        assert background.wait() is False  # nothing new handed over: still the same answer, no second warning
    assert len(caplog.records) == 1 and "weights/last.pt" in caplog.records[0].getMessage()
    assert "no file was written" in str(background.writer.last_error)
    with pytest.raises(CheckpointWriteError, match=r"weights/last.pt.*no file was written"):
        Checkpointer(tmp_path).save(TrainState(epoch=1), training(model, ema, optimizer))  # inline: raised
    assert Checkpointer(tmp_path).wait() is True  # inline saves have nothing pending


def test_submit_returns_while_a_slowed_write_is_still_running(tmp_path, monkeypatch):
    real_save = torch.save
    entered, release = threading.Event(), threading.Event()

    def slow_save(obj, f, *args, **kwargs):  # the disk takes 2 s (or until the test lets it go)
        entered.set()
        release.wait(timeout=2.0)
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", slow_save)
    model, ema, optimizer = a_model()
    checkpoints = Checkpointer(tmp_path, opt={"epochs": 1}, background=True)
    checkpoints.save(TrainState(epoch=1), training(model, ema, optimizer))
    # save() came back while the write is still inside torch.save: it held the caller for the snapshot only
    assert entered.wait(timeout=30) and not release.is_set()
    assert checkpoints.writer.busy and not checkpoints.last.exists()
    release.set()
    assert checkpoints.wait() is True and not checkpoints.writer.busy
    assert load_checkpoint(checkpoints.last)["epoch"] == 0 and checkpoints.writer.last_seconds > 0


@pytest.mark.parametrize("links", [True, False], ids=["hard links", "links refused: copies"])
def test_a_saves_further_files_reuse_the_first_and_stay_separate_files(tmp_path, monkeypatch, links):
    if not links:
        monkeypatch.setattr(os, "link", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EXDEV, "cross-device")))
    model, ema, optimizer = a_model()
    checkpoints = Checkpointer(tmp_path, opt={"epochs": 4}, save_period=1)
    last, best, epoch0 = checkpoints.save(TrainState(epoch=1), training(model, ema, optimizer), best=True)
    assert last.read_bytes() == best.read_bytes() == epoch0.read_bytes()
    inodes = {p.stat().st_ino for p in (last, best, epoch0)}
    assert len(inodes) == (1 if links else 3)
    mode = 0o666 & ~current_umask()
    assert all(p.stat().st_mode & 0o777 == mode for p in (last, best, epoch0))
    assert temp_files(checkpoints.weights_dir) == []
    with torch.no_grad():
        model.weight.add_(1.0)
    checkpoints.save(
        TrainState(epoch=2, batch=1), training(model, ema, optimizer)
    )  # replaces, never writes into, the old
    assert load_checkpoint(last)["epoch"] == 1
    assert load_checkpoint(best)["epoch"] == 0 and load_checkpoint(epoch0)["epoch"] == 0


def test_a_further_file_that_cannot_be_written_is_left_as_it_was(tmp_path, monkeypatch):
    write_serialised({"epoch": 0}, [tmp_path / "last.pt", tmp_path / "best.pt"])
    monkeypatch.setattr(os, "link", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EPERM, "no links here")))

    def full_disk(src, dst, length=0):
        dst.write(src.read(10))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("shutil.copyfileobj", full_disk)
    with pytest.raises(CheckpointWriteError, match=r"best.pt: No space left on device; the previous .* intact"):
        write_serialised({"epoch": 1}, [tmp_path / "last.pt", tmp_path / "best.pt"])
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 1  # the ones before it are new
    assert load_checkpoint(tmp_path / "best.pt")["epoch"] == 0
    assert temp_files(tmp_path) == []


def test_a_temp_file_of_a_killed_save_is_removed_by_the_next_save_of_that_file(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".best.pt.{int(gone.stdout)}.a1b2c3d4.tmp"  # what a killed writer's hard link leaves
    stale.write_bytes(b"x" * 100)
    write_serialised({"epoch": 0}, [tmp_path / "last.pt", tmp_path / "best.pt"])
    assert not stale.exists() and temp_files(tmp_path) == []


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="the peak is read from Linux's /proc")
@pytest.mark.slow  # 450 MB written and fsynced per case
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("how", "bound"),
    [
        ("checkpointer", 1.5),  # the host snapshot (1x) and no serialised copy; a BytesIO made it 2x
        ("background", 1.5),
        ("write", 0.5),  # serialising a snapshot made beforehand: streamed, ~0x; it was 1x
    ],
)
def test_a_save_holds_no_serialised_copy_in_memory(tmp_path, how, bound):
    cmd = [
        sys.executable,
        "-m",
        "tests.multiproc",
        "tests.workers.engine_scenarios:save_peak",
        str(tmp_path),
        "150",
        how,
    ]
    done = subprocess.run(cmd, cwd=REPO_ROOT, env=launcher_env(), capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    ratio = measured["added_kib"] * 1024 / measured["file_bytes"]
    print(f"{how}: the save added {ratio:.2f}x its {measured['file_bytes'] / 2**20:.0f} MiB file at its peak")
    assert measured["file_bytes"] > 140 * 2**20
    assert ratio < bound, f"one save ({how}) added {ratio:.2f}x its {measured['file_bytes'] / 2**20:.0f} MiB file"
    weights = tmp_path / "weights"
    assert sorted(p.name for p in weights.iterdir()) == ["best.pt", "epoch0.pt", "last.pt"]


def test_background_writer_on_its_own_reports_through_wait(tmp_path):
    writer = BackgroundWriter()
    assert writer.wait() is True and writer.last_error is None  # nothing handed over: nothing lost
    writer.submit({"epoch": 1}, [tmp_path / "a" / "last.pt"])
    assert writer.wait() is True and writer.failures == 0
    with pytest.raises(TypeError, match="Path"):  # not plain: refused in the caller's thread, before any write
        writer.submit({"opt": Path("x")}, [tmp_path / "a" / "last.pt"])
    assert load_checkpoint(tmp_path / "a" / "last.pt")["epoch"] == 1


def test_an_unexpected_error_in_the_writer_thread_is_reported_as_a_failed_save(tmp_path, monkeypatch, caplog):
    from ddp_utils.run.checkpoint import disk

    def broken(ckpt, paths):
        raise ValueError("a bug, not the disk")

    monkeypatch.setattr(disk, "write_serialised", broken)
    writer = BackgroundWriter()
    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        writer.submit({"epoch": 1}, [tmp_path / "last.pt"])
        assert writer.wait() is False
    assert writer.failures == 1 and writer.last_error.errno == errno.EIO
    assert caplog.messages == [
        f"could not save checkpoint {tmp_path / 'last.pt'}: ValueError: a bug, not the disk; "
        "training goes on, the next save is tried as usual"
    ]
