"""The training step in train.py's GPU form never makes the host wait, counted on the CPU (tests/hostwait.py).

train.py's form: the loss normalised over the global batch (``across_ranks=True``) and dense, mixed
precision with an enabled GradScaler and a fused optimizer (bf16 autocast on the CPU, which refuses
fp16; fp16 on CUDA), EMA, clipping, a warm-up that ends early in the epoch, the progress display on,
and a PreemptionHandler polled every step with rank 0 asking whether a periodic save is due; in one
process, and in two gloo processes under DDP, past the warm-up, so that every other backward pass
skips the all-reduce (``no_sync``). Allowed: the display's reads of the running loss (matched by
frame: ``loop._describe`` on the stack; at its last refresh and at the epoch's end here, at most once
per refresh interval in general). Every other wait fails the test naming its source line.

What the counter cannot see on the CPU (tests/test_hostwait.py) is covered on a GPU host by
:func:`test_whole_epoch_on_cuda_under_sync_debug_error_mode`.
"""

from __future__ import annotations

import pytest
import torch

from ..multiproc import describe, launch, records
from ..workers.step_scenarios import count_epoch, cuda_epoch_under_sync_debug, expected_steps


def check(record: dict, steps: int, distributed: bool) -> None:
    assert record["finite"] and not record["stopped"]
    optimizer_steps, skipped = expected_steps(steps)
    assert record["optimizer_steps"] == optimizer_steps, record
    assert record["no_sync_steps"] == (skipped if distributed else 0), record
    # after the first step (which makes the loss's constants): no wait at all but the display's
    assert record["per_step"][1:] == [{}] * (steps - 1), record["per_step"]
    # the display reads the loss at its last refresh (the interval is longer than the epoch) and at the end
    assert record["bar_reads"] == record["bar_reads_after_last_step"] == 2, record
    assert record["after_last_step"] == [], record


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gpu_form_epoch_in_one_process_never_waits_in_steady_state():
    record = count_epoch(steps=9, accumulate=2)
    assert record["amp"] == "bf16"
    check(record, 9, distributed=False)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_gpu_form_epoch_under_ddp_with_no_sync_never_waits_in_steady_state():
    workers = launch("tests.workers.step_scenarios:ddp_epoch", 2, timeout=270, args=("9", "2"))
    assert all(w.returncode == 0 for w in workers), describe(workers)
    for record in records(workers):
        check(record, 9, distributed=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.timeout(300)
def test_whole_epoch_on_cuda_under_sync_debug_error_mode():
    torch.cuda.set_sync_debug_mode("error")
    try:  # the mode is what it claims: a host read raises under it
        with pytest.raises(RuntimeError, match="synchroniz"):
            torch.ones(1, device="cuda").item()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    record = cuda_epoch_under_sync_debug(steps=6, accumulate=2)
    assert record["batches"] == 6 and record["finite"], record
    assert record["optimizer_steps"] == expected_steps(6)[0], record
    assert record["modes"] == [0, 2, 2, 2, 2, 2], record  # every step after the first ran in error mode


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
