"""Faults a long run meets, met by real train.py processes on the CPU: a stop signal at an epoch's last step or
during its validation (the trained epoch is saved first; the resumed run ends bit-identical), steps that stay
non-finite (one line, exit 3, last.pt of the last finite state), and end-of-epoch checkpoints that say how many
processes saved them."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from ddp_utils.run import TrainState, load_checkpoint
from tests.multiproc import describe, run_watching
from tests.test_train import _worker_pids, results, run, torchrun, train_env
from tests.test_train_resume import assert_bit_identical, progress_env, small_run_data

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

VAL_LINE = re.compile(r"^val 1/\d+ ")  # the first plain progress line of a validation
LAST_STEP = re.compile(r"^1/2 .* 8/8 100%")  # epoch 1's last training step, in plain progress lines


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """64 training images (8 steps of 8) and 48 held out: validation takes 3 batches of 16, so it can be cut."""
    files = small_run_data(tmp_path_factory.mktemp("faults"), n_val=48)
    hyp = yaml.safe_load(files["hyp"].read_text())
    (files["hyp"].parent / "hyp_diverging.yaml").write_text(yaml.safe_dump({**hyp, "lr0": 1.0e6}))
    # one image per optimizer step: an epoch of 64 steps, long enough for 25 skipped in a row
    (files["hyp"].parent / "hyp_diverging_long.yaml").write_text(yaml.safe_dump({**hyp, "lr0": 1.0e6, "nbs": 1}))
    diverging = {name: files["hyp"].parent / f"hyp_{name}.yaml" for name in ("diverging", "diverging_long")}
    return {**files, **diverging}


def args(data: dict[str, Path], project: Path, name: str, *extra: str, hyp: str = "hyp") -> list[str]:
    return [
        "train.py", "--data", str(data["data"]), "--hyp", str(data[hyp]), "--cfg", "yolov5n.yaml", "--imgsz", "128",
        "--batch-size", "8", "--device", "cpu", "--workers", "0", "--project", str(project), "--name", name, *extra,
    ]  # fmt: skip


def signal_on(pattern: re.Pattern, sig: int = signal.SIGTERM):
    """An ``on_line`` that sends ``sig`` once, at the first line ``pattern`` matches."""
    sent: list[str] = []

    def on_line(line: str, proc: subprocess.Popen) -> None:
        if not sent and pattern.match(line):
            sent.append(line)
            proc.send_signal(sig)

    return on_line


@pytest.mark.parametrize("when", [VAL_LINE, LAST_STEP], ids=["during validation", "in the last step"])
def test_a_stop_at_an_epochs_end_saves_the_trained_epoch_before_validating_and_resumes_bit_identical(
    data, tmp_path, when
):
    full = run([sys.executable, *args(data, tmp_path, "full", "--epochs", "2")], train_env(), 300)
    assert full.returncode == 0, describe([full])
    last = tmp_path / "cut" / "weights" / "last.pt"
    stopped = run_watching([sys.executable, *args(data, tmp_path, "cut", "--epochs", "2")], progress_env(), 300,
                           signal_on(when))  # fmt: skip
    assert stopped.returncode == 0, describe([stopped])
    state = TrainState.from_checkpoint(load_checkpoint(last))
    assert (state.epoch, state.batch, state.batches) == (0, 8, 8), state  # trained, not validated
    saved = re.search(rf"stopped at epoch 1, batch 8/8: saved {re.escape(str(last))} in [\d.]+ s", stopped.stderr)
    assert saved, describe([stopped])
    assert "epoch 1/2:" not in stopped.stderr  # no validation finished before the save
    assert not (tmp_path / "cut" / "results.csv").exists() or results(tmp_path / "cut") == []
    resumed = run([sys.executable, "train.py", "--resume", str(last)], train_env(), 300)
    assert resumed.returncode == 0, describe([resumed])
    assert "resuming" in resumed.stderr and "at epoch 1, batch 8/8" in resumed.stderr, describe([resumed])
    assert [r["epoch"] for r in results(tmp_path / "cut")] == [0.0, 1.0]  # each epoch once
    assert_bit_identical(tmp_path / "full", tmp_path / "cut")


def test_steps_that_stay_non_finite_stop_the_run_in_one_line_with_the_last_finite_state(data, tmp_path):
    """lr0 1e6 in fp32: before the guard, 582 of last.pt's 586 floating tensors ended non-finite, without a word.
    Epochs of 64 optimizer steps (batch 1): 25 skipped in a row stop the run inside its first epoch."""
    cmd = [sys.executable, *args(data, tmp_path, "nan", "--epochs", "30", "--batch-size", "1", hyp="diverging_long")]
    result = run(cmd, train_env(), 500)
    assert result.returncode == 3, describe([result])
    assert "Traceback" not in result.stderr, describe([result])
    lines = [line for line in result.stderr.splitlines() if "training diverged at epoch" in line]
    assert len(lines) == 1 and "25 optimizer steps in a row had non-finite gradients" in lines[0], describe([result])
    assert "training diverged at epoch 1, batch " in lines[0], lines[0]  # inside the epoch, not at its end
    assert "the last finite state" in lines[0] and "lower the learning rate" in lines[0]
    ckpt = load_checkpoint(tmp_path / "nan" / "weights" / "last.pt")
    tensors = [t for key in ("model", "train_model") for t in ckpt[key].values() if t.is_floating_point()]
    tensors += [t for s in ckpt["optimizer"]["state"].values() for t in s.values() if torch.is_tensor(t)]
    assert tensors and all(bool(torch.isfinite(t).all()) for t in tensors)
    assert TrainState.from_checkpoint(ckpt).skipped >= 25


def test_an_epoch_that_skips_most_of_its_steps_ends_the_run_as_diverged_with_no_garbage_best(data, tmp_path):
    """Issue 41: lr0 1e6, --amp off, epochs of 4 optimizer steps. Before, 9 of 12 steps were skipped, the rest left
    garbage weights (val losses nan), and the run ended "3 epochs done; ... final mAP@0.5 0.000", exit 0, with a
    best.pt of them. Now: epoch 1 skips 2 of 4 (recorded; mAP 0 after skips is no best), epoch 2 skips 4 of 4:
    the run stops there, unvalidated, in one line that says so and what to do, exit 3."""
    extra = ("--epochs", "3", "--batch-size", "16", "--amp", "off", "--noplots")
    result = run([sys.executable, *args(data, tmp_path, "div", *extra, hyp="diverging")], train_env(), 500)
    assert result.returncode == 3, describe([result])
    assert "Traceback" not in result.stderr and "epochs done" not in result.stderr, describe([result])
    final = result.stderr.strip().splitlines()[-1]
    assert final.startswith("train.py: diverged: training diverged at epoch 2, batch 4/4: "), describe([result])
    assert "4 of the epoch's 4 optimizer steps were skipped" in final and "it is not training" in final, final
    assert "lower the learning rate (hyp lr0)" in final and "--amp off (now" not in final, final  # it is off
    rows = results(tmp_path / "div")
    assert [(r["epoch"], r["train/skipped_steps"]) for r in rows] == [(0.0, 2.0)], rows  # epoch 2: not validated
    assert "epoch 1/3: " in result.stderr and "2 optimizer step(s) skipped" in result.stderr
    weights = tmp_path / "div" / "weights"
    assert not (weights / "best.pt").exists(), "a diverging epoch's state was kept as the best"
    state = TrainState.from_checkpoint(load_checkpoint(weights / "last.pt"))
    assert (state.epoch, state.batch, state.skipped) == (1, 4, 6), state  # where it stopped, to the batch


@pytest.mark.multiprocess
def test_an_end_of_epoch_checkpoint_records_the_processes_that_saved_it(data, tmp_path):
    cmd = torchrun(2, *args(data, tmp_path, "ddp", "--epochs", "1"))
    result = run(cmd, train_env(), 400)
    assert result.returncode == 0, describe([result])
    state = TrainState.from_checkpoint(load_checkpoint(tmp_path / "ddp" / "weights" / "last.pt"))
    assert (state.epoch, state.batch, state.world_size) == (1, 0, 2), state


@pytest.mark.multiprocess
def test_a_rank_stopped_with_sigstop_is_named_and_the_restarted_job_finishes_every_epoch_once(data, tmp_path):
    """The stall watchdog under a real torchrun job (bound shortened to 15 s; benchmarks/faults/faults.py measures the
    default): every live rank ends with exit 75 naming rank 1, torchrun kills the stopped one and restarts, and the
    job resumes from its last save and finishes."""
    cmd = torchrun(2, *args(data, tmp_path, "stall", "--epochs", "3"), extra=("--max-restarts", "1"))
    stopped: dict[str, float] = {}

    def freeze_rank_1(line: str, proc: subprocess.Popen) -> None:
        # epoch 2's training done (its progress line): epoch 1's save is behind, so the restart has one to resume
        if not stopped and line.startswith("2/3 "):
            pid = _worker_pids(proc.pid)[1]
            os.kill(pid, signal.SIGSTOP)
            stopped.update(pid=pid, at=time.monotonic())

    try:
        result = run_watching(cmd, train_env() | {"DDP_UTILS_STALL_TIMEOUT": "15"}, 500, freeze_rank_1)
    finally:
        if stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(stopped["pid"]), signal.SIGKILL)
    finished = time.monotonic()
    assert stopped and result.returncode == 0, describe([result])
    assert re.search(r"rank 1 stalled: no progress for \d+ s", result.stderr), describe([result])
    assert "main thread is at" not in result.stderr, describe([result])  # one clear message: rank 0 only waited
    assert "resuming" in result.stderr, describe([result])
    assert [r["epoch"] for r in results(tmp_path / "stall")] == [0.0, 1.0, 2.0]  # every epoch once
    assert finished - stopped["at"] < 300, finished - stopped["at"]
