"""train_one_epoch: the same numbers as the plain loop it replaced, accumulation without needless all-reduces."""

from __future__ import annotations

import copy
import math
import os
import random
import re
import signal
import time

import numpy as np
import pytest
import torch

from ddp_utils.data import class_frequency, load_hyp
from ddp_utils.data.multiscale import multi_scale_resize, multi_scale_size
from ddp_utils.engine import (
    EpochStats,
    ModelEMA,
    TrainStep,
    Warmup,
    lr_lambda,
    resolve_amp,
    smart_optimizer,
    train_one_epoch,
)
from ddp_utils.run import build_checkpoint, restore_training
from ddp_utils.run.control import StepControl
from ddp_utils.yolo import ComputeLoss, Model, scale_loss_gains

from ..multiproc import describe, launch, records

CPU = torch.device("cpu")


def batches(n: int, size: int = 64, batch: int = 2, seed: int = 0) -> list[tuple]:
    """Fixed uint8 image batches with YOLO targets ``[image, class, x, y, w, h]`` (normalised)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        imgs = torch.randint(0, 256, (batch, 3, size, size), generator=g, dtype=torch.uint8)
        rows = [[i, int(torch.randint(0, 3, (1,), generator=g)), 0.5, 0.5, 0.3, 0.4] for i in range(batch)]
        out.append((imgs, torch.tensor(rows), [f"im{i}.jpg" for i in range(batch)], None))
    return out


def fresh_run(nb: int, multi_scale: bool):
    """A tiny detector with its optimizer, EMA, loss and warm-up, made the way train.py makes them."""
    torch.manual_seed(0)
    model = Model("yolov5n.yaml", ch=3, nc=3)
    hyp = load_hyp("hyp.shapes.yaml")
    optimizer = smart_optimizer(model, "SGD", hyp["lr0"], hyp["momentum"], hyp["weight_decay"])
    lf = lr_lambda(hyp["lrf"], 3)
    torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lf)
    labels = [np.array([[0, 0.5, 0.5, 0.1, 0.1]]), np.array([[2, 0.5, 0.5, 0.1, 0.1]])]
    model.initialize_biases(class_frequency(labels, 3))
    ema = ModelEMA(model)
    compute_loss = ComputeLoss(model, scale_loss_gains(hyp, model.model[-1].nl, 3, 64))
    warmup = Warmup(optimizer, lf, nb, 1.0, hyp["warmup_bias_lr"], hyp["warmup_momentum"], hyp["momentum"], 4)
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    return model, optimizer, ema, compute_loss, warmup, scaler, (64, 32) if multi_scale else None


def reference_epoch(model, optimizer, ema, compute_loss, warmup, scaler, multi_scale, loader, epoch, nb, state):
    """train.py's loop body before train_one_epoch existed, kept as the reference it must match bit for bit."""
    model.train()
    mloss = torch.zeros(3)
    optimizer.zero_grad()
    for i, (imgs_uint8, targets, _paths, _shapes) in enumerate(loader):
        ni = i + nb * epoch
        imgs = imgs_uint8.to(CPU, non_blocking=True).float() / 255
        warmup.step(ni, epoch)
        accumulate = warmup.accumulate(ni, 2)
        if multi_scale is not None:
            imgsz, grid_size = multi_scale
            size = multi_scale_size(imgsz, grid_size, 0, epoch, ni)  # a function of (seed, epoch, step)
            factor = size / max(imgs.shape[2:])
            if factor != 1:
                new_shape = [math.ceil(x * factor / grid_size) * grid_size for x in imgs.shape[2:]]
                imgs = torch.nn.functional.interpolate(imgs, size=new_shape, mode="bilinear")
        with torch.autocast("cpu", enabled=False):
            pred = model(imgs)
            loss, loss_items = compute_loss(pred, targets.to(CPU))
        scaler.scale(loss).backward()
        if ni - state["last_opt_step"] >= accumulate:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            ema.update(model)
            state["last_opt_step"] = ni
        mloss = (mloss * i + loss_items) / (i + 1)
    return mloss


