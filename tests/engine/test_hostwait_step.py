"""The training step in train.py's GPU form never makes the host wait, counted on the CPU (tests/hostwait.py).

The form (tests/workers/step_scenarios.py): fp16 autocast with a GradScaler (the CPU has fp16 autocast
in torch 2.4+; bf16 without a scaler where it has not) and a fused optimizer,
the dense loss normalised across ranks, channels_last, EMA, clipping, a short warm-up, the
progress display on and a StepControl asked after every step (with the non-finite guard's counts); in one
process, and in two gloo processes under DDP with no_sync accumulation. Allowed: the display's reads of the running loss
(loop._describe, matched by frame: at its last refresh and the epoch's end here; at most once per
refresh interval in general); rank 0 asks each step whether a periodic save is due, as train.py's clock does.
Every other wait fails the test naming its source line. On a GPU
host, a whole epoch also runs under ``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import pytest
import torch

from ddp_utils.data import DevicePrefetcher
from ddp_utils.engine import train_one_epoch
from ddp_utils.run import StepControl

from ..hostwait import cuda_sync_errors
from ..multiproc import describe, launch, records
from ..workers.step_scenarios import AMP, count_epoch, gpu_form_batches, gpu_form_step

STEPS = 10
# warm-up over batches 0..2 (accumulation rising from 1 to 2), then 2 batches per optimizer step
OPTIMIZER_STEPS = [0, 2, 4, 6, 8]
ACCUMULATING = [1, 3, 5, 7, 9]


def check(record: dict) -> None:
    assert record["finite"] and not record["stopped"] and record["batches"] == STEPS
    assert record["stepped"] == OPTIMIZER_STEPS and record["optimizer_steps"] == len(OPTIMIZER_STEPS), record
    assert record["per_step"] == [{}] * STEPS, record["per_step"]
    # the display reads the loss at its last refresh (the interval is longer than the epoch) and at the epoch's end
    assert len(record["display_reads"]) == 2, record
    assert record["after_last_step"] == record["display_reads"], record


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("amp", ["fp16", "bf16"])
def test_gpu_form_epoch_in_one_process_never_waits(amp):
    """fp16: the GradScaler skips a non-finite step; bf16: no scaler, the fused optimizer takes the non-finite
    guard's decision as its found_inf tensor. Neither reads anything back."""
    if amp == "fp16" and AMP != "fp16":
        pytest.skip("this torch has no fp16 autocast on the CPU")
    check(count_epoch(STEPS, amp=amp))


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_gpu_form_epoch_under_ddp_takes_no_sync_between_steps_and_never_waits():
    workers = launch("tests.workers.step_scenarios:ddp_epoch", 2, timeout=270, args=(str(STEPS),))
    assert all(w.returncode == 0 for w in workers), describe(workers)
    for record in records(workers):
        check(record)
        # DDP all-reduced the gradients on the optimizer steps' backward passes only
        assert record["no_sync"] == ACCUMULATING and record["reduced"] == OPTIMIZER_STEPS, record


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: on the CPU the counter above stands in")
@pytest.mark.timeout(300)
def test_cuda_epoch_runs_whole_under_sync_debug_mode_error():
    """A whole train_one_epoch in train.py's GPU form, where any implicit CPU-GPU sync raises (in backward(),
    every aten op is checked instead: torch's autograd engine makes a synchronising call of its own).

    One epoch first (the loss's constants are copied to the device at its first step, cuDNN picks
    its algorithms), then a whole epoch in "error" mode with the display off (its reads are the
    allowed ones). The epoch's end reads CUDA events after an explicit torch.cuda.synchronize(),
    which the mode does not flag (only implicit syncs: .item(), blocking copies, nonzero...).
    """
    device = torch.device("cuda", torch.cuda.current_device())
    step = gpu_form_step(STEPS, distributed=False, device=device)
    batches = DevicePrefetcher(gpu_form_batches(STEPS), device, channels_last=True)
    with StepControl() as control:
        train_one_epoch(step, batches, 0, device, control=control)
        torch.cuda.synchronize()
        with cuda_sync_errors() as backward_syncs:  # the backward's aten ops checked one by one (tests/hostwait.py)
            stats = train_one_epoch(step, batches, 1, device, control=control)
    assert backward_syncs.ops == {}
    assert stats.batch == STEPS and not stats.stopped
    assert bool(torch.isfinite(stats.loss).all())
    assert step.optimizer_steps >= 2 * len(OPTIMIZER_STEPS)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_wrap_model_keeps_rank0_numbers_and_compiles_the_ddp_module():
    workers = launch("tests.workers.step_scenarios:wrapped_equivalence", 2, timeout=370, args=("6",))
    assert all(w.returncode == 0 for w in workers), describe(workers)
    rank0, rank1 = records(workers)
    assert rank0["default_broadcasts"] and rank0["options"] == [False, True]
    # no buffer broadcast: rank 0 (whose model and EMA are saved) computes bit for bit the same
    assert rank0["same_state"] and rank0["same_ema"], rank0
    # compile wraps the DDP module (Dynamo sees DDP and splits at buckets) and trains the same numbers
    assert rank0["compiled_wraps_ddp"] == rank1["compiled_wraps_ddp"] == "DistributedDataParallel"
    assert rank0["compiled_close"] and rank1["compiled_close"]
