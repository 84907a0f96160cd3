"""The training step as train.py builds it on a GPU, counted for host waits (tests/hostwait.py), alone or under DDP.

Run in worker processes by tests/engine/test_hostwait_step.py (see tests/multiproc.py); the
single-process test calls :func:`count_epoch` directly.

train.py's form on a GPU, on the CPU: fp16 autocast with an enabled GradScaler (the CPU has fp16
autocast in the torch this project needs; where it has not, bf16 without a scaler, as train.py's
``--amp bf16``: :data:`AMP` says which), a fused optimizer (what ``smart_optimizer`` picks for CUDA
parameters), the dense loss (what ``ComputeLoss(dense=None)`` picks on CUDA) normalised across ranks
(``across_ranks=True``), channels_last model and input, EMA, clipping, warm-up, DDP from
``wrap_model``, batches through a ``DevicePrefetcher``, a ``StepControl`` asked after every step
and the progress display on.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import ddp_utils as du
from ddp_utils.data import DevicePrefetcher, class_frequency, load_hyp
from ddp_utils.engine import (
    ModelEMA,
    TrainStep,
    Warmup,
    lr_lambda,
    smart_optimizer,
    to_channels_last,
    train_one_epoch,
    wrap_model,
)
from ddp_utils.engine import loop as loop_module
from ddp_utils.engine.optim import accumulate_steps, scaled_weight_decay
from ddp_utils.run import StepControl
from ddp_utils.yolo import ComputeLoss, Model, load_model_yaml, scale_loss_gains

from ..hostwait import HostWaitCounter

CPU = torch.device("cpu")
BATCH, SIZE, NC = 2, 64, 3  # images per rank and step, their size, classes
WARMUP_ITERS, ACCUMULATE = 2, 2  # short enough that most of the epoch runs after it


def _fp16_autocast_on_cpu() -> bool:
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            return nn.Linear(2, 2)(torch.ones(1, 2)).dtype == torch.float16
    except RuntimeError:
        return False


AMP = "fp16" if _fp16_autocast_on_cpu() else "bf16"  # train.py's CUDA default, or its --amp bf16


def gpu_form_batches(n: int, batch: int = BATCH, size: int = SIZE, seed: int = 0) -> list[tuple]:
    """uint8 image batches with a few YOLO targets per image, as the loader gives them."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        imgs = torch.randint(0, 256, (batch, 3, size, size), generator=g, dtype=torch.uint8)
        rows = [
            [i, int(torch.randint(0, NC, (1,), generator=g)), 0.3 + 0.1 * k, 0.5, 0.3, 0.4]
            for i in range(batch)
            for k in range(3)
        ]
        out.append((imgs, torch.tensor(rows), [f"im{i}.jpg" for i in range(batch)], None))
    return out


def gpu_form_step(
    nb: int, distributed: bool, world_size: int = 1, device: torch.device = CPU, amp: str = AMP
) -> TrainStep:
    """TrainStep as train.py's ``build_training`` makes it on a GPU (see the module's notes), for ``nb`` batches.

    The hyperparameters are hyp.shapes.yaml's with a warm-up of :data:`WARMUP_ITERS` iterations and
    a nominal batch of :data:`ACCUMULATE` global batches, so that the epoch runs past the warm-up
    and accumulates (DDP's ``no_sync``) between optimizer steps. With ``amp="bf16"`` no GradScaler is enabled:
    the fused optimizer then takes the non-finite guard's decision as its ``found_inf`` tensor.
    """
    torch.manual_seed(0)
    cfg, _ = load_model_yaml("yolov5n.yaml")
    model = Model({**cfg, "width_multiple": 0.125}, ch=3, nc=NC).to(device)  # yolov5n's layers, thinner
    to_channels_last(model)  # train.py on CUDA: before the optimizer and DDP
    model.initialize_biases(class_frequency([np.array([[0, 0.5, 0.5, 0.1, 0.1]])], NC))
    global_batch = BATCH * world_size
    hyp = {**load_hyp("hyp.shapes.yaml"), "nbs": ACCUMULATE * global_batch}
    hyp.update(warmup_epochs=WARMUP_ITERS / nb, warmup_min_iters=WARMUP_ITERS)
    # optimizer_from_hyp's composition, fused as smart_optimizer makes it for CUDA parameters
    accumulate = accumulate_steps(global_batch, hyp["nbs"])
    decay = scaled_weight_decay(hyp["weight_decay"], global_batch, accumulate, hyp["nbs"])
    optimizer = smart_optimizer(model, "SGD", hyp["lr0"], hyp["momentum"], decay, fused=True)
    lf = lr_lambda(hyp["lrf"], 3)
    warmup = Warmup(optimizer, lf, nb, hyp["warmup_epochs"], hyp["warmup_bias_lr"], hyp["warmup_momentum"],
                    hyp["momentum"], hyp["warmup_min_iters"])  # fmt: skip
    assert (warmup.iters, accumulate) == (WARMUP_ITERS, ACCUMULATE)
    ema = ModelEMA(model)  # after the biases and the layout, as train.py's
    scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
    gains = scale_loss_gains(hyp, model.model[-1].nl, NC, SIZE)
    compute_loss = ComputeLoss(model, gains, dense=True, across_ranks=True)
    model = wrap_model(model, device, distributed=distributed)
    settings = dict(amp=amp, world_size=world_size, channels_last=True)
    return TrainStep(model, optimizer, scaler, ema, compute_loss, accumulate, warmup, **settings)


