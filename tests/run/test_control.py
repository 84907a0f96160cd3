"""StepControl: one save per interval against the real clock, a stop on one rank seen by all at one step, and
non-finite steps skipped on every rank alike, counted, and stopping a run whose steps stay non-finite."""

from __future__ import annotations

import pytest
import torch

from ddp_utils.engine import Action, train_one_epoch
from ddp_utils.run import StepControl

from ..multiproc import describe, launch, records

SCENARIOS = "tests.workers.control_scenarios"


# (clock, boundary, last) per step, or "saved" where a save is made: a 10 s interval, windows of 3 steps
SCHEDULE = [
    (0.0, True, False),
    (10.0, False, False),  # due, inside a window: the request waits for the window's end
    (11.0, False, False),
    (12.0, True, False),  # the window's end: the save
    (15.0, True, False),  # not saved yet: no second request
    (16.0, True, False),
    "saved",  # at 16 s
    (24.0, True, False),
    (26.0, True, True),  # due, but the epoch's last step: its own save follows
    "saved",  # at 26 s: the end-of-epoch save restarts the clock and drops the request
    (27.0, True, False),
    (36.0, True, False),  # due again: one save for the next interval
    (37.0, True, False),
]


def actions_over(schedule: list) -> list[Action]:
    now = [0.0]
    with StepControl(save_interval=10.0, clock=lambda: now[0]) as control:
        actions = []
        for step in schedule:
            if step == "saved":
                control.saved()
                continue
            now[0], boundary, last = step
            actions.append(control.after_step(None, boundary=boundary, last=last))
    return actions


def saves_at(actions: list[Action], schedule: list) -> list[float]:
    return [step[0] for step, action in zip([s for s in schedule if s != "saved"], actions) if action is Action.SAVE]


def test_the_clock_asks_once_per_interval_and_again_only_after_the_save(monkeypatch):
    assert saves_at(actions_over(SCHEDULE), SCHEDULE) == [12.0, 36.0]  # one SAVE per interval, at a window's end

    def unlatched(self):  # positive control: a clock that asks at every due step, not once until the save
        return self.interval > 0 and self.clock() - self.last_saved >= self.interval

    monkeypatch.setattr(StepControl, "_clock_asks", unlatched)
    assert saves_at(actions_over(SCHEDULE), SCHEDULE) == [12.0, 15.0, 16.0, 36.0, 37.0]  # the check would fail


def test_a_clock_that_is_not_this_ranks_never_asks():
    now = [100.0]
    with StepControl(save_interval=1.0, keeps_clock=False, clock=lambda: now[0]) as control:
        now[0] = 1000.0
        assert {control.after_step(None, boundary=True, last=False) for _ in range(3)} == {Action.GO}


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("nprocs", [1, 2])
def test_one_save_per_interval_against_the_real_clock(nprocs):
    """The reviewer's case: a 0.24 s interval, steps of about 0.04 s, background saves of a real checkpoint.
    Before the latch every save came twice, one step apart (batches 6 and 7, 12 and 13)."""
    interval, step_seconds = 0.24, 0.04
    workers = launch(
        f"{SCENARIOS}:real_clock_saves", nprocs, timeout=100, args=("40", str(step_seconds), str(interval))
    )
    assert all(w.returncode == 0 for w in workers), describe(workers)
    found = records(workers)
    saves, at = found[0]["saves"], found[0]["at"]
    assert all(r["saves"] == saves for r in found), found  # every rank saved at the same batches
    assert found[0]["written"] and found[0]["batches"] == 40
    assert len(saves) >= 2, found[0]
    assert all(b - a >= 2 for a, b in zip(saves, saves[1:])), saves  # never two saves on consecutive steps
    assert all(b - a >= interval for a, b in zip(at, at[1:])), at  # one save per interval, by rank 0's clock
    # and not fewer: the clock asks as soon as the interval passed, the save comes a step or two later
    expected = found[0]["seconds"] / (interval + 3 * step_seconds) - 1
    assert len(saves) >= expected, (saves, found[0]["seconds"])


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_signal_on_one_rank_stops_every_rank_at_the_same_step():
    workers = launch(f"{SCENARIOS}:signal_on_rank1", 2, timeout=100, args=("12", "3"))
    assert all(w.returncode == 0 for w in workers), describe(workers)
    rank0, rank1 = records(workers)
    # rank 1's flag goes into the all-reduce started after step 3, whose answer is read after step 4
    assert rank0["stopped_at"] == rank1["stopped_at"] == 4
    assert rank0["anywhere"] is rank1["anywhere"] is True and rank0["reason"] == rank1["reason"] == "signal"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fused", ["0", "1"])
