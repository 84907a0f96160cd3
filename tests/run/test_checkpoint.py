"""Checkpoints: plain contents, weights_only loading, atomic writes that survive failures and kills."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from ddp_utils.engine import ModelEMA, smart_optimizer
from ddp_utils.run import (
    CHECKPOINT_KEYS,
    Checkpointer,
    CheckpointError,
    CheckpointWriteError,
    TrainState,
    UnsafeCheckpointError,
    build_checkpoint,
    load_checkpoint,
    restore_training,
    save_checkpoint,
    strip_optimizer,
)

from ..multiproc import REPO_ROOT, launcher_env


def trained_state():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    model.yaml = {"nc": 2, "backbone": [[-1, 1, "Conv", [4, 3]]]}
    optimizer = smart_optimizer(model, "SGD", lr=0.01)
    scaler = torch.amp.GradScaler("cpu", enabled=True)
    ema = ModelEMA(model, tau=2)
    for _ in range(3):
        loss = model(torch.randn(2, 3, 8, 8)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ema.update(model)
    return model, optimizer, scaler, ema


def a_checkpoint(epoch: int = 7):
    model, optimizer, scaler, ema = trained_state()
    opt = argparse.Namespace(save_dir=Path("runs/train/exp"), imgsz=(64, 64), epochs=10)
    ckpt = build_checkpoint(
        ema.ema,
        optimizer=optimizer,
        scaler=scaler,
        ema_updates=ema.updates,
        epoch=epoch,
        best_fitness=0.25,
        opt=opt,
        hyp={"lr0": 0.01},
    )
    return ckpt, (model, optimizer, scaler, ema)


def temp_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_round_trip_with_weights_only(tmp_path):
    ckpt, (_, optimizer, _, ema) = a_checkpoint()
    assert set(ckpt) == set(CHECKPOINT_KEYS)
    assert save_checkpoint(ckpt, tmp_path / "weights" / "last.pt") == tmp_path / "weights" / "last.pt"
    loaded = torch.load(tmp_path / "weights" / "last.pt", weights_only=True)  # the bare torch call works too
    loaded = load_checkpoint(tmp_path / "weights" / "last.pt")
    assert loaded["opt"] == {"save_dir": "runs/train/exp", "imgsz": [64, 64], "epochs": 10}
    assert loaded["model_cfg"]["nc"] == 2 and loaded["epoch"] == 7 and loaded["ema_updates"] == 3
    for k, v in ema.ema.state_dict().items():
        torch.testing.assert_close(loaded["model"][k], v)
    assert loaded["optimizer"]["param_groups"][1]["name"] == "weight"
    assert loaded["scaler"]["scale"] == ckpt["scaler"]["scale"]
    assert temp_files(tmp_path / "weights") == []


def test_restore_training_resumes_state(tmp_path):
    ckpt, (_, optimizer, _, ema) = a_checkpoint(epoch=4)
    save_checkpoint(ckpt, tmp_path / "last.pt")
    model2, optimizer2, scaler2, ema2 = trained_state()
    with torch.no_grad():
        for p in model2.parameters():
            p.zero_()
    state = restore_training(load_checkpoint(tmp_path / "last.pt"), model2, optimizer2, ema2, scaler2)
    assert (state.epoch, state.batch, state.best_fitness) == (5, 0, 0.25)  # a checkpoint of an epoch's end
    assert ema2.updates == ema.updates
    torch.testing.assert_close(model2.state_dict()["0.weight"], ema.ema.state_dict()["0.weight"])
    momentum = optimizer.state_dict()["state"][0]["momentum_buffer"]
    torch.testing.assert_close(optimizer2.state_dict()["state"][0]["momentum_buffer"], momentum)


def test_save_refuses_entries_that_need_pickle(tmp_path):
    with pytest.raises(TypeError, match=r"ckpt\['opt'\]\['save_dir'\] is a \w*Path"):
        save_checkpoint({"opt": {"save_dir": Path("x")}}, tmp_path / "a.pt")
    assert not (tmp_path / "a.pt").exists()


def test_pickled_module_is_refused_clearly_and_loads_when_trusted(tmp_path):
    path = tmp_path / "yolov5s.pt"
    torch.save({"model": nn.Linear(2, 2), "epoch": -1}, path)
    with pytest.raises(UnsafeCheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert str(path) in message and "arbitrary Python objects" in message and "trusted=True" in message
    assert "torch.nn.modules.linear.Linear" in message
    with pytest.warns(UserWarning, match="weights_only=False"):
        loaded = load_checkpoint(path, trusted=True)
    assert isinstance(loaded["model"], nn.Linear)


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all"])
def test_broken_files_name_the_file(tmp_path, content):
    path = tmp_path / "broken.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="broken.pt"):
        load_checkpoint(path)
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        load_checkpoint(tmp_path / "missing.pt")


def test_failed_save_keeps_the_previous_file(tmp_path, monkeypatch):
    target = tmp_path / "last.pt"
    save_checkpoint({"epoch": 1, "model": {"w": torch.ones(10)}}, target)
    before = target.read_bytes()
    real_save = torch.save

    def disk_fills_up(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04partial zip")  # some bytes reach the temp file, then the disk is full
        f.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_fills_up)
    with pytest.raises(CheckpointWriteError) as info:
        save_checkpoint({"epoch": 2, "model": {"w": torch.zeros(10)}}, target)
    monkeypatch.setattr(torch, "save", real_save)
    assert info.value.errno == errno.ENOSPC and isinstance(info.value, OSError)
    message = str(info.value)
    assert str(target) in message and "No space left" in message and "intact" in message
    assert target.read_bytes() == before
    assert load_checkpoint(target)["epoch"] == 1
    assert temp_files(tmp_path) == []


def test_failed_first_save_says_nothing_was_written(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "save", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(CheckpointWriteError, match="no file was written"):
        save_checkpoint({"epoch": 0}, tmp_path / "best.pt")
    assert list(tmp_path.iterdir()) == []


def test_strip_optimizer_halves_and_drops_state(tmp_path):
    ckpt, (_, optimizer, _, ema) = a_checkpoint()
    save_checkpoint(ckpt, tmp_path / "best.pt")
    size = (tmp_path / "best.pt").stat().st_size
    assert strip_optimizer(tmp_path / "best.pt") == tmp_path / "best.pt"
    stripped = load_checkpoint(tmp_path / "best.pt")
    assert stripped["optimizer"] is None and stripped["scaler"] is None and stripped["epoch"] == -1
    assert stripped["model"]["0.weight"].dtype == torch.float16
    assert stripped["model"]["1.num_batches_tracked"].dtype == torch.int64
    assert (tmp_path / "best.pt").stat().st_size < size
    _, optimizer2, _, _ = trained_state()
    with pytest.raises(CheckpointError, match="cannot resume"):
        restore_training(stripped, ema.ema, optimizer2)
    fresh = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    restore_training(stripped, fresh)  # pretrained weights: fp16 is cast back on load
    assert fresh[0].weight.dtype == torch.float32


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_target_survives_sigkill_during_saves(tmp_path):
    target = tmp_path / "last.pt"
    rng = random.Random(1234)
    env = launcher_env()  # a single process: it is the main process
    tags_seen, mid_write_kills = [], 0
    for attempt in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.multiproc", "tests.workers.engine_scenarios:save_loop", str(target), "16"],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            first = proc.stdout.readline()  # one complete save of this process
            assert first.strip().isdigit(), proc.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(rng.uniform(0.0, 0.6))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
        mid_write_kills += bool(temp_files(tmp_path))
        ckpt = load_checkpoint(target)  # always the whole of some save
        w = ckpt["model"]["w"]
        assert w.numel() == 16 * 2**20 // 4
        assert torch.all(w == float(ckpt["epoch"])) and ckpt["opt"]["tag"] == ckpt["epoch"]
        tags_seen.append(ckpt["epoch"])
        print(f"kill {attempt}: target holds save {ckpt['epoch']}, temp file left: {bool(temp_files(tmp_path))}")
    # the next save clears what killed writers left behind
    save_checkpoint({"epoch": 0}, target)
    assert temp_files(tmp_path) == [], f"{mid_write_kills} kills landed mid-write"


def test_unwritable_target_is_named(tmp_path):
    (tmp_path / "weights").write_text("a file where the directory should be")
    with pytest.raises(CheckpointWriteError, match=r"weights/last.pt.*no file was written"):
        save_checkpoint({"epoch": 0}, tmp_path / "weights" / "last.pt")


def test_train_model_weights_resume_exactly_and_are_stripped(tmp_path):
    torch.manual_seed(0)
    raw, averaged = nn.Linear(3, 2), nn.Linear(3, 2)
    ckpt = build_checkpoint(averaged, optimizer=torch.optim.SGD(raw.parameters(), lr=0.1), epoch=2)
    ckpt["train_model"] = raw.state_dict()
    path = tmp_path / "last.pt"
    save_checkpoint(ckpt, path)

    model, ema = nn.Linear(3, 2), ModelEMA(nn.Linear(3, 2))
    state = restore_training(load_checkpoint(path), model, torch.optim.SGD(model.parameters(), lr=0.1), ema)
    assert state.epoch == 3
    assert torch.equal(model.weight, raw.weight)  # training continues from the raw weights
    assert torch.equal(ema.ema.weight, averaged.weight)  # the EMA from its own

    strip_optimizer(path)
    assert "train_model" not in load_checkpoint(path)


def test_latest_checkpoint_finds_the_newest_or_the_run_with_the_key(tmp_path):
    from ddp_utils.run import latest_checkpoint

    for name, key, age in (("exp", "job-a", 30), ("exp2", "job-b", 20), ("exp3", None, 10)):
        weights = tmp_path / name / "weights"
        weights.mkdir(parents=True)
        (weights / "last.pt").write_bytes(b"x")
        if key:
            (tmp_path / name / "opt.yaml").write_text(f"run_key: {key}\n")
        stamp = time.time() - age
        os.utime(weights / "last.pt", (stamp, stamp))
    assert latest_checkpoint(tmp_path) == tmp_path / "exp3" / "weights" / "last.pt"
    assert latest_checkpoint(tmp_path, run_key="job-a") == tmp_path / "exp" / "weights" / "last.pt"
    assert latest_checkpoint(tmp_path, run_key="job-z") is None
    assert latest_checkpoint(tmp_path / "missing") is None


def test_checkpointer_serialises_once_and_writes_the_same_bytes_to_each_file(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    ema = ModelEMA(model)
    optimizer = smart_optimizer(model, "SGD", lr=0.01)
    hyp = {"lr0": 0.01, "box": 0.05}
    checkpoints = Checkpointer(tmp_path, opt=argparse.Namespace(epochs=5, save_dir=tmp_path), hyp=hyp, save_period=2)
    saves = []
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: (saves.append(1), real_save(obj, f, *a, **k))[1])

    training = SimpleNamespace(model=model, ema=ema, optimizer=optimizer, scaler=torch.amp.GradScaler(enabled=False))
    written = checkpoints.save(TrainState(epoch=2, best_fitness=0.5), training, best=True)
    assert [p.name for p in written] == ["last.pt", "best.pt", "epoch1.pt"] and len(saves) == 1
    assert written[0].read_bytes() == written[1].read_bytes() == written[2].read_bytes()
    ckpt = load_checkpoint(written[0])
    assert set(ckpt) == set(CHECKPOINT_KEYS)  # every key it writes is a known one
    assert ckpt["epoch"] == 1 and ckpt["best_fitness"] == 0.5 and ckpt["scaler"] is None
    assert ckpt["hyp"] == hyp and ckpt["opt"] == {"epochs": 5, "save_dir": str(tmp_path)}
    assert ckpt["train_model"].keys() == ckpt["model"].keys() and ckpt["optimizer"] is not None

    # an interrupted epoch: last.pt only, whatever the period says
    assert [p.name for p in checkpoints.save(TrainState(epoch=3, batch=2), training)] == ["last.pt"]
    assert [p.name for p in checkpoints.save(TrainState(epoch=4), training)] == ["last.pt", "epoch3.pt"]
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["best.pt", "epoch1.pt", "epoch3.pt", "last.pt"]


def test_checkpointer_writes_resume_exactly(tmp_path):
    model, optimizer, scaler, ema = trained_state()
    Checkpointer(tmp_path).save(TrainState(epoch=1), SimpleNamespace(model=model, ema=ema, optimizer=optimizer))
    raw = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    restore_training(load_checkpoint(tmp_path / "weights" / "last.pt"), raw)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), raw.state_dict().values()))


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_a_fused_optimizer_stays_fused_when_resumed_from_a_non_fused_checkpoint(tmp_path, name):
    model, _, scaler, ema = trained_state()
    plain = smart_optimizer(model, name, lr=0.01)  # on the CPU the automatic choice: not fused
    model(torch.randn(2, 3, 8, 8)).square().mean().backward()
    plain.step()
    assert all(g["fused"] is None for g in plain.state_dict()["param_groups"])
    save_checkpoint(build_checkpoint(ema.ema, optimizer=plain, scaler=scaler, epoch=3), tmp_path / "last.pt")
    model2, _, scaler2, ema2 = trained_state()
    fused = smart_optimizer(model2, name, lr=0.01, fused=True)  # what a CUDA run builds
    restore_training(load_checkpoint(tmp_path / "last.pt"), model2, fused, ema2, scaler2)
    assert all(g["fused"] is True for g in fused.param_groups)
    assert fused.state_dict()["state"].keys() == plain.state_dict()["state"].keys()
    # and it steps as a fused optimizer, taking the scaler's tensors without reading them back
    scaler2.scale(model2(torch.randn(2, 3, 8, 8)).square().mean()).backward()
    scaler2.step(fused)
    scaler2.update()
    assert fused._step_supports_amp_scaling


def test_a_background_save_holds_the_caller_for_the_copy_only_and_lands_in_order(tmp_path):
    model, optimizer, scaler, ema = trained_state()
    checkpoints = Checkpointer(tmp_path, opt={"epochs": 3}, background=True)
    state = TrainState(
        epoch=1, batch=3, batches=8, batch_size=16, world_size=2, last_opt_step=10, loss=[[1.0, 2, 3]] * 2
    )
    training = SimpleNamespace(model=model, ema=ema, optimizer=optimizer, scaler=scaler)
    checkpoints.save(state, training)
    with torch.no_grad():  # training goes on while the file is written: the snapshot must not see it
        for p in model.parameters():
            p.add_(1.0)
    checkpoints.save(dataclasses.replace(state, batch=5), training)
    checkpoints.wait()
    ckpt = load_checkpoint(tmp_path / "weights" / "last.pt")
    assert TrainState.from_checkpoint(ckpt) == dataclasses.replace(state, batch=5)  # the newer save, last
    assert torch.equal(ckpt["train_model"]["0.weight"], model[0].weight.detach())
    assert temp_files(tmp_path / "weights") == []


def test_the_checkpoint_says_the_epoch_and_best_fitness_once(tmp_path):
    """YOLOv5's top-level ``epoch`` (the last one done) and ``best_fitness``; train_state holds the rest, once."""
    model, optimizer, scaler, ema = trained_state()
    state = TrainState(epoch=4, batch=3, batches=8, world_size=2, best_fitness=0.25, skipped=2)
    Checkpointer(tmp_path).save(state, SimpleNamespace(model=model, ema=ema, optimizer=optimizer))
    ckpt = load_checkpoint(tmp_path / "weights" / "last.pt")
    assert ckpt["epoch"] == 3 and ckpt["best_fitness"] == 0.25
    assert "epoch" not in ckpt["train_state"] and "best_fitness" not in ckpt["train_state"]
    assert TrainState.from_checkpoint(ckpt) == state
    # a file written before: train_state carried them too, with the same meaning as the top level
    older = {**ckpt, "train_state": {**ckpt["train_state"], "epoch": 4, "best_fitness": 0.25}}
    assert TrainState.from_checkpoint(older) == state


