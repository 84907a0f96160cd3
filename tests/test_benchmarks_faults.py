"""benchmarks/faults/faults.py runs, and its rows say what they should: a SIGTERM costs nothing and the job ends as the
uninterrupted one; a NaN loss is one skipped step and the job still finishes every epoch once; a full disk at the
last epoch exits 74 naming the checkpoint on disk; a full disk in epoch 1 is one warning and the job ends as the
uninterrupted one; the faults tied to saves come at the same save on any host; a
fault whose moment never comes is reported as not injected, the table is printed whatever one row does, and the
benchmark then fails its own check."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddp_utils.run import CheckpointWriteError, TrainState, load_checkpoint
from ddp_utils.run.checkpoint import disk as checkpoint_files

REPO = Path(__file__).resolve().parents[1]
FAULTS = REPO / "benchmarks" / "faults" / "faults.py"
INJECT = REPO / "benchmarks" / "faults" / "fault_inject.py"


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


def inject_module():
    spec = importlib.util.spec_from_file_location("fault_inject", INJECT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_save_faults_follow_rank_0s_saves_not_the_hosts_speed(tmp_path):
    # enospc and truncated waited for a mid-epoch save of epoch 2 to show on disk, read at each log line: on a fast
    # host none came before the job ended ("not injected"); the injector now counts the saves inside the job
    inject, events = inject_module(), []
    hook = inject.SaveHook(
        before=2,
        after=2,
        first=lambda at: events.append(("before", at, (tmp_path / "last.pt").exists())),
        then=lambda at: events.append(("after", at)),
        before_final=lambda at: events.append(("before the final save", at)),
        on_failure=lambda exc: events.append(("failed", type(exc).__name__)),
    ).install()
    try:

        def save(epoch: int, batch: int, path=tmp_path / "last.pt") -> None:  # as Checkpointer writes, 3 epochs
            state = TrainState(epoch=epoch, batch=batch, batches=8).as_dict()
            ckpt = {"epoch": epoch - 1, "opt": {"epochs": 3}, "train_state": state, "model": torch.zeros(1)}
            checkpoint_files.write_serialised(ckpt, [path])  # what the background writer calls

        save(0, 3)  # epoch 1's periodic save: not counted (epoch 1 still draws its first batches)
        save(1, 0)  # epoch 1 done: the first counted
        assert events == []
        save(1, 5)  # epoch 2's periodic save: the second
        assert events == [("before", "epoch 2, batch 5/8", True), ("after", "epoch 2, batch 5/8")]
        blocked = tmp_path / "a file"
        blocked.write_text("")
        with pytest.raises(CheckpointWriteError):
            save(2, 0, path=blocked / "last.pt")  # a write that fails (its directory is a file)
        save(3, 0)  # epoch 3 done: the final one, never counted
        assert events[2:] == [("failed", "CheckpointWriteError"), ("before the final save", "the end of epoch 3")]
        assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 2  # the saves themselves are the real ones
    finally:
        checkpoint_files.write_serialised = hook.original


def test_the_workers_exit_is_the_root_causes_whatever_torchrun_lists_above_it():
    # torchrun's ChildFailedError report: the ranks it stopped after the first failure under "Failures:", then the
    # root cause; a rank that had already ended is not listed ("<NO_OTHER_FAILURES>")
    faults = faults_module()

    def report(others: list[str]) -> list[str]:
        return ["train.py FAILED", "Failures:", *others, "Root Cause (first observed failure):", "[0]:",
                "  rank      : 0 (local_rank: 0)", "  exitcode  : 74 (pid: 12)", "  error_file: <N/A>"]  # fmt: skip

    stopped = ["[1]:", "  rank      : 1 (local_rank: 1)", "  exitcode  : -15 (pid: 13)"]
    assert faults.root_cause_exit(report(stopped)) == 74
    assert faults.root_cause_exit(report(["  <NO_OTHER_FAILURES>"])) == 74
    assert faults.root_cause_exit(["no report: every rank ended 0"]) is None


def test_an_incomplete_table_fails_the_benchmarks_own_check():
    faults = faults_module()
    assert faults.not_whole([{"fault": "nan", "finished": True}]) == ""
    rows = [{"fault": "enospc", "skipped": "cannot mount a tmpfs here (needs root)"}, {"fault": "sigkill"}]
    assert faults.not_whole(rows) == "enospc skipped (cannot mount a tmpfs here (needs root))"


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
def test_a_truncation_whose_moment_never_comes_is_reported_not_injected_and_fails_the_benchmark(tmp_path):
    # one epoch: no save from epoch 2 on, after which there is nothing to kill; the job finishes, its final last.pt
    # is not cut, and the benchmark exits 1: its table is not whole
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, str(FAULTS), "--faults", "truncated", "--epochs", "1", "--save-interval", "0",
               "--dir", str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=580)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    (truncated,) = json.loads((tmp_path / "faults.json").read_text())
    why = "rank 0 never had a second save from epoch 2 on that is not its last: the job ended first"
    assert truncated == {"fault": "truncated", "not_injected": why}, truncated
    assert "| truncated | not injected: " in done.stdout and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().endswith(f"the table is not whole: truncated not injected ({why})"), done.stderr


def full_disk_row(fault: str, tmp_path: Path) -> dict:
    """The fault table's row for ``fault`` (a full disk), 2 epochs, run in ``tmp_path`` (root: it mounts a tmpfs)."""
    if os.geteuid() != 0:
        pytest.skip("the row mounts a tmpfs to fill up: needs root")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, str(FAULTS), "--faults", fault, "--epochs", "2", "--dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=880)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (row,) = json.loads((tmp_path / "faults.json").read_text())
    return row


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_a_full_disk_at_the_last_epoch_exits_74_naming_the_checkpoint_on_disk_and_the_resume_finishes(tmp_path):
    row = full_disk_row("enospc-final", tmp_path)
    assert row["injected"].startswith("fault_inject: filled the disk") and "before the final save" in row["injected"]
    assert row["worker_exit"] == 74 and row["first_exit"] != 0, row
    last = tmp_path / "runs" / "tmpfs-enospc-final" / "enospc-final" / "weights" / "last.pt"
    assert row["last_line"].startswith(f"training ended after epoch 2 but could not save {last} "), row
    assert f"python train.py --resume {last} continues from " in row["last_line"], row
    assert row["finished"] and row["weights"] == "equal", row  # freed, resumed as the line said: the same weights


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_a_full_disk_in_epoch_1_is_one_warning_and_the_job_ends_as_the_uninterrupted_one(tmp_path):
    # the disk full from rank 0's first step, before any save, while train_batch0-2.jpg are drawn: a plot ended the
    # run with a traceback; the plots and rows are optional, and the disk is freed once the first save after it failed
    row = full_disk_row("enospc-epoch-1", tmp_path)
    assert row["injected"].startswith("fault_inject: filled the disk") and row["injected"].endswith("training step 0")
    assert row["line"].startswith("could not write "), row  # the line as the table cuts it: the job's log has it whole
    log = (tmp_path / "logs" / "job01.log").read_text()  # job00: the uninterrupted one
    warned = [line for line in log.splitlines() if "it is optional, so the run goes on" in line]
    assert len(warned) == 1 and "train_batch0.jpg: No space left on device; " in warned[0], warned
    assert row["optional_warnings"] == 1 and row["saves_failed"] == 1, row  # once, however many writes it refused
    assert "train_batch0.jpg" in row["plots_missing"], row
    assert row["exit"] == 0 and row["finished"] and row["steps_lost"] == 0 and row["weights"] == "equal", row