@pytest.mark.timeout(300)
@pytest.mark.parametrize("multi_scale", [False, True])
def test_train_one_epoch_matches_the_plain_loop_bit_for_bit_on_cpu(multi_scale):
    torch.set_num_threads(1)
    nb, epochs = 5, 2
    loader = batches(nb)
    old = fresh_run(nb, multi_scale)
    new = copy.deepcopy(old)
    state = {"last_opt_step": -1}
    random.seed(1)
    old_losses = [reference_epoch(*old, loader, epoch, nb, state) for epoch in range(epochs)]

    model, optimizer, ema, compute_loss, warmup, scaler, scale = new
    step = TrainStep(model, optimizer, scaler, ema, compute_loss, 2, warmup, multi_scale=scale)
    random.seed(1)
    new_stats = [train_one_epoch(step, loader, epoch, CPU, nb=nb) for epoch in range(epochs)]

    for old_loss, stats in zip(old_losses, new_stats):
        assert torch.equal(old_loss, stats.loss), (old_loss, stats.loss)
        assert stats.images == nb * 2 and not stats.stopped
    assert step.last_opt_step == state["last_opt_step"] and step.optimizer_steps > 2
    for (name, a), b in zip(old[0].state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    for (name, a), b in zip(old[2].ema.state_dict().items(), ema.ema.state_dict().values()):
        assert torch.equal(a, b), f"ema {name}"
    assert old[2].updates == ema.updates
    assert optimizer.state_dict()["param_groups"] == old[1].state_dict()["param_groups"]


def test_epoch_speed_line_is_stable_for_parsers():
    stats = EpochStats(torch.zeros(3), images=250, seconds=2.0, data_seconds=0.064)
    assert stats.speed(world_size=2) == "250.0 img/s, data wait 3.2%"
    assert re.fullmatch(r"\d+\.\d img/s, data wait \d+\.\d%", EpochStats(torch.zeros(3)).speed())


def test_timing_on_cpu_counts_the_wait_for_data():
    class SlowLoader(list):
        def __iter__(self):
            for item in list.__iter__(self):
                time.sleep(0.2)
                yield item

    model, optimizer, ema, compute_loss, warmup, scaler, _ = fresh_run(2, False)
    step = TrainStep(model, optimizer, scaler, ema, compute_loss, 1, None)
    stats = train_one_epoch(step, SlowLoader(batches(2)), 0, CPU, progress=True, epochs=1)
    assert stats.images == 4 and 0.35 < stats.data_seconds <= stats.seconds
    assert torch.isfinite(stats.loss).all()


def test_resolve_amp_defaults_and_refusals():
    assert resolve_amp(None, CPU) == "off" and resolve_amp(None, torch.device("cuda", 0)) == "fp16"
    assert resolve_amp("bf16", CPU) == "bf16"
    with pytest.raises(ValueError, match="--amp fp16 needs a CUDA device"):
        resolve_amp("fp16", CPU)
    with pytest.raises(ValueError, match="--amp half"):
        resolve_amp("half", CPU)


def test_class_frequency_and_multi_scale_resize():
    labels = [np.array([[1, 0.5, 0.5, 0.1, 0.1]] * 3), np.zeros((0, 5)), np.array([[0, 0.5, 0.5, 0.1, 0.1]])]
    assert class_frequency(labels, 3).tolist() == [1.0, 3.0, 0.0]
    assert class_frequency([np.zeros((0, 5))], 2).tolist() == [0.0, 0.0]
    sizes = {tuple(multi_scale_resize(torch.zeros(1, 3, 64, 96), 64, 32, step=k).shape[2:]) for k in range(30)}
    assert all(h % 32 == 0 and w % 32 == 0 for h, w in sizes) and len(sizes) > 1


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_no_sync_on_accumulation_steps_gives_the_synced_weights_on_gloo():
    workers = launch("tests.workers.engine_scenarios:no_sync_matches_synced", 2, timeout=120, args=("8", "4"))
    assert all(w.returncode == 0 for w in workers), describe(workers)
    rank0, rank1 = records(workers)
    for record in (rank0, rank1):
        assert record["optimizer_steps"] == 2
        for got, want in zip(record["weights"], record["reference"]):
            assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
        # one bucket: 8 backward passes all-reduce 8 times when always synced, twice with no_sync
        assert record["synced_calls"] == 8 and record["skipping_calls"] == 2, record
    assert rank0["weights"] == rank1["weights"]  # DDP keeps the ranks equal either way


@pytest.mark.timeout(120)
def test_bf16_autocast_on_cpu_trains_without_a_scaler():
    model, optimizer, ema, compute_loss, warmup, scaler, _ = fresh_run(2, False)
    before = [p.detach().clone() for p in model.parameters()]
    step = TrainStep(model, optimizer, scaler, ema, compute_loss, 1, None, amp="bf16")
    stats = train_one_epoch(step, batches(2), 0, CPU)
    assert torch.isfinite(stats.loss).all() and step.optimizer_steps == 2 and not scaler.is_enabled()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


class RequestAt:
    """A real StepControl (no process group: its answers are this process's, at once), and an ``on_batch`` that
    makes a stop (a real SIGTERM) or a save (the control's clock moved past its interval) due after batch ``i``."""

    def __init__(self, stop_at: int | None = None, save_at: int | None = None) -> None:
        self.now = 0.0
        self.control = StepControl(save_interval=60.0, clock=lambda: self.now)
        self.stop_at, self.save_at = stop_at, save_at

    def __call__(self, i: int, *_batch) -> None:
        if i == self.stop_at:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the control is asked
        if i == self.save_at:
            self.now += 60.0

    def epoch(self, step, loader, epoch: int, **options):
        with self.control:
            return train_one_epoch(step, loader, epoch, CPU, control=self.control, on_batch=self, **options)


def plain_step(accumulate: int = 4):
    model, optimizer, ema, compute_loss, _warmup, scaler, _ = fresh_run(10, False)
    return TrainStep(model, optimizer, scaler, ema, compute_loss, accumulate, None)


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("asked_at", "stopped_after"), [(1, 4), (3, 4), (5, 8), (8, 10)])
def test_a_stop_waits_for_the_optimizer_step_that_ends_the_accumulation_window(asked_at, stopped_after):
    step = plain_step(accumulate=4)  # optimizer steps after batches 3 and 7 (0-based)
    stats = RequestAt(stop_at=asked_at).epoch(step, batches(10), 0)
    assert stats.stopped and stats.batch == stopped_after  # 10: no window closes before the epoch's end
    assert step.optimizer_steps == stopped_after // 4 and stats.images == 2 * stopped_after
    if stopped_after < 10:  # nothing half-accumulated is left behind
        assert all(p.grad is None for p in step.model.parameters())


