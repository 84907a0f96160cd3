"""The training step in its GPU form, counted for host waits (tests/hostwait.py), in one process or under DDP.

Run in worker processes by tests/engine/test_hostwait_step.py (see tests/multiproc.py); the
single-process test calls :func:`count_epoch` directly.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from unittest import mock

import numpy as np
import torch
from torch import nn

import ddp_utils as du
from ddp_utils import progress as progress_module
from ddp_utils.data import class_frequency, load_hyp
from ddp_utils.engine import (
    ModelEMA,
    PreemptionHandler,
    TrainStep,
    Warmup,
    lr_lambda,
    smart_optimizer,
    to_channels_last,
    train_one_epoch,
    use_channels_last,
    wrap_model,
)
from ddp_utils.engine import loop as loop_module
from ddp_utils.yolo import ComputeLoss, Model, load_model_yaml, scale_loss_gains

from ..hostwait import HostWaitCounter

CPU = torch.device("cpu")
WARMUP_ITERS = 2  # iterations 0..2 ramp accumulation from 1 to 2; the epoch goes on well past them


def gpu_form_batches(n: int, batch: int = 2, size: int = 64, seed: int = 0, pin: bool = False) -> list[tuple]:
    """uint8 image batches with a few YOLO targets per image, as the loader gives them (pinned on request)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        imgs = torch.randint(0, 256, (batch, 3, size, size), generator=g, dtype=torch.uint8)
        rows = [
            [i, int(torch.randint(0, 3, (1,), generator=g)), 0.3 + 0.1 * k, 0.5, 0.3, 0.4]
            for i in range(batch)
            for k in range(3)
        ]
        targets = torch.tensor(rows)
        if pin:
            imgs, targets = imgs.pin_memory(), targets.pin_memory()
        out.append((imgs, targets, [f"im{i}.jpg" for i in range(batch)], None))
    return out


def expected_steps(steps: int) -> tuple[int, int]:
    """(optimizer steps, no_sync backward passes) of an epoch of ``steps`` batches from iteration 0 with
    accumulate 2, ramping over :data:`WARMUP_ITERS` = 2 iterations: worked out by hand, not by the code under test.

    The warm-up's accumulation is 1 at iteration 0 (a step), ``round(1.5) = 2`` at 1 and 2 at 2, then 2:
    so iterations 0, 2, 4... step, and 1, 3, 5... skip DDP's all-reduce.
    """
    optimizer_steps = (steps + 1) // 2
    return optimizer_steps, steps - optimizer_steps


def gpu_form_step(nb: int, accumulate: int, distributed: bool, world_size: int = 1, device: torch.device = CPU):
    """TrainStep as train.py builds it on a GPU (see ``build_training``): the loss normalised over the
    global batch (``across_ranks=True``) and dense (train.py's default on CUDA), mixed precision with an
    enabled GradScaler and a fused optimizer, EMA, clipping, a warm-up that ends early in the epoch,
    and (``distributed``) the DDP wrapper of ``wrap_model``.

    Mixed precision: fp16 autocast on CUDA, as train.py's default; on the CPU, where ``--amp fp16`` is
    refused (``resolve_amp``), bf16 autocast, with the GradScaler still enabled so its fp16 path
    (scale, unscale, inf check handed to the fused optimizer) is the one counted.
    """
    torch.manual_seed(0)
    cfg, _ = load_model_yaml("yolov5n.yaml")
    model = Model({**cfg, "width_multiple": 0.125}, ch=3, nc=3).to(device)  # yolov5n's layers, thinner: fast
    channels_last = use_channels_last(device)  # CUDA: as train.py, before the optimizer and the wrapper
    if channels_last:
        to_channels_last(model)
    hyp = load_hyp("hyp.shapes.yaml")
    optimizer = smart_optimizer(model, "SGD", hyp["lr0"], hyp["momentum"], hyp["weight_decay"], fused=True)
    lf = lr_lambda(hyp["lrf"], 3)
    model.initialize_biases(class_frequency([np.array([[0, 0.5, 0.5, 0.1, 0.1]])], 3))
    ema = ModelEMA(model)  # after the biases: the EMA starts from them, as train.py's
    gains = scale_loss_gains(hyp, model.model[-1].nl, 3, 64)
    compute_loss = ComputeLoss(model, gains, dense=True, across_ranks=True)
    warmup_epochs = WARMUP_ITERS / nb
    warmup = Warmup(optimizer, lf, nb, warmup_epochs, hyp["warmup_bias_lr"], hyp["warmup_momentum"], hyp["momentum"], 0)
    assert warmup.iters == WARMUP_ITERS
    amp = "fp16" if device.type == "cuda" else "bf16"
    scaler = torch.amp.GradScaler(device.type, enabled=True)
    if channels_last:
        to_channels_last(ema.ema)
    model = wrap_model(model, device, distributed=distributed)
    return TrainStep(
        model, optimizer, scaler, ema, compute_loss, accumulate, warmup, amp, world_size, channels_last=channels_last
    )


