"""The training step in its GPU form, counted for host waits (tests/hostwait.py), in one process or under DDP.

Run in worker processes by tests/engine/test_hostwait_step.py (see tests/multiproc.py); the
single-process test calls :func:`count_epoch` directly.
"""

from __future__ import annotations

import json
import os
from collections import Counter

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
    train_one_epoch,
    wrap_model,
)
from ddp_utils.yolo import ComputeLoss, Model, load_model_yaml, scale_loss_gains

from ..hostwait import HostWaitCounter

CPU = torch.device("cpu")
BAR_LINE = "_describe"  # the progress bar's read of the running loss (ddp_utils/engine/loop.py)


def gpu_form_batches(n: int, batch: int = 2, size: int = 64, seed: int = 0) -> list[tuple]:
    """uint8 image batches with a few YOLO targets per image, as the loader gives them."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        imgs = torch.randint(0, 256, (batch, 3, size, size), generator=g, dtype=torch.uint8)
        rows = [
            [i, int(torch.randint(0, 3, (1,), generator=g)), 0.3 + 0.1 * k, 0.5, 0.3, 0.4]
            for i in range(batch)
            for k in range(3)
        ]
        out.append((imgs, torch.tensor(rows), [f"im{i}.jpg" for i in range(batch)], None))
    return out


def gpu_form_step(nb: int, accumulate: int, distributed: bool, world_size: int = 1) -> TrainStep:
    """TrainStep as train.py builds it on a GPU: dense loss, an enabled GradScaler with a fused
    optimizer, EMA, clipping, warm-up, and (``distributed``) the DDP wrapper of ``wrap_model``."""
    torch.manual_seed(0)
    cfg, _ = load_model_yaml("yolov5n.yaml")
    model = Model({**cfg, "width_multiple": 0.125}, ch=3, nc=3)  # yolov5n's layers, thinner: a fast CPU step
    hyp = load_hyp("hyp.shapes.yaml")
    optimizer = smart_optimizer(model, "SGD", hyp["lr0"], hyp["momentum"], hyp["weight_decay"], fused=True)
    lf = lr_lambda(hyp["lrf"], 3)
    model.initialize_biases(class_frequency([np.array([[0, 0.5, 0.5, 0.1, 0.1]])], 3))
    ema = ModelEMA(model)  # after the biases: the EMA starts from them, as train.py's
    compute_loss = ComputeLoss(model, scale_loss_gains(hyp, model.model[-1].nl, 3, 64), dense=True)
    warmup = Warmup(optimizer, lf, nb, 1.0, hyp["warmup_bias_lr"], hyp["warmup_momentum"], hyp["momentum"], 2 * nb)
    scaler = torch.amp.GradScaler("cpu", enabled=True)
    model = wrap_model(model, CPU, distributed=distributed)
    return TrainStep(model, optimizer, scaler, ema, compute_loss, accumulate, warmup, "off", world_size)


def count_epoch(steps: int, accumulate: int, distributed: bool = False, world_size: int = 1) -> dict:
    """Train one epoch of ``steps`` batches under a :class:`HostWaitCounter`; the waits per step, by line.

    With a refresh interval longer than the epoch the bar reads the loss at its last batch and
    at the epoch's end only, whichever display ``progress_mode`` picks (bar or plain lines).
    """
    step = gpu_form_step(steps, accumulate, distributed, world_size)
    assert isinstance(step.ema, ModelEMA)
    marks: list[int] = []
    counter = HostWaitCounter()
    progress_module.BAR_SECONDS = 1e9
    os.environ[progress_module.PLAIN_SECONDS_ENV] = "1e9"
    with PreemptionHandler() as preemption, counter:
        stats = train_one_epoch(
            step,
            gpu_form_batches(steps, seed=du.dist_info().rank if distributed else 0),
            0,
            CPU,
            epochs=1,
            preemption=preemption,
            progress=True,
            on_batch=lambda i, *_: marks.append(len(counter.waits)),
        )
    per_step = [Counter(str(w) for w in counter.waits[a:b]) for a, b in zip([0, *marks], marks)]
    after = Counter(str(w) for w in counter.waits[marks[-1] :])
    return {
        "optimizer_steps": step.optimizer_steps,
        "per_step": [dict(c) for c in per_step],  # waits between one step's end and the next one's
        "after_last_step": dict(after),  # the last bar read, the last poll and the epoch's end
        "bar_reads": sum(1 for w in counter.waits if BAR_LINE in w.where),
        "finite": bool(torch.isfinite(stats.loss).all()),
        "stopped": stats.stopped,
    }


def ddp_epoch(steps: str = "6", accumulate: str = "2") -> None:
    """Two gloo ranks: :func:`count_epoch` under DDP (no_sync between optimizer steps); print the record."""
    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo", timeout=60)
    record = count_epoch(int(steps), int(accumulate), distributed=True, world_size=info.world_size)
    print(json.dumps({"rank": info.rank, **record}))
    du.cleanup()


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
