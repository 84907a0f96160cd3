"""The training step in its GPU form never makes the host wait, counted on the CPU (tests/hostwait.py).

GPU form: dense loss, an enabled GradScaler with a fused optimizer, EMA, clipping, warm-up, the
progress bar on and a PreemptionHandler polled every step; in one process, and in two gloo
processes under DDP with no_sync accumulation. Allowed: the bar's read of the running loss
(at its first and last refresh here; at most once per refresh interval in general) and the
epoch's end. Every other wait fails the test naming its source line.
"""

from __future__ import annotations

import pytest

from ..multiproc import describe, launch, records
from ..workers.step_scenarios import BAR_LINE, count_epoch


def steady_state_waits(record: dict) -> list[dict]:
    """Per step after the first (which makes the loss's constants), the waits other than the bar's."""
    return [{line: n for line, n in step.items() if BAR_LINE not in line} for step in record["per_step"][1:]]


def check(record: dict, steps: int, accumulate: int) -> None:
    assert record["finite"] and not record["stopped"]
    assert record["optimizer_steps"] >= steps // accumulate
    assert steady_state_waits(record) == [{}] * (steps - 1), record["per_step"]
    # the bar reads the loss at its last refresh (the interval is longer than the epoch) and at the epoch's end
    assert record["bar_reads"] == 2, record
    assert all(BAR_LINE in line for line in record["after_last_step"]), record["after_last_step"]


@pytest.mark.timeout(300)
def test_gpu_form_epoch_in_one_process_never_waits_in_steady_state():
    check(count_epoch(steps=6, accumulate=2), 6, 2)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_gpu_form_epoch_under_ddp_with_no_sync_never_waits_in_steady_state():
    workers = launch("tests.workers.step_scenarios:ddp_epoch", 2, timeout=270, args=("6", "2"))
    assert all(w.returncode == 0 for w in workers), describe(workers)
    for record in records(workers):
        check(record, 6, 2)


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
