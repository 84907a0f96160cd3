"""Damaged checkpoints: cut short or with bytes changed on the storage, named as such; a resume from a damaged
last.pt is one line naming the run's last good checkpoint and how to continue from it, and that advice works."""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from torch import nn
from torch.utils.serialization import config as serialization_config

from ddp_utils.distributed import DistInfo, launch_key
from ddp_utils.engine import ModelEMA
from ddp_utils.run import (
    Checkpointer,
    CheckpointError,
    DamagedCheckpointError,
    TrainState,
    UnsafeCheckpointError,
    check_integrity,
    load_checkpoint,
    save_checkpoint,
    strip_optimizer,
)
from ddp_utils.run.checkpoint import last_good_checkpoint
from ddp_utils.run.resume import find_resume


def a_checkpoint_file(path: Path) -> dict:
    torch.manual_seed(0)
    ckpt = {"model": {f"w{i}": torch.randn(128, 128) for i in range(8)}, "optimizer": {"state": {}}, "epoch": 3}
    save_checkpoint(ckpt, path)
    return ckpt


def flip(path: Path, offset: int, count: int = 16) -> None:
    """Change ``count`` bytes at ``offset`` in place, as a failing disk or a bad copy would."""
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(count)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))


def inside_a_tensor(path: Path) -> int:
    """The offset of the first tensor's bytes in a checkpoint archive (flipping padding would change nothing)."""
    with zipfile.ZipFile(path) as archive:
        record = next(r for r in archive.infolist() if "/data/" in r.filename)
    with open(path, "rb") as f:
        f.seek(record.header_offset + 26)
        name_length, extra_length = struct.unpack("<HH", f.read(4))
    return record.header_offset + 30 + name_length + extra_length