def test_a_non_finite_step_on_one_rank_is_skipped_by_every_rank(fused):
    """fused=1: the optimizer takes the decision as its found_inf tensor (no host read, as on a GPU)."""
    workers = launch(f"{SCENARIOS}:nonfinite_on_rank1", 2, timeout=100, args=("10", "3", "4", fused))
    assert all(w.returncode == 0 for w in workers), describe(workers)
    rank0, rank1 = records(workers)
    for record in (rank0, rank1):
        assert record["batches"] == 10 and not record["stopped"] and not record["stop"] and record["reason"] is None
        assert record["skipped"] == 1 and record["finite"] and record["optimizer_steps"] == 10
        assert record["fused"] is (fused == "1")  # the branch the case names is the one that ran
        assert record["weights"][3] == record["weights"][2] != record["weights"][4]  # step 3 left no trace
        # BatchNorm's statistics too, on both ranks (rank 0's forward was finite; the step's flag is shared); a
        # finite step changes them (the positive control: the equality is not there by construction)
        assert record["bn_means"][3] == record["bn_means"][2] != record["bn_means"][4], record["bn_means"][2:5]
    assert rank0["weights"] == rank1["weights"]  # both ranks skipped it: DDP's weights stay equal


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_steps_that_stay_non_finite_stop_every_rank_with_the_last_finite_state():
    workers = launch(f"{SCENARIOS}:nonfinite_on_rank1", 2, timeout=100, args=("12", "3-", "4"))
    assert all(w.returncode == 0 for w in workers), describe(workers)
    for record in records(workers):
        # steps 3-6 skipped: four in a row after step 6, learnt by every rank through the all-reduce after step 7
        assert record["stopped"] and record["batches"] == 8 and record["reason"] == "diverged", record
        assert record["in_a_row"] >= 4 and record["finite"]
        assert all(w == record["weights"][2] for w in record["weights"][3:]), "a non-finite step moved the weights"


def test_in_one_process_the_run_stops_once_the_limit_is_reached():
    from ddp_utils.engine import train_one_epoch
    from tests.workers.control_scenarios import _Batches, _step
    from tests.workers.engine_scenarios import small_model

    torch.manual_seed(0)
    model = small_model()
    step = _step(model)
    bn_before = None

    def remember(i, *_batch):
        nonlocal bn_before
        if i == 1:
            bn_before = model[1].running_mean.clone()

    with StepControl(nonfinite_limit=3) as control:
        stats = train_one_epoch(step, _Batches(10, nan_at=set(range(2, 10))), 0, torch.device("cpu"),
                                control=control, on_batch=remember)  # fmt: skip
    assert stats.stopped and stats.batch == 5 and control.reason == "diverged" and control.skipped == 3
    assert torch.equal(model[1].running_mean, bn_before)  # BatchNorm's statistics as before the first bad forward
    assert torch.isfinite(stats.loss).all()  # the skipped steps' losses are not in the running mean


@pytest.mark.parametrize(("nan_at", "diverging"), [({0, 2, 4, 6, 7}, True), ({1, 3, 5, 7}, False)])
def test_an_epoch_that_skipped_most_of_its_steps_stops_the_run_at_its_end(nan_at, diverging):
    """5 of 8 steps skipped, never 3 in a row: the epoch was not training, the run stops as diverged at its end;
    4 of 8 (half: the positive control) goes on."""
    from tests.workers.control_scenarios import _Batches, _step
    from tests.workers.engine_scenarios import small_model

    torch.manual_seed(0)
    step = _step(small_model())
    with StepControl(nonfinite_limit=3) as control:
        stats = train_one_epoch(step, _Batches(8, nan_at=nan_at), 0, torch.device("cpu"), control=control)
        stop = control.epoch_end(step)
    assert not stats.stopped and stats.batch == 8 and control.in_a_row < 3  # the in-a-row rule never fired
    assert (control.epoch_steps, control.epoch_skipped, control.epoch_overflows) == (8, len(nan_at), 0)
    assert stop is control.diverging is diverging and control.reason == ("diverged" if diverging else None)