def test_train_state_round_trips_and_is_stripped(tmp_path):
    model, optimizer, scaler, ema = trained_state()
    state = TrainState(epoch=2, batch=5, batches=8, batch_size=16, world_size=2, last_opt_step=20,
                       loss=[[0.1, 0.2, 0.3], [0.3, 0.2, 0.1]], best_fitness=0.4, best_epoch=1,
                       last_val={"metrics": {"map": 0.3}, "val_loss": [1.0, 2.0, 3.0], "maps": [0.1, 0.2]})  # fmt: skip
    Checkpointer(tmp_path).save(state, SimpleNamespace(model=model, ema=ema, optimizer=optimizer, scaler=scaler))
    loaded = restore_training(load_checkpoint(tmp_path / "weights" / "last.pt"), model, optimizer, ema, scaler)
    assert loaded == state and loaded.where() == "epoch 3, batch 5/8"
    assert torch.equal(loaded.rank_loss(1, 2), torch.tensor([0.3, 0.2, 0.1]))  # its own at the same scale
    assert torch.allclose(loaded.rank_loss(0, 1), torch.tensor([0.2, 0.2, 0.2]))  # the ranks' mean at another
    metrics, val_loss = loaded.metrics()
    assert metrics == {"precision": 0.0, "recall": 0.0, "map50": 0.0, "map": 0.3} and val_loss.tolist() == [1, 2, 3]
    strip_optimizer(tmp_path / "weights" / "last.pt")
    assert "train_state" not in load_checkpoint(tmp_path / "weights" / "last.pt")


def test_a_text_file_is_named_as_what_it_is(tmp_path):
    path = tmp_path / "weights.pt"
    path.write_text("epochs: 3\nlr0: 0.01\n")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert (
        str(info.value) == f'checkpoint {path} is not a torch checkpoint: a text file of 20 bytes beginning "epochs: 3"'
    )