def count_epoch(steps: int, distributed: bool = False, world_size: int = 1, amp: str = AMP) -> dict:
    """Train one epoch of ``steps`` batches under a :class:`HostWaitCounter`: the waits per step, and what ran.

    Returns a record: the waits of each step other than the progress display's (by source line;
    a step's waits are those between its end and the previous one's), the display's reads (waits
    with loop._describe on the stack), the waits after the last step, and the batches at which
    an optimizer step, a DDP gradient all-reduce or a ``no_sync`` backward happened.
    """
    step = gpu_form_step(steps, distributed, world_size, amp=amp)
    marks: list[int] = []  # len(counter.waits) after each batch; len(marks) is the batch being trained
    stepped, reduced, no_sync = [], [], []
    if distributed:
        ddp = step.model
        original_no_sync = ddp.no_sync

        def counting_no_sync():
            no_sync.append(len(marks))
            return original_no_sync()

        def counting_allreduce(state, bucket):
            if not reduced or reduced[-1] != len(marks):
                reduced.append(len(marks))
            return default_hooks.allreduce_hook(state, bucket)

        ddp.no_sync = counting_no_sync
        ddp.register_comm_hook(None, counting_allreduce)

    def after_batch(i: int, *_batch) -> None:
        if step.optimizer_steps > len(stepped):
            stepped.append(i)
        marks.append(len(counter.waits))

    counter = HostWaitCounter()
    seed = du.dist_info().rank if distributed else 0
    batches = DevicePrefetcher(gpu_form_batches(steps, seed=seed), CPU, channels_last=True)
    # rank 0's clock is asked each step whether a periodic save is due, as train.py's is (never, within the epoch)
    control = StepControl(save_interval=3600.0, keeps_clock=seed == 0)
    with control, counter:
        stats = train_one_epoch(
            step,
            batches,
            0,
            CPU,
            epochs=1,
            control=control,
            on_batch=after_batch,
            progress=True,
            progress_seconds=1e9,  # longer than the epoch: the display reads the loss at its last batch and end only
        )
    display = (loop_module._describe,)
    waits = [w for w in counter.waits if not any(w.within(f) for f in display)]
    per_step = [Counter(str(w) for w in counter.waits[a:b] if w in waits) for a, b in zip([0, *marks], marks)]
    return {
        "amp": amp,
        "batches": stats.batch,
        "optimizer_steps": step.optimizer_steps,
        "stepped": stepped,
        "reduced": reduced,
        "no_sync": no_sync,
        "per_step": [dict(c) for c in per_step],
        "display_reads": [str(w) for w in counter.within(loop_module._describe)],
        "after_last_step": [str(w) for w in counter.waits[marks[-1] :]],
        "finite": bool(torch.isfinite(stats.loss).all()),
        "stopped": stats.stopped,
    }


def ddp_epoch(steps: str = "10") -> None:
    """Two gloo ranks: :func:`count_epoch` under DDP (no_sync between optimizer steps); print the record."""
    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo", timeout=60)
    record = count_epoch(int(steps), distributed=True, world_size=info.world_size)
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
