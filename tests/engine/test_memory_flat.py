"""Memory stays flat from epoch to epoch: no tensor a training epoch or a validation makes outlives the next one.

On a GPU the symptom would be the reserved memory climbing epoch after epoch (issue 40: +1 G an epoch); on the
CPU, in CI, the same leak shows as live tensors that accumulate. The count goes through the garbage collector
(every tensor Python can reach), its bytes through their storages (a view counts once), after three short
epochs of train_one_epoch and evaluate, as train.py runs them (--device cpu, no process group).
"""

from __future__ import annotations

import gc
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import is_fake

from ddp_utils.data import DevicePrefetcher
from ddp_utils.engine import TrainStep, train_one_epoch
from ddp_utils.yolo import evaluate

from .test_loop import CPU, batches, fresh_run


def live_tensor_bytes() -> tuple[int, int]:
    """(tensors, bytes of their distinct storages) that Python can reach now."""
    gc.collect()
    storages: dict[int, int] = {}
    count = 0
    with warnings.catch_warnings():  # isinstance on torch.distributed's deprecated reduce_op object warns
        warnings.simplefilter("ignore", FutureWarning)
        tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for tensor in tensors:
        # a compiled test earlier in the same worker leaves torch.compile's fake tensors in its caches: shapes
        # without memory, as the meta ones
        if tensor.device.type != "meta" and not is_fake(tensor):
            count += 1
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = max(storages.get(storage.data_ptr(), 0), storage.nbytes())
    return count, sum(storages.values())


def live_after_epochs(epochs: int = 3, keep=None) -> list[tuple[int, int]]:
    """Live (tensors, bytes) after each epoch of training and validating a tiny detector; ``keep(loss_items)``
    sees every step's loss items (the positive control keeps them)."""
    train = batches(2, size=64, batch=2, seed=1)
    imgs, targets, _, shapes = batches(1, size=64, batch=2, seed=2)[0]
    val = [(imgs, targets, ["val0.jpg", "val1.jpg"], shapes)]
    model, optimizer, ema, compute_loss, warmup, scaler, _ = fresh_run(len(train), multi_scale=False)
    step = TrainStep(model, optimizer, scaler, ema, compute_loss, accumulate=2, warmup=warmup)
    if keep is not None:
        inner = step.compute_loss

        def compute_and_keep(pred, targets):
            loss, items = inner(pred, targets)
            keep(items)
            return loss, items

        step.compute_loss = compute_and_keep
    live, results = [], None
    for epoch in range(epochs):
        stats = train_one_epoch(step, DevicePrefetcher(train, CPU), epoch, CPU, epochs=epochs)
        metrics, val_loss = evaluate(ema.ema, val, compute_loss, device=CPU, verbose=False)
        results = (stats.loss, metrics, val_loss)  # what train.py keeps to the next epoch: the last results
        del stats, metrics, val_loss
        live.append(live_tensor_bytes())
    assert results is not None
    return live


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_live_tensors_stay_flat_from_the_second_epoch_on():
    live = live_after_epochs()
    # the first epoch makes what lives for the run (the optimizer's momentum, the loss's constants); nothing after
    assert live[1] == live[2], live


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_count_catches_a_tensor_kept_every_step():
    kept: list[torch.Tensor] = []  # a deliberate leak: the loss items of every step, as a log list would keep them
    live = live_after_epochs(keep=kept.append)
    assert live[2][0] - live[1][0] == len(kept) // 3 > 0, live  # the last epoch's steps, one tensor each
    assert live[2][1] > live[1][1], live