def _counting_no_sync(model: nn.Module) -> list[int]:
    """Count the model's ``no_sync()`` entries (DDP's skipped all-reduces); the list holds the count."""
    entered = [0]
    no_sync = model.no_sync

    def counted():
        entered[0] += 1
        return no_sync()

    model.no_sync = counted  # an instance attribute: TrainStep's getattr finds it first
    return entered


def count_epoch(steps: int, accumulate: int, distributed: bool = False, world_size: int = 1) -> dict:
    """Train one epoch of ``steps`` batches under a :class:`HostWaitCounter`; the waits per step, by line.

    The progress display's reads (waits with ``loop._describe`` on the stack) are counted apart.
    With a refresh interval longer than the epoch they happen at the last batch and at the epoch's
    end only, whichever display ``progress_mode`` picks (bar or plain lines). Rank 0 asks every step
    whether a periodic save is due (never), as train.py's clock does, so the poll carries both flags.
    """
    step = gpu_form_step(steps, accumulate, distributed, world_size)
    assert isinstance(step.ema, ModelEMA)
    no_syncs = _counting_no_sync(step.model) if distributed else [0]
    rank = du.dist_info().rank if distributed else 0
    batches = gpu_form_batches(steps, seed=rank)
    marks: list[int] = []
    counter = HostWaitCounter()
    with _long_progress_intervals(), PreemptionHandler() as preemption, counter:
        stats = train_one_epoch(
            step,
            batches,
            0,
            CPU,
            epochs=1,
            preemption=preemption,
            save_due=(lambda: False) if rank == 0 else None,
            progress=True,
            on_batch=lambda i, *_: marks.append(len(counter.waits)),
        )
    bar = [w.within(loop_module._describe) for w in counter.waits]
    per_step = [
        Counter(str(w) for w, read in zip(counter.waits[a:b], bar[a:b]) if not read) for a, b in zip([0, *marks], marks)
    ]
    return {
        "optimizer_steps": step.optimizer_steps,
        "no_sync_steps": no_syncs[0],
        # waits other than the display's up to each step's end (on_batch), from the previous one's
        "per_step": [dict(c) for c in per_step],
        # after the last step's on_batch: the display's last refresh, the last poll and the epoch's end
        "after_last_step": [str(w) for w, read in zip(counter.waits[marks[-1] :], bar[marks[-1] :]) if not read],
        "bar_reads": sum(bar),
        "bar_reads_after_last_step": sum(bar[marks[-1] :]),
        "finite": bool(torch.isfinite(stats.loss).all()),
        "stopped": stats.stopped,
        "amp": step.amp,
    }


@contextlib.contextmanager
def _long_progress_intervals():
    """Bar and plain-line refresh intervals longer than any epoch here, put back afterwards.

    (train_one_epoch takes no interval yet; once it does, the scenario passes one instead.)
    """
    with (
        mock.patch.object(progress_module, "BAR_SECONDS", 1e9),
        mock.patch.dict(os.environ, {progress_module.PLAIN_SECONDS_ENV: "1e9"}),
    ):
        yield