def test_a_file_cut_short_is_damaged_and_says_where_it_ends(tmp_path):
    path = tmp_path / "last.pt"
    a_checkpoint_file(path)
    size = path.stat().st_size
    os.truncate(path, size // 2)
    with pytest.raises(DamagedCheckpointError) as info:
        load_checkpoint(path)
    assert str(info.value) == (
        f"checkpoint {path} is damaged (cut short at {size // 2 / 1e6:.1f} MB: the end of the archive is missing)"
    )
    assert isinstance(info.value, CheckpointError)  # train.py's one-line user error
    with pytest.raises(DamagedCheckpointError, match="cut short"):
        check_integrity(path)


def test_bytes_changed_inside_a_tensor_load_silently_and_the_checksums_find_them(tmp_path):
    path = tmp_path / "last.pt"
    ckpt = a_checkpoint_file(path)
    flip(path, inside_a_tensor(path))
    loaded = torch.load(path, weights_only=True)  # torch checks no checksum: wrong tensors, no error
    assert not all(torch.equal(loaded["model"][k], v) for k, v in ckpt["model"].items())
    with pytest.raises(DamagedCheckpointError, match=r"data/\d+ does not match its CRC-32: bytes changed on the"):
        check_integrity(path)


def test_bytes_changed_in_the_pickle_are_damage_not_an_unsafe_file(tmp_path):
    path = tmp_path / "best.pt"
    a_checkpoint_file(path)
    flip(path, 60)  # inside data.pkl: torch's unpickler reads a refused object
    with pytest.raises(DamagedCheckpointError, match=r"data.pkl does not match its CRC-32") as info:
        load_checkpoint(path)
    assert not isinstance(info.value, UnsafeCheckpointError)


def test_a_changed_zip_directory_and_an_empty_file_are_damage(tmp_path):
    path = tmp_path / "last.pt"
    a_checkpoint_file(path)
    flip(path, path.stat().st_size - 200)  # inside the central directory at the end
    with pytest.raises(DamagedCheckpointError, match="zip directory"):
        load_checkpoint(path)
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(DamagedCheckpointError, match="the file is empty"):
        load_checkpoint(tmp_path / "empty.pt")


def test_a_whole_file_passes_and_one_saved_without_checksums_is_not_taken_for_damage(tmp_path):
    a_checkpoint_file(tmp_path / "last.pt")
    check_integrity(tmp_path / "last.pt")
    serialization_config.save.compute_crc32 = False  # (monkeypatch's undo cannot restore torch's config)
    try:
        torch.save({"w": torch.ones(100)}, tmp_path / "plain.pt")  # every CRC-32 field is 0
    finally:
        serialization_config.save.compute_crc32 = True
    check_integrity(tmp_path / "plain.pt")
    (tmp_path / "notes.pt").write_text("epochs: 3\n")
    check_integrity(tmp_path / "notes.pt")  # no archive: load_checkpoint says what it is


def test_the_last_good_checkpoint_is_the_furthest_on_that_is_whole_and_resumable(tmp_path):
    def save(name: str, epoch: int, batch: int, optimizer: bool = True) -> Path:
        state = {"epoch": epoch, "batch": batch}
        ckpt = {"model": {"w": torch.ones(3)}, "optimizer": {"state": {}} if optimizer else None, "opt": {}}
        return save_checkpoint({**ckpt, "epoch": epoch - 1, "train_state": state}, tmp_path / name)

    older, newest, stripped, damaged = (
        save("a.pt", 2, 0),
        save("b.pt", 3, 5),
        save("c.pt", 9, 0, False),
        save("d.pt", 4, 0),
    )
    flip(damaged, inside_a_tensor(damaged), count=4)
    progress = lambda ckpt: (ckpt["train_state"]["epoch"], ckpt["train_state"]["batch"])  # noqa: E731
    path, ckpt = last_good_checkpoint([older, newest, stripped, damaged], progress)
    assert path == newest and ckpt["train_state"] == {"epoch": 3, "batch": 5}
    assert last_good_checkpoint([stripped, damaged], progress) is None
    assert last_good_checkpoint([stripped, damaged], progress, resumable=False)[0] == stripped


# ---- resuming from a damaged last.pt: find_resume, in this process (no process group) ----


def a_run(project: Path, info: DistInfo, epochs_done: int) -> Path:
    """A run after ``epochs_done`` epochs, saved as train.py saves: last.pt, best.pt (the first epoch), epochN.pt."""
    save_dir = project / "exp"
    save_dir.mkdir(parents=True)
    opt = {"epochs": 10, "project": str(project), "name": "exp", "save_dir": str(save_dir),
           "run_key": launch_key(info), "batch_size": 8}  # fmt: skip
    (save_dir / "opt.yaml").write_text(yaml.safe_dump(opt))
    model = nn.Linear(2, 1)
    checkpoints = Checkpointer(save_dir, opt=opt, hyp={"lr0": 0.01}, save_period=1)
    for epoch in range(epochs_done):
        state = TrainState(epoch=epoch + 1, batches=8, batch_size=8, best_epoch=0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        checkpoints.save(state, SimpleNamespace(model=model, ema=ModelEMA(model), optimizer=optimizer), best=epoch == 0)
    return checkpoints.last


def resume_options(last: Path | None, project: Path) -> argparse.Namespace:
    return argparse.Namespace(resume=str(last) if last else False, project=str(project))


@pytest.mark.parametrize("damage", ["cut short", "bytes changed"])
def test_a_damaged_last_pt_names_the_runs_last_good_checkpoint_and_that_advice_resumes(tmp_path, damage):
    info = DistInfo()
    last = a_run(tmp_path / "runs", info, epochs_done=3)
    weights = last.parent
    size = last.stat().st_size
    if damage == "cut short":  # in place: epoch2.pt, the same save's file, shares its bytes and is lost with it
        os.truncate(last, size // 2)
    else:
        flip(last, inside_a_tensor(last), count=4)
    with pytest.raises(CheckpointError) as raised:
        find_resume(resume_options(last, tmp_path / "runs"), info, {})
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"--resume {last}: the checkpoint is damaged (")
    assert ("cut short at" if damage == "cut short" else "does not match its CRC-32") in message
    good = weights / "epoch1.pt"  # epoch 2 done; best.pt (epoch 1) is older, epoch2.pt is damaged too
    saved = load_checkpoint(good)["date"]
    assert f"the run's {good} (epoch 2 done, saved {saved}) loads: continue from it with " in message, message
    advice = f"`mv {last} {last}.damaged && cp {good} {last}` then `python train.py --resume {last}`"
    assert message.endswith(advice), message

    subprocess.run(["sh", "-c", advice.split("`")[1]], check=True)  # what the message says, as a shell runs it
    resume = find_resume(resume_options(last, tmp_path / "runs"), info, {})
    assert resume is not None and resume.state.epoch == 2 and resume.checkpoint == last
    assert (weights / "last.pt.damaged").stat().st_size == last.stat().st_size or damage == "cut short"


def test_an_elastic_restart_meeting_a_damaged_last_pt_says_the_same(tmp_path):
    info = DistInfo(restart_count=1)
    last = a_run(tmp_path / "runs", info, epochs_done=1)  # last.pt, best.pt and epoch0.pt: one save, one file
    os.truncate(last, 1000)
    with pytest.raises(CheckpointError) as raised:
        find_resume(resume_options(None, tmp_path / "runs"), info, {})
    assert str(raised.value) == (
        f"elastic restart 1 from {last}: the checkpoint is damaged (cut short at 1000 bytes: the end of the archive "
        "is missing); no other checkpoint of this run can resume it: start again"
    )


def test_with_only_stripped_weights_left_the_message_offers_them(tmp_path):
    info = DistInfo()
    last = a_run(tmp_path / "runs", info, epochs_done=2)
    best = last.parent / "best.pt"
    strip_optimizer(best)  # what the end of a run leaves: weights only
    for name in ("last.pt", "epoch0.pt", "epoch1.pt"):
        (last.parent / name).write_bytes(b"\0" * 4096)  # blocks lost on the storage read back as zeros
    with pytest.raises(CheckpointError) as raised:
        find_resume(resume_options(last, tmp_path / "runs"), info, {})
    message = str(raised.value)
    damage = "the checkpoint is damaged (it begins with 4096 zero bytes: its data never reached the storage)"
    assert message.startswith(f"--resume {last}: {damage}; "), message
    assert message.endswith(f"no other checkpoint of this run can resume it: start a new run from its weights with "
                            f"--weights {best}"), message  # fmt: skip
