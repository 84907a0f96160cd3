"""Functions that tests/run/test_control.py runs in real worker processes (see tests/multiproc.py)."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time

import torch
from torch import nn

import ddp_utils as du
from ddp_utils.engine import ModelEMA, TrainStep, smart_optimizer, train_one_epoch
from ddp_utils.run import Checkpointer, StepControl, TrainState
from tests.workers.engine_scenarios import small_model


def _step(model: nn.Module, accumulate: int = 1, fused: bool = False) -> TrainStep:
    def compute_loss(pred, targets):
        loss = (pred - targets).square().sum()
        return loss, loss.detach().repeat(3)

    optimizer = smart_optimizer(model, "SGD", lr=0.01, momentum=0.9, fused=fused)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    ema = ModelEMA(model, tau=2)
    info = du.dist_info()
    if info.world_size > 1:
        model = nn.parallel.DistributedDataParallel(model)
    return TrainStep(model, optimizer, scaler, ema, compute_loss, accumulate, world_size=info.world_size)


class _Batches:
    """Batches of random data; each takes ``seconds`` to 'load' (the step's time in a real run)."""

    def __init__(self, n: int, seconds: float = 0.0, seed: int = 0, nan_at: set[int] = frozenset()) -> None:
        g = torch.Generator().manual_seed(seed)
        self.items = [(torch.randn(4, 3, 8, 8, generator=g), torch.randn(4, 2, generator=g)) for _ in range(n)]
        self.seconds, self.nan_at = seconds, nan_at

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        for i, (x, y) in enumerate(self.items):
            time.sleep(self.seconds)
            yield (x * float("nan") if i in self.nan_at else x), y, [f"{i}.jpg"] * 4, None


def real_clock_saves(steps: str = "40", step_seconds: str = "0.04", interval: str = "0.24") -> None:
    """A training epoch with the real clock and background saves of a real checkpoint: when each save happened."""
    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo", timeout=60)
    torch.manual_seed(0)
    step = _step(small_model())
    saves: list[tuple[int, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        checkpoints = Checkpointer(tmp, opt={"epochs": 1}, background=True)

        def on_save(stats) -> None:
            saves.append((stats.batch, time.monotonic()))
            if info.is_main:
                checkpoints.save(TrainState(epoch=0, batch=stats.batch, batches=int(steps)), step)

        with StepControl(save_interval=float(interval), keeps_clock=info.is_main) as control:
            start = time.monotonic()
            stats = train_one_epoch(step, _Batches(int(steps), float(step_seconds)), 0, torch.device("cpu"),
                                    control=control, on_save=on_save)  # fmt: skip
            seconds = time.monotonic() - start
        written = checkpoints.wait()
    print(json.dumps({"rank": info.rank, "saves": [b for b, _ in saves], "at": [t - start for _, t in saves],
                      "seconds": seconds, "batches": stats.batch, "written": written}))  # fmt: skip
    du.cleanup()


def signal_on_rank1(steps: str = "12", signal_at: str = "3") -> None:
    """Rank 1 gets SIGTERM after step ``signal_at``; every rank asks the control after each step: where it stopped."""
    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo", timeout=60)
    stopped_at = None
    with StepControl() as control:
        for step in range(int(steps)):
            if info.rank == 1 and step == int(signal_at):
                os.kill(os.getpid(), signal.SIGTERM)
            if control.after_step(None, boundary=True, last=False).value == "stop":
                stopped_at = step
                break
        anywhere = control.stop_anywhere()
    print(json.dumps({"rank": info.rank, "stopped_at": stopped_at, "anywhere": anywhere, "reason": control.reason}))
    du.cleanup()


def nonfinite_on_rank1(steps: str = "10", nan_at: str = "3", limit: str = "4", fused: str = "0") -> None:
    """DDP training where rank 1's inputs are NaN at the batches in ``nan_at`` (``"3"``, or ``"3-"``: from 3 on)."""
    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo", timeout=60)
    torch.manual_seed(0)
    model = small_model()
    step = _step(model, fused=fused == "1")
    first, _, rest = nan_at.partition("-")
    bad = set(range(int(first), int(steps))) if rest == "" and nan_at.endswith("-") else {int(first)}
    batches = _Batches(int(steps), seed=info.rank, nan_at=bad if info.rank == 1 else set())
    weights: list[list[float]] = []
    bn_means: list[list[float]] = []  # BatchNorm's running mean after each batch (the guard's restore shows here)

    def snapshot(i, *_batch) -> None:
        weights.append([float(p.detach().double().sum()) for p in model.parameters()])
        bn_means.append(model[1].running_mean.tolist())

    with StepControl(nonfinite_limit=int(limit)) as control:
        stats = train_one_epoch(step, batches, 0, torch.device("cpu"), control=control, on_batch=snapshot)
        stop = control.epoch_end(step)
    finite = all(
        bool(torch.isfinite(t).all())
        for t in [*model.state_dict().values(), *step.ema.ema.state_dict().values()]
        if t.is_floating_point()
    )
    print(json.dumps({
        "rank": info.rank, "batches": stats.batch, "stopped": stats.stopped, "stop": stop, "reason": control.reason,
        "skipped": control.skipped, "in_a_row": control.in_a_row, "weights": weights, "finite": finite,
        "bn_means": bn_means, "optimizer_steps": step.optimizer_steps, "fused": bool(step.optimizer.defaults["fused"]),
    }))  # fmt: skip
    du.cleanup()