@pytest.mark.timeout(200)
def test_a_periodic_save_comes_after_the_next_optimizer_step_and_training_goes_on():
    step, seen = plain_step(accumulate=4), []
    stats = RequestAt(save_at=5).epoch(
        step, batches(10), 0, on_save=lambda s: seen.append((s.batch, step.last_opt_step))
    )
    assert seen == [(8, 7)] and not stats.stopped and stats.batch == 10 and step.optimizer_steps == 2


@pytest.mark.timeout(300)
def test_an_epoch_stopped_and_continued_from_its_checkpoint_equals_the_whole_epoch_bit_for_bit():
    torch.set_num_threads(1)
    nb, loader = 6, batches(6)
    whole = fresh_run(nb, True)
    model, optimizer, ema, compute_loss, warmup, scaler, scale = whole
    step = TrainStep(model, optimizer, scaler, ema, compute_loss, 2, warmup, multi_scale=scale)
    reference = [train_one_epoch(step, loader, epoch, CPU, nb=nb).loss for epoch in range(2)]

    parts = fresh_run(nb, True)
    model, optimizer, ema, compute_loss, warmup, scaler, scale = parts
    step = TrainStep(model, optimizer, scaler, ema, compute_loss, 2, warmup, multi_scale=scale)
    train_one_epoch(step, loader, 0, CPU, nb=nb)
    stopped = RequestAt(stop_at=2).epoch(step, loader, 1, nb=nb)
    assert stopped.stopped and 0 < stopped.batch < nb and step.last_opt_step == nb + stopped.batch - 1
    ckpt = build_checkpoint(ema.ema, train_model=model, optimizer=optimizer, ema_updates=ema.updates, epoch=0)
    position = dict(epoch=1, batch=stopped.batch, last_opt_step=step.last_opt_step, loss=[stopped.loss.tolist()])

    model, optimizer, ema, compute_loss, warmup, scaler, scale = fresh_run(nb, True)  # a new process
    state = restore_training({**ckpt, "train_state": position}, model, optimizer, ema, scaler)
    step = TrainStep(model, optimizer, scaler, ema, compute_loss, 2, warmup, multi_scale=scale,
                     last_opt_step=state.last_opt_step)  # fmt: skip
    rest = train_one_epoch(step, loader[state.batch :], 1, CPU, nb=nb, start=state.batch, loss=state.rank_loss(0, 1))
    assert torch.equal(rest.loss, reference[1]) and rest.batch == nb and not rest.stopped
    assert rest.images == (nb - state.batch) * 2  # the speed counts the images trained now, not the epoch's
    for (name, a), b in zip(whole[0].state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    for (name, a), b in zip(whole[2].ema.state_dict().items(), ema.ema.state_dict().values()):
        assert torch.equal(a, b), f"ema {name}"
    assert whole[1].state_dict()["param_groups"] == optimizer.state_dict()["param_groups"]
    for a, b in zip(whole[1].state_dict()["state"].values(), optimizer.state_dict()["state"].values()):
        assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])


def test_the_progress_line_says_its_losses_are_rank_0s_under_ddp():
    from ddp_utils.engine.loop import _describe

    alone = _describe(0, 3, torch.tensor([0.1, 0.2, 0.3]), CPU, None, None)
    assert alone == "1/3 mem - box 0.1000 obj 0.2000 cls 0.3000"
    shared = _describe(0, 3, torch.tensor([0.1, 0.2, 0.3]), CPU, None, None, world_size=2)
    assert shared == "1/3 mem - rank 0 box 0.1000 obj 0.2000 cls 0.3000"  # the epoch line's are all ranks'
