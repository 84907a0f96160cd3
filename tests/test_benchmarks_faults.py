"""benchmarks/faults/faults.py runs, and its rows say what they should: a SIGTERM costs nothing and the job ends as the
uninterrupted one; a NaN loss is one skipped step and the job still finishes every epoch once; a fault whose moment
never comes is reported as not injected, and the table is printed whatever one row does."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddp_utils.run import TrainState
from ddp_utils.run.checkpoint import save_checkpoint

REPO = Path(__file__).resolve().parents[1]
FAULTS = REPO / "benchmarks" / "faults" / "faults.py"


def faults_module():
    spec = importlib.util.spec_from_file_location("faults_benchmark", FAULTS)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_fault_that_fails_or_never_comes_is_a_row_and_the_others_still_run(tmp_path):
    faults = faults_module()

    def inject(name: str) -> dict:
        if name == "truncated":
            raise RuntimeError("DamagedCheckpointError from weights_against")
        if name == "sigstop":
            return faults.not_injected(name, "the job finished before epoch 2, batch 3")
        return {"fault": name, "detected_s": 0.1, "steps_lost": 0, "finished": True, "weights": "equal", "line": "x"}

    records = faults.run_faults(["truncated", "sigstop", "sigterm"], inject, tmp_path / "faults.json")
    assert [r["fault"] for r in records] == ["truncated", "sigstop", "sigterm"]
    assert records[0]["failed"] == "RuntimeError: DamagedCheckpointError from weights_against"
    assert json.loads((tmp_path / "faults.json").read_text()) == records
    rows = faults.table(records).splitlines()[2:]
    assert rows == [
        "| truncated | failed: RuntimeError: DamagedCheckpointError from weights_against | | | | |",
        "| sigstop | not injected: the job finished before epoch 2, batch 3 | | | | |",
        "| sigterm | 0.1 | 0 | yes | equal | `x` |",
    ]


def test_the_truncation_trigger_follows_the_saves_on_disk_not_the_log(tmp_path):
    faults = faults_module()
    last, acted = tmp_path / "last.pt", []
    trigger = faults.SavedOnDisk(lambda proc: acted.append(proc), last)

    def save(epoch: int, batch: int) -> None:  # a checkpoint as the run writes it: epoch at the top = last one done
        state = TrainState(epoch=epoch, batch=batch, batches=8, batch_size=8, world_size=2)
        save_checkpoint({"epoch": epoch - 1, "train_state": state.as_dict(), "model": torch.zeros(1)}, last)

    trigger("1/3 ... 2/8 25%", None)  # no file yet
    for epoch, batch in ((0, 5), (1, 0)):  # epoch 1's periodic save, then epoch 1 done: not yet
        save(epoch, batch)
        trigger("a line whatever its words", None)
    assert acted == [] and trigger.at is None
    save(1, 3)  # epoch 2, batch 3: any mid-epoch save of epoch 2, whatever batch it fell on
    trigger("2/3 ... 4/8 50%", "job")
    assert acted == ["job"] and trigger.saved == "epoch 2, batch 3/8" and trigger.reached == (2, 4)
    save(1, 6)
    trigger("2/3 ... 7/8 87%", "job")
    assert acted == ["job"]  # once


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_the_fault_benchmark_runs_and_its_rows_hold(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, str(FAULTS), "--faults", "sigterm", "nan", "--epochs", "2",
               "--dir", str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=880)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sigterm, nan = json.loads((tmp_path / "faults.json").read_text())
    assert sigterm["finished"] and sigterm["steps_lost"] == 0 and sigterm["weights"] == "equal", sigterm
    assert "received SIGTERM" in sigterm["line"]
    assert nan["finished"] and nan["weights"] != "equal" and "1 optimizer step(s) skipped" in nan["line"], nan
    assert "| sigterm | " in done.stdout and "| nan | " in done.stdout
    assert sorted(p.name for p in (tmp_path / "logs").iterdir())[:2] == ["job00.log", "job01.log"]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_a_truncation_whose_moment_never_comes_is_reported_not_injected_and_the_table_printed(tmp_path):
    # one epoch: there is no epoch 2 to save in; the job finishes, and its final last.pt must not be cut and read
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, str(FAULTS), "--faults", "truncated", "--epochs", "1",
               "--dir", str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=580)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (truncated,) = json.loads((tmp_path / "faults.json").read_text())
    assert truncated == {
        "fault": "truncated",
        "not_injected": "no save from the middle of epoch 2 or later reached the disk before the job ended",
    }, truncated
    assert "| truncated | not injected: " in done.stdout and "Traceback" not in done.stderr, done.stderr[-3000:]