def ddp_epoch(steps: str = "9", accumulate: str = "2") -> None:
    """Two gloo ranks: :func:`count_epoch` under DDP (no_sync between optimizer steps); print the record."""
    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo", timeout=60)
    record = count_epoch(int(steps), int(accumulate), distributed=True, world_size=info.world_size)
    print(json.dumps({"rank": info.rank, **record}))
    du.cleanup()


def cuda_epoch_under_sync_debug(steps: int = 6, accumulate: int = 2) -> dict:
    """A whole train_one_epoch on CUDA in train.py's form, its steady state under
    ``torch.cuda.set_sync_debug_mode("error")``: any op that synchronizes with the host raises.

    The mode is switched on after the first batch (which makes the loss's constants, a host-to-device
    copy that waits once) and off after the last one (the epoch's end synchronizes once, to read the
    timing events), so every other step and every poll in between runs under it.
    """
    device = torch.device("cuda", torch.cuda.current_device())
    step = gpu_form_step(steps, accumulate, distributed=False, device=device)
    modes: list[int] = []

    def watch(i: int, *_: object) -> None:
        modes.append(torch.cuda.get_sync_debug_mode())
        torch.cuda.set_sync_debug_mode("error" if i + 1 < steps else "default")

    try:
        with PreemptionHandler() as preemption:
            stats = train_one_epoch(
                step,
                gpu_form_batches(steps, pin=True),
                0,
                device,
                epochs=1,
                preemption=preemption,
                save_due=lambda: False,
                progress=False,
                on_batch=watch,
            )
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return {
        "batches": stats.batch,
        "optimizer_steps": step.optimizer_steps,
        "modes": modes,  # the mode in force during each step: 0 (default) for the first, 2 (error) after
        "finite": bool(torch.isfinite(stats.loss).all()),
    }


def _small() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))


def wrapped_equivalence(steps: str = "6") -> None:
    """Rank 0's model, BatchNorm buffers and EMA after TrainStep steps: torch's default DDP options,
    ``wrap_model``'s (no buffer broadcast, gradients as bucket views), and ``wrap_model(compile=True)``."""
    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo", timeout=60)

    def compute_loss(pred, targets):
        loss = (pred - targets).square().sum()
        return loss, loss.detach().repeat(3)

    g = torch.Generator().manual_seed(11 + info.rank)  # each rank its own data: BatchNorm statistics differ
    batches = [
        (torch.randn(4, 3, 8, 8, generator=g) * (1 + info.rank), torch.randn(4, 2, generator=g))
        for _ in range(int(steps))
    ]

    def train(make_model):
        torch.manual_seed(0)
        bare = _small()
        ema = ModelEMA(bare, tau=2)
        optimizer = smart_optimizer(bare, "SGD", lr=0.05, momentum=0.9)
        model = make_model(bare)
        step = TrainStep(model, optimizer, torch.amp.GradScaler("cpu", enabled=False), ema, compute_loss, 2)
        optimizer.zero_grad()
        for i, (x, y) in enumerate(batches):
            step(x, y, i, 0)
        return model, bare.state_dict(), ema.ema.state_dict()

    default, default_state, default_ema = train(lambda m: nn.parallel.DistributedDataParallel(m))
    wrapped, state, ema = train(lambda m: wrap_model(m, CPU, distributed=True))
    compiled, compiled_state, _ = train(
        lambda m: wrap_model(m, CPU, distributed=True, compile=True, compile_backend="aot_eager")
    )
    record = {
        "rank": info.rank,
        "default_broadcasts": default.broadcast_buffers,
        "options": [wrapped.broadcast_buffers, wrapped.gradient_as_bucket_view],
        "same_state": all(torch.equal(v, default_state[k]) for k, v in state.items()),
        "same_ema": all(torch.equal(v, default_ema[k]) for k, v in ema.items()),
        "compiled_wraps_ddp": type(compiled._orig_mod).__name__,
        "compiled_close": all(
            torch.allclose(v.float(), state[k].float(), rtol=1e-4, atol=1e-6) for k, v in compiled_state.items()
        ),
    }
    print(json.dumps(record))
    du.cleanup()
