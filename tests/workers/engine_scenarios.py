"""Functions that tests/engine runs in real worker processes (see tests/multiproc.py)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

import ddp_utils as du
from ddp_utils.engine import ModelEMA, smart_optimizer
from ddp_utils.run import (
    EarlyStopping,
    PreemptionHandler,
    TrainState,
    build_checkpoint,
    load_checkpoint,
    save_checkpoint,
)


def small_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))


def save_loop(target: str, megabytes: str = "16") -> None:
    """Save ever-new checkpoints to ``target`` until killed; each holds one tag everywhere."""
    torch.set_num_threads(1)
    numel = int(float(megabytes) * 2**20 / 4)
    tag = 0
    while True:
        tag += 1
        ckpt = {"model": {"w": torch.full((numel,), float(tag))}, "epoch": tag, "opt": {"tag": tag}}
        save_checkpoint(ckpt, target)
        print(tag, flush=True)


def sigterm_loop(steps: str = "50", signal_at: str = "5") -> None:
    """Send this process SIGTERM mid-loop; the loop must notice, stop and exit 0."""
    stopped_at = None
    with PreemptionHandler() as preempt:
        for step in range(int(steps)):
            if step == int(signal_at):
                os.kill(os.getpid(), signal.SIGTERM)
            if preempt.requested_anywhere():
                stopped_at = step
                break
    restored = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    print(json.dumps({"stopped_at": stopped_at, "received": preempt.received, "restored": restored}))
    sys.exit(0)


def ddp_engine(directory: str) -> None:
    """DDP-wrapped training steps with EMA; rank 0 saves; rank 1 gets SIGTERM; all stop together."""
    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo", timeout=60)
    torch.manual_seed(0)  # same initial weights on every rank, as DDP expects
    model = nn.parallel.DistributedDataParallel(small_model())
    ema = ModelEMA(model, tau=2)
    optimizer = smart_optimizer(model, "SGD", lr=0.01)
    g = torch.Generator().manual_seed(100 + info.rank)
    stopped_at = None
    with PreemptionHandler() as preempt:
        for step in range(20):
            x = torch.randn(4, 3, 8, 8, generator=g)
            loss = model(x).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ema.update(model)
            if info.rank == 1 and step == 3:
                os.kill(os.getpid(), signal.SIGTERM)
            if preempt.requested_anywhere():
                stopped_at = step
                break
    ckpt = build_checkpoint(ema.ema, optimizer=optimizer, ema_updates=ema.updates, epoch=stopped_at or 0)
    if info.is_main:  # the caller decides who writes, as train.py does
        save_checkpoint(ckpt, Path(directory) / "last.pt")
    du.barrier()
    loaded = load_checkpoint(Path(directory) / "last.pt")
    # parameters, not BatchNorm running stats: those see each rank's own batches after DDP's buffer broadcast
    ema_sum = float(sum(p.double().sum() for p in ema.ema.parameters()))
    ema.sync()
    synced_sum = float(sum(v.double().sum() for v in ema.ema.state_dict().values() if v.is_floating_point()))
    # rank 0 stops, rank 1 does not: the broadcast makes both follow rank 0
    stopper = EarlyStopping(patience=1)
    stopper(0, 1.0)
    stop = du.any_rank(stopper(5, 0.0) if info.rank == 0 else False)
    print(
        json.dumps(
            {
                "rank": info.rank,
                "stopped_at": stopped_at,
                "received": preempt.received,
                "ema_keys": sorted(ema.ema.state_dict())[:3],
                "loaded_keys": sorted(loaded["model"])[:3],
                "ema_updates": loaded["ema_updates"],
                "ema_sum": ema_sum,
                "synced_sum": synced_sum,
                "stop": stop,
            }
        )
    )
    du.cleanup()


def _counting_allreduce(state: dict, bucket):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    state["calls"] += 1
    return default_hooks.allreduce_hook(None, bucket)


def no_sync_matches_synced(steps: str = "8", accumulate: str = "4") -> None:
    """The same accumulated steps through TrainStep (no_sync between optimizer steps) and through an
    always-synced loop: print both models' weights and how many gradient all-reduces each ran."""
    from ddp_utils.engine import TrainStep

    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo", timeout=60)
    nominal = int(accumulate)

    def make():
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(small_model())
        counter = {"calls": 0}
        model.register_comm_hook(counter, _counting_allreduce)
        return model, smart_optimizer(model, "SGD", lr=0.05, momentum=0.9), counter

    def compute_loss(pred, targets):
        loss = (pred - targets).square().sum()
        return loss, loss.detach().repeat(3)

    g = torch.Generator().manual_seed(7 + info.rank)
    batches = [(torch.randn(4, 3, 8, 8, generator=g), torch.randn(4, 2, generator=g)) for _ in range(int(steps))]

    model, optimizer, skipping = make()
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    step = TrainStep(model, optimizer, scaler, ModelEMA(model), compute_loss, nominal, world_size=info.world_size)
    optimizer.zero_grad()
    for i, (x, y) in enumerate(batches):
        step(x, y, i, 0)

    ref, ref_optimizer, synced = make()
    ref_optimizer.zero_grad()
    last_opt_step = -1
    for i, (x, y) in enumerate(batches):
        loss, _ = compute_loss(ref(x), y)
        (loss * info.world_size).backward()  # the gradient all-reduce runs after every backward
        if i - last_opt_step >= nominal:
            torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm=10.0)
            ref_optimizer.step()
            ref_optimizer.zero_grad()
            last_opt_step = i
    weights = [p.detach().flatten().tolist() for p in model.parameters()]
    reference = [p.detach().flatten().tolist() for p in ref.parameters()]
    record = {"rank": info.rank, "weights": weights, "reference": reference}
    record.update(optimizer_steps=step.optimizer_steps, skipping_calls=skipping["calls"], synced_calls=synced["calls"])
    print(json.dumps(record))
    du.cleanup()


def _peak_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def save_peak(directory: str, megabytes: str, how: str) -> None:
    """Print the peak resident memory one save adds (KiB) and its file's size (bytes), as JSON.

    ``how``: "checkpointer" (snapshot and write, inline), "background" (the same in the writer thread),
    or "write" (write_serialised of a snapshot made beforehand). Each saves ``megabytes`` of tensors
    (the checkpoint holds them three times: EMA, training weights, momentum) to last.pt, best.pt and epoch0.pt.
    """
    import gc

    from ddp_utils.run import Checkpointer
    from ddp_utils.run.checkpoint.disk import write_serialised

    torch.set_num_threads(1)
    numel = int(float(megabytes) * 2**20 / 4 / 3 / 8)  # eight tensors, each stored three times
    model = nn.ParameterList([nn.Parameter(torch.randn(numel)) for _ in range(8)])
    ema = ModelEMA(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sum(p.sum() for p in model).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    checkpoints = Checkpointer(directory, opt={"epochs": 1}, save_period=1, background=how == "background")
    snapshot = build_checkpoint(ema.ema, train_model=model, optimizer=optimizer) if how == "write" else None
    gc.collect()
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # the peak so far becomes the current size: what follows is the save's alone
    before = _peak_kib()
    if snapshot is not None:
        write_serialised(snapshot, checkpoints.targets(0, best=True))
    else:
        checkpoints.save(TrainState(epoch=1), SimpleNamespace(model=model, ema=ema, optimizer=optimizer), best=True)
        assert checkpoints.wait()
    added = _peak_kib() - before
    print(json.dumps({"added_kib": added, "file_bytes": checkpoints.last.stat().st_size}), flush=True)
